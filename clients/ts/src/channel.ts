/** Merging entries into whole channel states (PROTOCOL.md section 3). Pure functions. */
import { Mask, type Entry, type Metadata, type Value } from "./protocol.js";

export const SEVERITIES = ["NO_ALARM", "MINOR", "MAJOR", "INVALID"] as const;
export type Severity = (typeof SEVERITIES)[number];
/**
 * Wire `state` numbers by index (PROTOCOL.md section 3). NOT_FOUND: no server answered for the
 * server's configured time; the server keeps searching and moves to CONNECTED if one appears.
 */
export const CONNECTION_STATES = ["CONNECTING", "CONNECTED", "DISCONNECTED", "FAILED", "NOT_FOUND"] as const;
export type ChannelConnection = (typeof CONNECTION_STATES)[number];
export type ChangedField = "value" | "time" | "alarm" | "metadata" | "connection";
/** What the server grants this client's identity on a channel (from `subscribe`). */
export type Access = "READ" | "WRITE";

export interface Timestamp {
  /** POSIX seconds (IOC timestamp). */
  readonly seconds: number;
  readonly nanoseconds: number;
}

export interface AlarmState {
  readonly severity: Severity;
  /** EPICS alarm status number (menuAlarmStat). */
  readonly status: number;
  readonly message: string;
}

/** Everything known about one channel of a subscription; a new object after every update. */
export interface ChannelState {
  /** Canonical channel id (with scheme), as the server named it in ATTACHED. */
  readonly id: string;
  /** Index of the channel in the subscription's ids. */
  readonly sid: number;
  /** undefined: not known yet; null: the channel has no value yet. */
  readonly value: Value | undefined;
  readonly serial: number | undefined;
  /** Updates merged away before the last one (serial gap); 0 when none. */
  readonly conflated: number;
  /** Sum of `conflated` since the subscription started (reset when the upstream monitor reopens). */
  readonly conflatedTotal: number;
  readonly time: Timestamp | undefined;
  /**
   * undefined: the server has not reported an alarm state for this channel yet. It is not an
   * alarm: show it as "not known", never as a severity.
   */
  readonly alarm: AlarmState | undefined;
  readonly metadata: Metadata;
  readonly connection: ChannelConnection;
  readonly reason: string;
  /** READ or WRITE for this client's identity; undefined when the server did not say. */
  readonly access: Access | undefined;
  /** Whether a put from this client can succeed now: see {@link isWritable}. */
  readonly writable: boolean;
}

/**
 * May this identity write the channel? On the stream `metadata.writable` is the upstream's answer
 * only, absent when it cannot tell (PVA): granted WRITE and not refused upstream. Without an
 * access (a token obtained elsewhere) only an explicit `writable: true` counts.
 */
export function isWritable(access: Access | undefined, metadata: Metadata): boolean {
  return access === undefined ? metadata.writable === true : access === "WRITE" && metadata.writable !== false;
}

export function initialState(id: string, sid: number, access?: Access): ChannelState {
  return {
    id, sid, value: undefined, serial: undefined, conflated: 0, conflatedTotal: 0,
    time: undefined, alarm: undefined, metadata: {}, connection: "CONNECTING", reason: "",
    access, writable: isWritable(access, {}),
  };
}

/** The state with a new access (a re-registration may grant less or more); same object if equal. */
export function withAccess(s: ChannelState, access: Access | undefined): ChannelState {
  return s.access === access ? s : { ...s, access, writable: isWritable(access, s.metadata) };
}

/**
 * Apply one entry. Snapshot and delta entries merge the same way: every field the entry
 * carries is set, every field it lacks keeps what the client had. A snapshot therefore cannot
 * make a known alarm (or time, metadata...) unknown again, e.g. on a re-attach after a reconnect;
 * the Python client applies entries the same way. Returns the new state and the fields carried.
 *
 * A snapshot's serial (`baseline`) is a new baseline (PROTOCOL.md section 2.5): after a
 * reconnect, maybe to another replica whose upstream monitor counts from elsewhere, a jump is no
 * conflation.
 */
export function applyEntry(prev: ChannelState, e: Entry, baseline = false): [ChannelState, ChangedField[]] {
  const next: { -readonly [K in keyof ChannelState]: ChannelState[K] } = { ...prev };
  const changed: ChangedField[] = [];
  if (e.mask & Mask.VALUE) {
    const serial = e.serial!;
    const last = baseline ? undefined : prev.serial;
    // Serial lower than before: the upstream monitor reopened (or the server restarted): reset.
    // The same serial again is a re-attach's snapshot repeating the last update: no gap, no reset.
    const reopened = last !== undefined && serial < last;
    const gap = last !== undefined && serial > last ? serial - last - 1 : 0;
    next.value = e.value;
    next.serial = serial;
    next.conflated = gap;
    next.conflatedTotal = reopened ? 0 : prev.conflatedTotal + gap;
    changed.push("value");
  }
  if (e.mask & Mask.TIME) {
    next.time = { seconds: e.seconds!, nanoseconds: e.nanoseconds! };
    changed.push("time");
  }
  if (e.mask & Mask.ALARM) {
    next.alarm = { severity: SEVERITIES[e.severity!]!, status: e.status!, message: e.message! };
    changed.push("alarm");
  }
  if (e.mask & Mask.META) {
    next.metadata = e.metadata!;
    next.writable = isWritable(next.access, next.metadata);
    changed.push("metadata");
  }
  if (e.mask & Mask.CONN) {
    // An unknown state number shows as DISCONNECTED (PROTOCOL.md section 3).
    next.connection = CONNECTION_STATES[e.state!] ?? "DISCONNECTED";
    next.reason = e.reason!;
    changed.push("connection");
  }
  return [next, changed];
}

/**
 * The state once the link to the server is lost, or undefined when there is nothing new to say
 * (not connected: still connecting, already DISCONNECTED, FAILED or NOT_FOUND). The channel keeps
 * its last value, time, alarm and metadata and shows DISCONNECTED with `reason` (PROTOCOL.md
 * sections 3 and 8): the value is stale, not live. The Python client marks its channels the same
 * way; the snapshot after the re-attach restores the true state.
 */
export function linkLost(s: ChannelState, reason: string): ChannelState | undefined {
  if (s.connection !== "CONNECTED") return undefined;
  return applyEntry(s, { sid: s.sid, mask: Mask.CONN, state: CONNECTION_STATES.indexOf("DISCONNECTED"), reason })[0];
}

/** The timestamp as a Date (millisecond resolution). */
export function toDate(t: Timestamp): Date {
  return new Date(t.seconds * 1000 + Math.floor(t.nanoseconds / 1e6));
}
