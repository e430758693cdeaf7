/**
 * The stream's protocol state, without I/O: events in, events and bytes out (PROTOCOL.md).
 *
 * One Session lives as long as the PvwireClient's stream, across its connections. The pump around
 * it (client.ts) owns the socket, the timers and the retries:
 * - it reports what happened: `connectionMade`, `receive` (one WebSocket message),
 *   `connectionLost` (the close code received, else sent), `connectFailed`, `timer` (the
 *   `deadline()` passed);
 * - it passes the application's commands: `add` (a subscription's token), `setToken` (a fresh
 *   one after a "renew" event), `remove`, `ping`;
 * - it carries out what the session asks: `dataToSend()` (messages, in order), `closeRequest`
 *   (close the socket with this code, then report it lost) and `nextEvent()`.
 *
 * Every input takes `now`, a monotonic time in ms: the session reads no clock. Entries are routed,
 * not merged: merging them into channel states is `applyEntry` (channel.ts), as pure. The
 * scripted exchanges of protocol/cases/ drive both (test/cases.test.ts), as they drive the Python
 * client's session (clients/py/pvwire_client/session.py), which behaves the same way.
 *
 * Each subscription moves through the states of subscription.ts by its one transition table
 * (REGISTERING, WAITING, ATTACHING, ATTACHED, ABANDONED, CLOSED), as the Python client's do.
 */
import { closeClass, closeName, CloseCode, ErrorCode } from "./closeCodes.js";
import { ProtocolError } from "./errors.js";
import { Held } from "./held.js";
import { rowsBetween } from "./history.js";
import { decodeServerMessage, encodeClientMessage, PROTOCOL_VERSION, type ClientMessage, type Entry, type History, type ServerMessage } from "./protocol.js";
import { move, newSubscription, type Subscription, type SubscriptionEvent, type SubscriptionState } from "./subscription.js";

export type Hello = Extract<ServerMessage, { kind: "HELLO" }>;
type ErrorMessage = Extract<ServerMessage, { kind: "ERROR" }>;

/**
 * How a subscription ended: `refused` (ERROR answering its ATTACH, `code` the ERROR's), `ended`
 * (the server's DETACHED; `code` the ERROR that came just before, else null), `closed` (a terminal
 * close code, or a HELLO of another version: 4406), `mismatch` (ATTACHED named channels other than
 * the token's).
 */
export type FailureKind = "refused" | "ended" | "closed" | "mismatch";

export type SessionEvent<K> =
  /** HELLO arrived: the server answered (a reconnect's backoff starts again from 0). */
  | { type: "connected"; hello: Hello }
  /** The server attached `key`'s token with these channel ids (sid = index). */
  | { type: "attached"; key: K; ids: readonly string[] }
  /** Entries for `key`'s channels (sids in range); `snapshot`: serials are a new baseline. */
  | { type: "entries"; key: K; entries: readonly Entry[]; snapshot: boolean }
  /**
   * Recorded past of one of `key`'s channels (`history.sid`, in range), after ATTACHED and before
   * that attachment's SNAPSHOT when the token asked for `backfill` (section 2.8). It changes no
   * channel state. Only the rows the client lacks are handed on (a run of them per event, in
   * order; held.ts): a re-attach says per channel after which time it lacks rows (the ATTACH's
   * `since`), and of what comes again (a server that does not know `since`, a bucket that
   * straddles it) the rows it has are dropped.
   */
  | { type: "history"; key: K; history: History }
  /** The connection is gone, a reconnect follows: CONNECTED channels show DISCONNECTED. */
  | { type: "lost"; reason: string }
  /** `key`'s subscription ended for good; the others go on (unless they fail too). */
  | { type: "failed"; key: K; kind: FailureKind; code: number | null; message: string }
  /** `key`'s token is expired or was refused once: register again, then `setToken`. */
  | { type: "renew"; key: K }
  /** The PONG for `nonce` after `rttMs`, or null with `error` when the connection closed first. */
  | { type: "pong"; nonce: number | string; rttMs: number | null; error?: string }
  /** An ERROR that concerns no subscription: report it; nothing ends. */
  | { type: "serverError"; code: number; message: string }
  /** A message broke the protocol (section 1): the session closes with 1002 and reconnects. */
  | { type: "malformed"; message: string }
  /**
   * The connection ended; `reconnect`: retry with backoff while subscriptions remain.
   * `withinMs`: the server is draining (4012 after its HELLO): reconnect at once, after a delay
   * drawn from 0 to `withinMs`, without backoff, the retries counted from 0 again.
   */
  | { type: "closed"; code: number; reason: string; reconnect: boolean; withinMs?: number };

/** Section 8: a 4012 DRAINING close's reason is `reconnect within N ms`; without it, 1 s. */
const DRAIN_REASON = /within (\d{1,9}) ms/;
export const DRAIN_WITHIN_DEFAULT_MS = 1_000;

/** Milliseconds a 4012 DRAINING close with `reason` asks to spread the reconnect over. */
export function drainWithinMs(reason: string): number {
  const found = DRAIN_REASON.exec(reason);
  return found ? Number(found[1]) : DRAIN_WITHIN_DEFAULT_MS;
}

export interface SessionOptions {
  /** A request unanswered this long means a dead connection (section 2.7). Default 30,000. */
  requestTimeoutMs?: number;
  /** Silence that means a dead connection; default 2 × heartbeat_ms + 1 s (section 2.1). */
  watchdogMs?: number;
  /** Reconnect after reconnect-class closes (default true); false: every close is terminal. */
  reconnect?: boolean;
  /** Called at every subscription transition with (key, state, event, next state): tests, logs. */
  onTransition?: (key: unknown, state: SubscriptionState, event: SubscriptionEvent, next: SubscriptionState) => void;
}

/** The default heartbeat (section 2.1), for the watchdog before HELLO says otherwise. */
const DEFAULT_HEARTBEAT_MS = 15_000;
/** ERROR codes of an ATTACH whose token was refused (section 7): register again, once. */
const NS = 1_000_000_000n;
const RENEW_CODES: readonly number[] = [ErrorCode.BAD_TOKEN, ErrorCode.TOKEN_EXPIRED];
/** ERROR codes that say why the server ends an attachment (section 2.3): the DETACHED that
 * follows reports them, as the subscription's failure. */
const DETACH_REASONS: readonly number[] = [ErrorCode.BAD_TOKEN, ErrorCode.TOKEN_EXPIRED, ErrorCode.FORBIDDEN];

/** A request sent on this connection and not answered yet; an ATTACH's sub is ATTACHING, or
 * ABANDONED when removed since. */
interface Request<K> { what: "attach" | "detach"; sub: Subscription<K> | undefined; at: number }

export class Session<K> {
  readonly requestTimeoutMs: number;
  private readonly watchdogOverride: number | undefined;
  private readonly reconnectAllowed: boolean;
  private readonly onTransition: SessionOptions["onTransition"];
  /** REGISTERING to ATTACHED. */
  private subs = new Map<K, Subscription<K>>();
  /** ATTACHED. */
  private byAtt = new Map<number, Subscription<K>>();
  private requests = new Map<number, Request<K>>();
  private pings = new Map<number | string, number>();
  private events: SessionEvent<K>[] = [];
  private out: Uint8Array[] = [];
  private nextReq = 1;
  private seq = 0;
  private open = false;
  hello: Hello | undefined;
  private lastRx = 0;
  private notice: ErrorMessage | undefined;
  closeRequest: { code: number; reason: string } | undefined;
  /** The close requested ends the session (a HELLO of another version). */
  private terminal = false;

  constructor(options: SessionOptions = {}) {
    this.requestTimeoutMs = options.requestTimeoutMs ?? 30_000;
    this.watchdogOverride = options.watchdogMs;
    this.reconnectAllowed = options.reconnect ?? true;
    this.onTransition = options.onTransition;
  }

  // ------------------------------------------------------------------ outputs

  nextEvent(): SessionEvent<K> | undefined { return this.events.shift(); }

  dataToSend(): Uint8Array[] {
    const out = this.out;
    this.out = [];
    return out;
  }

  /** When `timer` must be called if nothing arrives before: the watchdog, or the time-out of the
   * oldest request without an answer. */
  deadline(): number | undefined {
    if (!this.open || this.closeRequest !== undefined) return undefined;
    let at = this.lastRx + this.watchdog();
    for (const r of this.requests.values()) at = Math.min(at, r.at + this.requestTimeoutMs);
    for (const sent of this.pings.values()) at = Math.min(at, sent + this.requestTimeoutMs);
    return at;
  }

  /** A connection is open and its HELLO arrived: ATTACH goes out at once. */
  get ready(): boolean { return this.open && this.hello !== undefined && this.closeRequest === undefined; }

  has(key: K): boolean { return this.subs.has(key); }

  /** `key`'s state; undefined once it is removed or ended (CLOSED), or was never added. */
  state(key: K): SubscriptionState | undefined { return this.subs.get(key)?.state; }

  // ------------------------------------------------------------------ commands

  /** A subscription: attach `token` now if connected, else after the next HELLO. `backfill`: the
   * token asked for it; a re-attach then says which rows it holds (section 2.8). */
  add(key: K, token: string | undefined, ids: readonly string[] | undefined, o: { expiresAt?: number; renewable?: boolean; backfill?: boolean; now: number }): void {
    if (this.subs.has(key)) throw new Error("subscription already added");
    const sub = newSubscription(key, ids, { expiresAt: o.expiresAt, renewable: o.renewable ?? true, backfill: o.backfill ?? false });
    if (token !== undefined) this.move(sub, "token", { token });
    this.subs.set(key, sub);
    this.attach(sub, o.now);
  }

  /** A fresh token for `key` (after "renew"): attach it when connected. Only a subscription in
   * REGISTERING takes one (a TransitionError otherwise). */
  setToken(key: K, token: string, ids: readonly string[] | undefined, o: { expiresAt?: number; now: number }): void {
    const sub = this.subs.get(key);
    if (sub === undefined) return;
    this.move(sub, "token", { token });
    sub.expiresAt = o.expiresAt;
    if (ids !== undefined) {
      // Other channels: what it holds says nothing of them.
      if (sub.ids === undefined || !sameIds(ids, sub.ids)) sub.held = undefined;
      sub.ids = ids;
    }
    this.attach(sub, o.now);
  }

  /** End a subscription: DETACH it if attached (its entries are dropped from now on); one still
   * attaching is detached when its ATTACHED comes. */
  remove(key: K, now: number): void {
    const sub = this.subs.get(key);
    if (sub === undefined) return;
    const att = sub.att;
    this.move(sub, "remove");
    this.subs.delete(key);
    if (att !== undefined) {
      this.byAtt.delete(att);
      this.request("detach", undefined, (req) => ({ kind: "DETACH", req, att }), now);
    }
  }

  /** Send PING (section 2.6); false when not connected. A "pong" event follows. */
  ping(nonce: number | string, now: number): boolean {
    if (!this.ready || this.pings.has(nonce)) return false;
    this.pings.set(nonce, now);
    this.out.push(encodeClientMessage({ kind: "PING", nonce }));
    return true;
  }

  // ------------------------------------------------------------------ the connection

  /** A socket is open (or opening); HELLO is expected first. */
  connectionMade(now: number): void {
    this.open = true;
    this.hello = undefined;
    this.seq = 0;
    this.lastRx = now;
    this.closeRequest = undefined;
    this.terminal = false;
    this.notice = undefined;
  }

  /** One WebSocket message: an ArrayBuffer or bytes (anything else, text, is malformed). */
  receive(data: unknown, now: number): void {
    if (!this.open || this.closeRequest !== undefined) return; // after a close request nothing more is applied
    this.lastRx = now;
    try {
      let bytes: Uint8Array;
      if (data instanceof ArrayBuffer) bytes = new Uint8Array(data);
      else if (data instanceof Uint8Array) bytes = data;
      else throw new ProtocolError("invalid server message: text WebSocket message (pvwire sends binary only)");
      const msg = decodeServerMessage(bytes);
      if (msg !== null) this.dispatch(msg, now);
    } catch (err) {
      // Section 1: this connection's state may be wrong; close with 1002 and reconnect: the
      // snapshots restore the state. Whatever the decoder threw (a RangeError from a DataView
      // too), the message is what was wrong, not the client.
      const message = err instanceof ProtocolError ? err.message : `invalid server message: ${String(err)}`;
      this.events.push({ type: "malformed", message });
      this.close(CloseCode.PROTOCOL_ERROR, message);
    }
  }

  /** The deadline passed: a silent server or an unanswered request means a dead connection
   * (sections 2.1, 2.7): close with 4000 and reconnect. */
  timer(now: number): void {
    if (!this.open || this.closeRequest !== undefined) return;
    for (const [req, r] of this.requests) {
      if (now - r.at >= this.requestTimeoutMs) return this.close(CloseCode.HEARTBEAT_TIMEOUT, `no answer to request ${req} within ${this.requestTimeoutMs} ms`);
    }
    for (const [nonce, at] of this.pings) {
      if (now - at >= this.requestTimeoutMs) return this.close(CloseCode.HEARTBEAT_TIMEOUT, `no answer to PING ${String(nonce)} within ${this.requestTimeoutMs} ms`);
    }
    if (now - this.lastRx >= this.watchdog()) this.close(CloseCode.HEARTBEAT_TIMEOUT, `no message for ${this.watchdog()} ms`);
  }

  /** The socket is closed: `code` received, else the one this side sent. */
  connectionLost(code: number, reason: string): void {
    if (!this.open) return;
    const local = this.closeRequest !== undefined;
    const terminal = this.terminal;
    // A drain after HELLO sends the client elsewhere at once; one before it (not pvwire's) keeps
    // the backoff, as any refusal before HELLO does.
    const drained = code === CloseCode.DRAINING && !local && this.hello !== undefined;
    this.endConnection(`connection closed: ${code} ${closeName(code)}`);
    // A close this side asked for (1002, 4000) reconnects whatever its class; a close concerns
    // every subscription (refused tokens are answered per attachment, ERROR).
    const reconnect = !terminal && this.reconnectAllowed && (local || closeClass(code) === "reconnect");
    const closed: SessionEvent<K> = { type: "closed", code, reason, reconnect: reconnect && this.subs.size > 0 };
    if (drained && reconnect && this.subs.size > 0) closed.withinMs = drainWithinMs(reason);
    this.events.push(closed);
    if (terminal) return;
    if (reconnect) this.events.push({ type: "lost", reason: `stream closed: ${code} ${closeName(code)}${reason ? ` (${reason})` : ""}` });
    else for (const sub of [...this.subs.values()]) this.fail(sub, "closed", code, reason);
  }

  /** No connection could be opened at all: retry. */
  connectFailed(reason: string): void {
    this.events.push({ type: "closed", code: CloseCode.ABNORMAL, reason, reconnect: this.reconnectAllowed && this.subs.size > 0 });
    this.events.push({ type: "lost", reason: `cannot connect: ${reason}` });
  }

  // ------------------------------------------------------------------ internals

  private watchdog(): number {
    return this.watchdogOverride ?? 2 * (this.hello?.heartbeatMs ?? DEFAULT_HEARTBEAT_MS) + 1000;
  }

  private close(code: number, reason: string): void {
    if (this.closeRequest === undefined) this.closeRequest = { code, reason };
  }

  private endConnection(why: string): void {
    this.open = false;
    this.hello = undefined;
    for (const nonce of this.pings.keys()) this.events.push({ type: "pong", nonce, rttMs: null, error: `${why} before the PONG` });
    this.pings.clear();
    for (const r of this.requests.values()) {
      if (r.sub?.state === "ABANDONED") this.move(r.sub, "lost"); // its ATTACH will have no answer
    }
    this.requests.clear();
    this.byAtt.clear();
    for (const sub of this.subs.values()) this.move(sub, "lost");
  }

  private move(sub: Subscription<K>, event: SubscriptionEvent, data: { token?: string; att?: number } = {}): void {
    const before = sub.state;
    move(sub, event, data);
    this.onTransition?.(sub.key, before, event, sub.state);
  }

  private attach(sub: Subscription<K>, now: number): void {
    // Attached or attaching already, a fresh token on its way, or no HELLO yet.
    if (!this.ready || sub.state !== "WAITING") return;
    if (sub.renewable && sub.expiresAt !== undefined && sub.expiresAt < now + 1000) {
      this.move(sub, "expiring");
      this.events.push({ type: "renew", key: sub.key });
      return;
    }
    const token = sub.token!; // held in WAITING
    const since = sub.held?.since();
    this.request("attach", sub, (req) => (since === undefined ? { kind: "ATTACH", req, token } : { kind: "ATTACH", req, token, since }), now);
    this.move(sub, "attach");
  }

  private request(what: "attach" | "detach", sub: Subscription<K> | undefined, message: (req: number) => ClientMessage, now: number): void {
    if (!this.ready) return; // the connection is gone: nothing to ask of it
    const req = this.nextReq++;
    this.requests.set(req, { what, sub, at: now });
    this.out.push(encodeClientMessage(message(req)));
  }

  private fail(sub: Subscription<K>, kind: FailureKind, code: number | null, message: string): void {
    const att = sub.att;
    this.move(sub, kind); // each kind of failure is the event that closes it
    this.subs.delete(sub.key);
    if (att !== undefined) this.byAtt.delete(att);
    this.events.push({ type: "failed", key: sub.key, kind, code, message });
  }

  private checkSeq(seq: number): void {
    if (seq !== this.seq + 1) throw new ProtocolError(`sequence gap: expected ${this.seq + 1}, got ${seq}`);
    this.seq = seq;
  }

  private entries(att: number, entries: readonly Entry[], snapshot: boolean): void {
    const sub = this.byAtt.get(att);
    if (sub === undefined) return; // an attachment this client detached, or never had (section 1)
    for (const e of entries) {
      if (e.sid >= sub.count) throw new ProtocolError(`entry sid ${e.sid} out of range for ${sub.count} channels`);
    }
    const held = sub.held;
    if (held !== undefined) {
      for (const e of entries) {
        let t: bigint | undefined;
        if (e.seconds !== undefined && e.nanoseconds !== undefined) {
          t = BigInt(e.seconds) * NS + BigInt(e.nanoseconds);
          held.entry(e.sid, t);
        }
        if (snapshot) held.snapshot(e.sid, t);
      }
    }
    this.events.push({ type: "entries", key: sub.key, entries, snapshot });
  }

  private dispatch(msg: ServerMessage, now: number): void {
    const notice = this.notice;
    this.notice = undefined;
    if (this.hello === undefined) {
      if (msg.kind !== "HELLO") throw new ProtocolError(`first message must be HELLO, got ${msg.kind}`);
      if (msg.version !== PROTOCOL_VERSION) {
        // Section 2.1: reconnecting would meet the same server; end the session.
        const why = `server speaks protocol version ${msg.version}, not ${PROTOCOL_VERSION}`;
        this.close(CloseCode.NORMAL, "unsupported protocol version");
        this.terminal = true;
        for (const sub of [...this.subs.values()]) this.fail(sub, "closed", CloseCode.UNSUPPORTED, why);
        return;
      }
      this.hello = msg;
      this.events.push({ type: "connected", hello: msg });
      for (const sub of [...this.subs.values()]) this.attach(sub, now);
      return;
    }
    switch (msg.kind) {
      case "DATA":
        this.checkSeq(msg.seq);
        for (const g of msg.groups) this.entries(g.att, g.entries, false);
        return;
      case "SNAPSHOT":
        this.checkSeq(msg.seq);
        this.entries(msg.att, msg.entries, true);
        return;
      case "HISTORY": {
        // No seq (section 2.8): a HISTORY is not counted, so a gap check never sees it.
        const sub = this.byAtt.get(msg.att);
        if (sub === undefined) return;
        if (msg.sid >= sub.count) throw new ProtocolError(`HISTORY sid ${msg.sid} out of range for ${sub.count} channels`);
        if (sub.held === undefined) {
          this.events.push({ type: "history", key: sub.key, history: msg });
          return;
        }
        for (const [start, stop] of sub.held.history(msg.sid, msg.t, msg.gap, msg.status, msg.resolution)) {
          this.events.push({ type: "history", key: sub.key, history: rowsBetween(msg, start, stop) });
        }
        return;
      }
      case "ATTACHED":
        this.attached(msg, now);
        return;
      case "DETACHED": {
        if (msg.req !== null) {
          this.requests.delete(msg.req);
          return; // the answer to this client's DETACH
        }
        const sub = this.byAtt.get(msg.att);
        if (sub === undefined) return;
        // The server ended it on its own and said why just before (section 2.3).
        if (notice !== undefined) this.fail(sub, "ended", notice.code, notice.message);
        else this.fail(sub, "ended", null, "the server ended the subscription");
        return;
      }
      case "ERROR":
        this.error(msg);
        return;
      case "PONG": {
        const at = this.pings.get(msg.nonce as number | string);
        if (at !== undefined) {
          this.pings.delete(msg.nonce as number | string);
          this.events.push({ type: "pong", nonce: msg.nonce as number | string, rttMs: now - at });
        }
        return;
      }
      // HEARTBEAT only feeds the watchdog; a second HELLO is not in the protocol's grammar, but
      // harmless: ignored (unknown kinds are dropped by the decoder, section 1).
      case "HEARTBEAT":
      case "HELLO":
        return;
    }
  }

  private attached(msg: Extract<ServerMessage, { kind: "ATTACHED" }>, now: number): void {
    const request = this.requests.get(msg.req);
    if (request === undefined || request.what !== "attach") throw new ProtocolError(`ATTACHED answers req ${msg.req}, which is no ATTACH sent`);
    this.requests.delete(msg.req);
    const sub = request.sub!;
    if (sub.state === "ABANDONED") { // removed while attaching
      this.move(sub, "attached");
      this.request("detach", undefined, (req) => ({ kind: "DETACH", req, att: msg.att }), now);
      return;
    }
    if (sub.ids !== undefined && !sameIds(msg.ids, sub.ids)) {
      // The server's channels are not the ones the token was registered for: values would show
      // under the wrong names. This subscription alone ends (re-attaching would meet the same
      // answer); the server is told to stop sending it.
      this.request("detach", undefined, (req) => ({ kind: "DETACH", req, att: msg.att }), now);
      this.fail(sub, "mismatch", null, `ATTACHED ids ${JSON.stringify(msg.ids)} differ from the token's ${JSON.stringify(sub.ids)}`);
      return;
    }
    this.move(sub, "attached", { att: msg.att });
    sub.count = msg.ids.length;
    sub.renewed = false;
    if (sub.backfill) {
      if (sub.held === undefined || sub.held.length !== sub.count) sub.held = new Held(sub.count);
      sub.held.attached();
    }
    this.byAtt.set(msg.att, sub);
    this.events.push({ type: "attached", key: sub.key, ids: msg.ids });
  }

  private error(msg: ErrorMessage): void {
    const request = msg.req === null ? undefined : this.requests.get(msg.req);
    if (msg.req !== null) this.requests.delete(msg.req);
    if (request?.what === "attach") {
      const sub = request.sub!;
      if (sub.state === "ABANDONED") { // removed while attaching
        this.move(sub, "refused");
        return;
      }
      if (RENEW_CODES.includes(msg.code) && sub.renewable && !sub.renewed) {
        // Expired, or signed with a key the server no longer has (a restart without a shared
        // key): register again, once (section 6).
        this.move(sub, "renew");
        sub.renewed = true;
        this.events.push({ type: "renew", key: sub.key });
      } else {
        this.fail(sub, "refused", msg.code, msg.message);
      }
    } else if (request?.what === "detach" && msg.code === ErrorCode.UNKNOWN_ATTACHMENT) {
      // The server ended it just before: it is gone already (section 2.3).
    } else if (msg.req === null && DETACH_REASONS.includes(msg.code)) {
      this.notice = msg; // says why the DETACHED that follows ends an attachment: reported with it
    } else {
      this.events.push({ type: "serverError", code: msg.code, message: msg.message });
    }
  }
}

function sameIds(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((id, i) => id === b[i]);
}
