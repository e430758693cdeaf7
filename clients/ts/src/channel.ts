/** Merging entries into whole channel states (PROTOCOL.md section 3). Pure functions. */
import { NdArray } from "./ndarray.js";
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
  /**
   * Upstream updates merged away (never seen by this client) since the subscription started,
   * from the serials; 0 again when the upstream monitor reopens (PROTOCOL.md, "Client
   * behaviour"). A count since the start, not per entry, so a reader that looks at the state when
   * it likes (a display refreshing at its own rate) still learns how many it lost in between: the
   * difference of two looks. The Python client's `conflated` is the same count.
   */
  readonly conflated: number;
  /** @deprecated The same as `conflated`, which counts since the subscription started too. */
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
 * make a known alarm (or time, metadata...) unknown again, e.g. on a re-attach after a reconnect.
 * Returns the new state and the fields that changed (PROTOCOL.md, "Client behaviour"): changed,
 * not carried, so a snapshot repeating what the client knew names nothing. A value changes with
 * every new serial (each upstream update is news, even of an equal value), and an array with every
 * entry (arrays are not compared). The Python client's `ChannelState.merge` is the same function.
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
    if (last !== undefined) {
      // Serial lower than before: the upstream monitor reopened (or the server restarted): the
      // count restarts. The same serial again is a repeat of the last update: no gap, no reset.
      if (serial > last) next.conflated = prev.conflated + serial - last - 1;
      else if (serial < last) next.conflated = 0;
      next.conflatedTotal = next.conflated;
    }
    if (serial !== prev.serial || !sameValue(e.value, prev.value)) changed.push("value");
    next.value = e.value;
    next.serial = serial;
  }
  if (e.mask & Mask.TIME) {
    const t = prev.time;
    if (t === undefined || t.seconds !== e.seconds || t.nanoseconds !== e.nanoseconds) {
      next.time = { seconds: e.seconds!, nanoseconds: e.nanoseconds! };
      changed.push("time");
    }
  }
  if (e.mask & Mask.ALARM) {
    const a = prev.alarm;
    const severity = SEVERITIES[e.severity!]!;
    if (a === undefined || a.severity !== severity || a.status !== e.status || a.message !== e.message) {
      next.alarm = { severity, status: e.status!, message: e.message! };
      changed.push("alarm");
    }
  }
  if (e.mask & Mask.META) {
    if (!sameData(e.metadata, prev.metadata)) {
      next.metadata = e.metadata!;
      next.writable = isWritable(next.access, next.metadata);
      changed.push("metadata");
    }
  }
  if (e.mask & Mask.CONN) {
    // An unknown state number shows as DISCONNECTED (PROTOCOL.md section 3).
    const connection = CONNECTION_STATES[e.state!] ?? "DISCONNECTED";
    if (connection !== prev.connection || e.reason !== prev.reason) {
      next.connection = connection;
      next.reason = e.reason!;
      changed.push("connection");
    }
  }
  return [next, changed];
}

/** Equal values: scalars and strings by value, lists and structures element by element; arrays
 * (NdArray) only when the same object, as a new entry always brings a new one. */
function sameValue(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (isArray(a) || isArray(b)) return false;
  if (typeof a === "number" && typeof b === "number") return false; // NaN is news, as in Python
  return sameData(a, b, false);
}

/** An ndarray value (a TypedArray, or an NdArray for other shapes). */
function isArray(x: unknown): boolean {
  return x instanceof NdArray || ArrayBuffer.isView(x);
}

/** Deep equality of decoded MessagePack data; NaN equals NaN when `nanEqual` (metadata: an unset
 * limit side is NaN, and a snapshot repeating the same limits is no change). */
function sameData(a: unknown, b: unknown, nanEqual = true): boolean {
  if (a === b) return true;
  if (typeof a === "number" && typeof b === "number") return nanEqual && Number.isNaN(a) && Number.isNaN(b);
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (isArray(a) || isArray(b)) return false;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((x, i) => sameData(x, b[i], nanEqual));
  }
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && sameData((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k], nanEqual));
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
