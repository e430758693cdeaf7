/**
 * PvwireClient: GraphQL calls (get, put, search) and subscriptions multiplexed over ONE shared
 * WebSocket, with reconnect/re-attach, token renewal and a heartbeat watchdog.
 *
 * The stream part is a thin pump around the Session (session.ts), which holds the protocol's
 * state and decides what to send, apply, close and retry; this file owns the socket, the timers,
 * the backoff and the GraphQL re-registrations, and applies entries with `applyEntry`.
 */
import { defaultGetToken } from "./storedToken.js";
import { applyEntry, initialState, linkLost, withAccess, type Access, type ChangedField, type ChannelState } from "./channel.js";
import { closeName, CloseCode } from "./closeCodes.js";
import { backoffDelay, DEFAULT_BACKOFF, transition, type BackoffOptions, type ConnectionEvent, type ConnectionState } from "./connection.js";
import { ProtocolError, PvwireError, RequestError, StreamClosedError, StreamRequestError } from "./errors.js";
import {
  CHANNEL_FIELDS, graphqlRequest, type Channel, type FetchLike, type PutResult, type StreamRegistration,
} from "./graphql.js";
import { ALIGNED_SUBPROTOCOL, SUBPROTOCOL, type Entry, type History, type ServerMessage } from "./protocol.js";
import { Session, type SessionEvent } from "./session.js";

/** The clock of the session's `now`: monotonic, in ms. */
const now = (): number => performance.now();

/**
 * An event handler property. Declared through a method so that its parameter is checked
 * bivariantly: the browser's and `ws`'s handlers take richer event types than the fields the
 * client reads, and both must be accepted without a cast (`new PvwireClient(url, { WebSocket })`).
 */
type Handler<E> = { handle(ev: E): void }["handle"];

/** The part of the WebSocket API the client uses (browser WebSocket and the `ws` package fit). */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  onopen: Handler<unknown> | null;
  onmessage: Handler<{ data: unknown }> | null;
  onclose: Handler<{ code: number; reason: string }> | null;
  onerror: Handler<unknown> | null;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
}
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;

export interface ClientOptions {
  /** WebSocket implementation; default `globalThis.WebSocket` (pass `ws`'s in Node 20). */
  WebSocket?: WebSocketConstructor;
  /** fetch implementation; default `globalThis.fetch`. */
  fetch?: FetchLike;
  backoff?: BackoffOptions;
  /** Random source in [0, 1) for the backoff jitter (tests make it deterministic). */
  random?: () => number;
  /** Silence after which the connection is declared dead; default 2 × heartbeat_ms + 1 s. */
  heartbeatTimeoutMs?: number;
  /** Reconnect after "reconnect" close codes (default true). */
  reconnect?: boolean;
  /**
   * The user's bearer token (the site's OIDC access token), asked for before every GraphQL
   * request: reads, puts and each (re-)registration of a subscription, which is how the stream
   * learns the identity (the first subscribe, a stream token expiring across a reconnect, a token
   * the server refused). Return the current, refreshed token; undefined means anonymous.
   */
  getToken?: () => string | undefined | Promise<string | undefined>;
  /**
   * A stream request (ATTACH, DETACH, PING) without an answer this long means the connection is
   * broken (PROTOCOL.md section 2.7): close with 4000 and reconnect. Default 30,000 ms.
   */
  requestTimeoutMs?: number;
}

export interface SubscribeOptions {
  /** At most this many updates per second for this subscription (0 = every tick). */
  maxRate?: number;
  mode?: "LATEST" | "ALL";
  /**
   * Reduce 1-D arrays of more than 2 × maxColumns elements on the server to the minimum and
   * maximum of each of maxColumns equal slices, interleaved `[min0, max0, min1, ...]` (PROTOCOL.md
   * section 4.6): what a plot maxColumns pixels wide shows. `metadata.reduced` then gives the
   * whole length. Default 0: whole arrays. LATEST mode only.
   */
  maxColumns?: number;
  /**
   * Subsample images of more pixels on the server, by a whole step per axis, to at most this
   * many (at least 1,024); `metadata.reduced` gives the whole dims and the step. Default 0.
   */
  maxPixels?: number;
  /**
   * Seconds of the channels' past, as the server recorded it, delivered to `onHistory` before
   * the first snapshot (PROTOCOL.md section 2.8). Default 0: none.
   */
  backfill?: number;
  /**
   * The recorded past of channel `sid` (with `backfill`), oldest first, one or more calls per
   * channel before its first state reaches the listener: points (`resolution` 0) or buckets.
   * The listener's first value is the one after the last row. After a reconnect only rows the
   * subscription lacks come: those newer than what was delivered (or seen live), and those a
   * slow backfill left out (a gap row of status 1 said so), older than the live ones since.
   */
  onHistory?: (sid: number, history: History) => void;
  /**
   * Called when the subscription fails for good: unknown channel, access refused (GraphQL
   * FORBIDDEN, or stream code 4403), a token refused again after re-registering (4401, 4402).
   * The client's other subscriptions go on. Without it the client emits "error".
   */
  onError?: (error: PvwireError) => void;
}

export type Listener = (state: ChannelState, changed: readonly ChangedField[]) => void;

export interface Subscription {
  /** Channel ids as requested. */
  readonly ids: readonly string[];
  /** Current state of every channel, in sid order (empty until the first snapshot). */
  readonly channels: readonly ChannelState[];
  /** Resolves when the first snapshot was applied; rejects if the subscription fails first. */
  readonly ready: Promise<void>;
  readonly closed: boolean;
  unsubscribe(): void;
}

export interface ClientStats {
  messages: number;
  bytes: number;
  entries: number;
  connects: number;
}

interface ClientEvents {
  state: (state: ConnectionState) => void;
  /**
   * A retry was scheduled: the socket's reconnect (`what` "connect") or a subscription's
   * re-registration the server could not answer (`what` "register"), `delayMs` from now, the
   * `attempt`-th since the last HELLO (or since that registration began failing).
   */
  retry: (delayMs: number, attempt: number, what: "connect" | "register") => void;
  error: (error: PvwireError) => void;
  hello: (hello: Extract<ServerMessage, { kind: "HELLO" }>) => void;
}

const WS_OPEN = 1;

/** The GraphQL `SubscribeOptions`; the reduction only when asked for, so a server without it
 * still serves the rest. */
function subscribeOptions(o: SubscribeOptions): Record<string, unknown> {
  const out: Record<string, unknown> = { maxRate: o.maxRate ?? 0, mode: o.mode ?? "LATEST" };
  if (o.maxColumns) out.maxColumns = o.maxColumns;
  if (o.maxPixels) out.maxPixels = o.maxPixels;
  if (o.backfill) out.backfill = o.backfill;
  return out;
}
/** Stop listening to a socket we are done with. onerror stays a no-op: `ws` emits an error for
 * a socket closed while still connecting, and an EventEmitter error without a listener throws. */
function silence(ws: WebSocketLike): void {
  ws.onclose = ws.onmessage = ws.onopen = null;
  ws.onerror = () => undefined;
}

class Sub implements Subscription {
  states: ChannelState[] = [];
  closed = false;
  token: string | undefined;
  registering = false;
  /** Registered at least once: a later registration that cannot reach the server is retried. */
  registeredOnce = false;
  /** Failed re-registrations in a row, and the timer of the next one. */
  renewAttempt = 0;
  renewTimer: ReturnType<typeof setTimeout> | undefined;
  /** Access granted per sid by the last registration. */
  access: (Access | undefined)[] = [];
  readonly ready: Promise<void>;
  resolveReady!: () => void;
  rejectReady!: (e: PvwireError) => void;
  isReady = false;

  constructor(
    readonly client: PvwireClient,
    readonly ids: readonly string[],
    readonly listener: Listener,
    readonly options: SubscribeOptions,
    /** false for subscribeToken(): the client cannot re-register it. */
    readonly renewable: boolean,
  ) {
    this.ready = new Promise((resolve, reject) => {
      this.resolveReady = resolve;
      this.rejectReady = reject;
    });
    this.ready.catch(() => undefined); // failure goes to onError; avoid unhandled rejections
  }
  get channels(): readonly ChannelState[] { return this.states; }
  unsubscribe(): void { this.client._unsubscribe(this); }
}

/** The error a subscription the session ended fails with. */
function failure(ev: Extract<SessionEvent<Sub>, { type: "failed" }>): PvwireError {
  const code = ev.code ?? undefined;
  switch (ev.kind) {
    case "refused":
      return new StreamRequestError(`subscription refused: ${code} ${closeName(code!)}: ${ev.message}`, code);
    case "ended":
      return code !== undefined
        ? new StreamRequestError(`server ended the subscription: ${code} ${closeName(code)}: ${ev.message}`, code)
        : new StreamRequestError(`server ended the subscription: ${ev.message}`);
    case "closed":
      return new StreamClosedError(`stream closed: ${code} ${closeName(code!)}${ev.message ? `: ${ev.message}` : ""}`, code!, ev.message);
    case "mismatch":
      return new ProtocolError(ev.message);
  }
}

export class PvwireClient {
  readonly url: string;
  private readonly WS: WebSocketConstructor;
  private readonly fetchFn: FetchLike;
  private readonly backoff: Required<BackoffOptions>;
  private readonly random: () => number;
  private readonly opts: ClientOptions;

  private connState: ConnectionState = "disconnected";
  private session: Session<Sub>;
  private ws: WebSocketLike | undefined;
  private subs = new Set<Sub>();
  private nextNonce = 1;
  private attempt = 0;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  /** The session's deadline (watchdog, request time-outs). */
  private deadlineTimer: ReturnType<typeof setTimeout> | undefined;
  private closedByUser = false;
  private pumping = false;
  private pings = new Map<number, { resolve: (ms: number) => void; reject: (e: PvwireError) => void }>();
  private listeners: { [K in keyof ClientEvents]: Set<ClientEvents[K]> } = { state: new Set(), retry: new Set(), error: new Set(), hello: new Set() };
  /** Listening to the browser's `online` and `visibilitychange` while a reconnect waits. */
  private wakeListening = false;
  private streamPath = "/stream";
  readonly stats: ClientStats = { messages: 0, bytes: 0, entries: 0, connects: 0 };

  constructor(url: string, options: ClientOptions = {}) {
    this.url = url.replace(/\/+$/, "");
    this.opts = options;
    const WS = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    const f = options.fetch ?? (globalThis.fetch as unknown as FetchLike | undefined)?.bind(globalThis);
    if (!WS) throw new PvwireError("no WebSocket implementation: pass options.WebSocket (e.g. the `ws` package in Node)");
    if (!f) throw new PvwireError("no fetch implementation: pass options.fetch");
    this.WS = WS;
    this.fetchFn = f;
    // Without getToken: in Node, PVWIRE_TOKEN or the token `pvwire login` stored (storedToken.ts).
    if (!("getToken" in options)) this.opts = { ...options, getToken: defaultGetToken(f) };
    this.backoff = { ...DEFAULT_BACKOFF, ...options.backoff };
    this.random = options.random ?? Math.random;
    this.session = this.newSession();
  }

  private newSession(): Session<Sub> {
    const o = this.opts;
    return new Session<Sub>({ requestTimeoutMs: o.requestTimeoutMs, watchdogMs: o.heartbeatTimeoutMs, reconnect: o.reconnect });
  }

  // ------------------------------------------------------------------ events

  get state(): ConnectionState { return this.connState; }

  on<K extends keyof ClientEvents>(event: K, fn: ClientEvents[K]): () => void {
    this.listeners[event].add(fn);
    return () => this.listeners[event].delete(fn);
  }

  private emit<K extends keyof ClientEvents>(event: K, ...args: Parameters<ClientEvents[K]>): void {
    for (const fn of [...this.listeners[event]]) (fn as (...a: Parameters<ClientEvents[K]>) => void)(...args);
  }

  private move(event: ConnectionEvent): void {
    const next = transition(this.connState, event);
    if (next !== this.connState) {
      this.connState = next;
      this.emit("state", next);
    }
  }

  // ------------------------------------------------------------------ control plane

  async graphql<T>(query: string, variables: Record<string, unknown> = {}): Promise<T> {
    let token: string | undefined;
    try {
      token = await this.opts.getToken?.();
    } catch (err) {
      throw new RequestError(`getToken failed: ${(err as Error).message ?? String(err)}`, "TOKEN");
    }
    return graphqlRequest<T>(this.fetchFn, `${this.url}/graphql`, query, variables, token);
  }

  /** Read one channel (throws on NOT_FOUND, TIMEOUT...) or several (each may carry `error`). */
  get(id: string, timeout?: number): Promise<Channel>;
  get(ids: readonly string[], timeout?: number): Promise<Channel[]>;
  async get(ids: string | readonly string[], timeout = 3): Promise<Channel | Channel[]> {
    if (typeof ids === "string") {
      const d = await this.graphql<{ channel: Channel }>(`query($id: String!, $t: Float!) { channel(id: $id, timeout: $t) ${CHANNEL_FIELDS} }`, { id: ids, t: timeout });
      return d.channel;
    }
    const d = await this.graphql<{ channels: Channel[] }>(`query($ids: [String!]!, $t: Float!) { channels(ids: $ids, timeout: $t) ${CHANNEL_FIELDS} }`, { ids, t: timeout });
    return d.channels;
  }

  /** Write a value; with `wait`, resolves after the IOC processed it. Throws RequestError on failure. */
  async put(id: string, value: unknown, options: { wait?: boolean; timeout?: number } = {}): Promise<PutResult> {
    const d = await this.graphql<{ put: PutResult }>(
      `mutation($id: String!, $v: JSON!, $w: Boolean!, $t: Float!) { put(id: $id, value: $v, wait: $w, timeout: $t) { id ok error errorCode } }`,
      { id, v: value, w: options.wait ?? false, t: options.timeout ?? 5 },
    );
    if (!d.put.ok) throw new RequestError(d.put.error ?? `put to ${id} failed`, d.put.errorCode ?? "PUT_FAILED");
    return d.put;
  }

  /** Glob search (*, ?, [..]) over known channel ids, sorted. */
  async search(pattern: string, limit = 100): Promise<string[]> {
    const d = await this.graphql<{ search: string[] }>(`query($p: String!, $l: Int!) { search(pattern: $p, limit: $l) }`, { p: pattern, l: limit });
    return d.search;
  }

  /** Register a stream through the GraphQL `subscribe` mutation (returns a token). */
  async register(ids: readonly string[], options: SubscribeOptions = {}): Promise<StreamRegistration> {
    const d = await this.graphql<{ subscribe: StreamRegistration }>(
      `mutation($ids: [String!]!, $o: SubscribeOptions) { subscribe(ids: $ids, options: $o) { token expiresAt streamPath channels { sid id access } } }`,
      { ids, o: subscribeOptions(options) },
    );
    return d.subscribe;
  }

  // ------------------------------------------------------------------ data plane

  /** Stream channels: `listener(state, changed)` after every applied entry, snapshot first. */
  subscribe(ids: readonly string[], listener: Listener, options: SubscribeOptions = {}): Subscription {
    const sub = new Sub(this, [...ids], listener, options, true);
    this.subs.add(sub);
    void this.renew(sub);
    return sub;
  }

  /** Stream a token obtained elsewhere (it cannot be renewed when it expires). */
  subscribeToken(token: string, listener: Listener, options: SubscribeOptions = {}): Subscription {
    const sub = new Sub(this, [], listener, options, false);
    sub.token = token;
    this.subs.add(sub);
    this.session.add(sub, token, undefined, { renewable: false, backfill: Boolean(options.backfill), now: now() });
    this.ensureSocket();
    this.pump();
    return sub;
  }

  /** Round-trip time (ms) through the server's send queue. */
  ping(): Promise<number> {
    const nonce = this.nextNonce++;
    return new Promise((resolve, reject) => {
      if (!this.session.ping(nonce, now())) return reject(new PvwireError("not connected"));
      this.pings.set(nonce, { resolve, reject });
      this.pump();
    });
  }

  /** Close the socket and end every subscription. */
  close(): void {
    this.closedByUser = true;
    this.listenForWake(false);
    for (const sub of [...this.subs]) {
      sub.closed = true;
      clearTimeout(sub.renewTimer);
    }
    this.subs.clear();
    clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    clearTimeout(this.deadlineTimer);
    for (const p of this.pings.values()) p.reject(new PvwireError("client closed before the PONG"));
    this.pings.clear();
    // Nothing of the old session is wanted any more: no DETACH, no events.
    this.session = this.newSession();
    const ws = this.ws;
    this.ws = undefined;
    if (ws) {
      silence(ws);
      try { ws.close(CloseCode.NORMAL, "client closed"); } catch { /* already closed */ }
    }
    if (this.connState !== "disconnected") this.move("closed");
  }

  /** @internal */
  _unsubscribe(sub: Sub): void {
    if (sub.closed) return;
    sub.closed = true;
    clearTimeout(sub.renewTimer);
    this.subs.delete(sub);
    this.session.remove(sub, now());
    this.pump();
  }

  /** Get a (fresh) token through GraphQL, then hand it to the session. */
  private async renew(sub: Sub): Promise<void> {
    if (sub.registering || sub.closed) return;
    sub.registering = true;
    clearTimeout(sub.renewTimer);
    sub.renewTimer = undefined;
    let reg: StreamRegistration;
    try {
      reg = await this.register(sub.ids, sub.options);
      if (sub.closed) return;
      sub.registeredOnce = true;
      sub.renewAttempt = 0;
      sub.token = reg.token;
      sub.access = [];
      for (const c of reg.channels) sub.access[c.sid] = c.access;
      // Rules may have changed since the last registration: show the access granted now.
      sub.states = sub.states.map((st) => withAccess(st, sub.access[st.sid]));
      this.streamPath = reg.streamPath || "/stream";
    } catch (err) {
      const e = err instanceof PvwireError ? err : new PvwireError(String(err));
      // Registering again while the server cannot be reached (down, restarting, a proxy's
      // 502/503 page) is retried with the reconnect backoff for as long as the subscription is
      // open: an outage must not end it. This subscription alone waits; the socket and the
      // others go on. A first registration that fails is the application's error.
      if (sub.registeredOnce && !sub.closed && (e.code === "NETWORK" || e.code === "HTTP")) {
        const attempt = sub.renewAttempt++;
        const delay = backoffDelay(attempt, this.backoff, this.random);
        sub.renewTimer = setTimeout(() => { sub.renewTimer = undefined; void this.renew(sub); }, delay);
        this.emit("retry", delay, attempt + 1, "register");
      } else {
        this.fail(sub, e);
      }
      return;
    } finally {
      sub.registering = false;
    }
    // The token's channels in sid order: an ATTACHED naming others fails the subscription.
    const ids: string[] = [];
    for (const c of reg.channels) ids[c.sid] = c.id;
    const t = now();
    const expiresAt = t + (reg.expiresAt * 1000 - Date.now());
    if (this.session.has(sub)) this.session.setToken(sub, reg.token, ids, { expiresAt, now: t });
    else this.session.add(sub, reg.token, ids, { expiresAt, renewable: true, backfill: Boolean(sub.options.backfill), now: t });
    this.ensureSocket();
    this.pump();
  }

  private fail(sub: Sub, err: PvwireError): void {
    if (sub.closed) return;
    this._unsubscribe(sub);
    sub.rejectReady(err);
    if (sub.options.onError) sub.options.onError(err);
    else this.emit("error", err);
  }

  private ensureSocket(): void {
    if (this.ws || this.retryTimer !== undefined || this.subs.size === 0) return;
    this.closedByUser = false;
    this.open();
  }

  private wsUrl(): string {
    return this.url.replace(/^http/, "ws") + this.streamPath;
  }

  private open(): void {
    this.retryTimer = undefined;
    this.listenForWake(false);
    this.move("open");
    let ws: WebSocketLike;
    try {
      ws = new this.WS(this.wsUrl(), [ALIGNED_SUBPROTOCOL, SUBPROTOCOL]);
    } catch (err) {
      const why = `cannot open ${this.wsUrl()}: ${(err as Error).message}`;
      this.emit("error", new PvwireError(why));
      this.session.connectFailed(why);
      this.pump();
      return;
    }
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.stats.connects++;
    // The watchdog runs from here: a handshake that hangs counts as silence.
    this.session.connectionMade(now());
    ws.onmessage = (ev) => this.onMessage(ws, ev.data);
    ws.onclose = (ev) => this.onClose(ws, ev.code, ev.reason);
    ws.onerror = () => undefined; // a close event always follows
    this.pump();
  }

  private onMessage(ws: WebSocketLike, data: unknown): void {
    if (ws !== this.ws) return;
    if (data instanceof ArrayBuffer) {
      this.stats.messages++;
      this.stats.bytes += data.byteLength;
    }
    this.session.receive(data, now());
    this.pump();
  }

  private onClose(ws: WebSocketLike, code: number, reason: string): void {
    if (ws !== this.ws) return;
    this.ws = undefined;
    this.session.connectionLost(code, reason);
    this.pump();
  }

  /**
   * Carry out what the session asks: send its messages, close the socket it wants closed (then
   * tell it the connection is lost), hand its events on, and arm its deadline. Re-entrant calls
   * (a listener unsubscribing) leave the work to the running one, so events keep their order.
   */
  private pump(): void {
    if (this.pumping) return;
    this.pumping = true;
    try {
      for (;;) {
        this.flush();
        const ev = this.session.nextEvent();
        if (ev === undefined) break;
        this.handle(ev);
      }
    } finally {
      this.pumping = false;
    }
    clearTimeout(this.deadlineTimer);
    const at = this.session.deadline();
    if (at !== undefined) {
      this.deadlineTimer = setTimeout(() => {
        this.session.timer(now());
        this.pump();
      }, Math.max(0, at - now()));
    }
  }

  private flush(): void {
    const ws = this.ws;
    const data = this.session.dataToSend();
    if (ws !== undefined && ws.readyState === WS_OPEN) for (const d of data) ws.send(d);
    const close = this.session.closeRequest;
    if (close !== undefined && ws !== undefined) {
      // Do not wait for the close handshake of a dead connection: detach the handlers now.
      this.ws = undefined;
      silence(ws);
      try { ws.close(close.code, close.reason.slice(0, 100)); } catch { /* ignore */ }
      this.session.connectionLost(close.code, close.reason);
    }
  }

  private handle(ev: SessionEvent<Sub>): void {
    switch (ev.type) {
      case "connected":
        // The server answered: its next loss starts a new outage, first retry within baseMs.
        // A server refusing before HELLO (1013 TRY_AGAIN) keeps the backoff growing.
        this.attempt = 0;
        this.move("hello");
        this.emit("hello", ev.hello);
        return;
      case "attached": {
        const sub = ev.key;
        // Keep previous states (serial continuity): the ids are the token's every time.
        sub.states = ev.ids.map((id, sid) => {
          const prev = sub.states[sid];
          return prev !== undefined && prev.id === id ? withAccess(prev, sub.access[sid]) : initialState(id, sid, sub.access[sid]);
        });
        return;
      }
      case "entries":
        this.deliver(ev.key, ev.entries, ev.snapshot);
        if (ev.snapshot && !ev.key.isReady && !ev.key.closed) {
          ev.key.isReady = true;
          ev.key.resolveReady();
        }
        return;
      case "history":
        this.history(ev.key, ev.history);
        return;
      case "lost":
        this.markLost(ev.reason);
        return;
      case "failed":
        this.fail(ev.key, failure(ev));
        return;
      case "renew":
        ev.key.token = undefined;
        void this.renew(ev.key);
        return;
      case "pong": {
        const p = typeof ev.nonce === "number" ? this.pings.get(ev.nonce) : undefined;
        if (p === undefined) return;
        this.pings.delete(ev.nonce as number);
        if (ev.rttMs !== null) p.resolve(ev.rttMs);
        else p.reject(new PvwireError(ev.error ?? "no PONG"));
        return;
      }
      case "serverError":
        this.emit("error", new StreamRequestError(`stream error ${ev.code} ${closeName(ev.code)}: ${ev.message}`, ev.code));
        return;
      case "malformed":
        this.emit("error", new ProtocolError(ev.message));
        return;
      case "closed":
        if (this.closedByUser) return;
        if (ev.reconnect) {
          this.move("lost");
          this.scheduleReconnect(ev.withinMs);
        } else {
          this.move("closed");
        }
        return;
    }
  }

  /** Apply entries and tell the listener of each; a listener that throws is reported as an error
   * and stops neither the other channels nor the stream. */
  private deliver(sub: Sub, entries: readonly Entry[], baseline: boolean): void {
    for (const e of entries) {
      const prev = sub.states[e.sid]!;
      const [next, changed] = applyEntry(prev, e, baseline);
      sub.states[e.sid] = next;
      this.stats.entries++;
      if (sub.closed) return;
      this.tell(sub, next, changed);
    }
  }

  /** Hand the rows of a HISTORY the subscription lacks (the session keeps only those: held.ts)
   * to its onHistory; one that throws is reported as an error, like a listener. */
  private history(sub: Sub, msg: History): void {
    const onHistory = sub.options.onHistory;
    if (onHistory === undefined || sub.closed) return;
    try {
      onHistory(msg.sid, msg);
    } catch (err) {
      this.emit("error", err instanceof PvwireError ? err : new PvwireError(`subscription onHistory failed: ${String(err)}`));
    }
  }

  private tell(sub: Sub, state: ChannelState, changed: ChangedField[]): void {
    try {
      sub.listener(state, changed);
    } catch (err) {
      this.emit("error", err instanceof PvwireError ? err : new PvwireError(`subscription listener failed: ${String(err)}`));
    }
  }

  /**
   * The socket is gone and a reconnect is scheduled: every connected channel shows DISCONNECTED
   * with the close as its reason, each listener told once per channel, so a display does not show
   * values that no longer update as live. A further failed attempt says nothing new (the
   * channels are already DISCONNECTED); the snapshots after the re-attach restore the state.
   */
  private markLost(reason: string): void {
    for (const sub of [...this.subs]) {
      for (let sid = 0; sid < sub.states.length && !sub.closed; sid++) {
        const next = linkLost(sub.states[sid]!, reason);
        if (next === undefined) continue;
        sub.states[sid] = next;
        this.tell(sub, next, ["connection"]);
      }
    }
  }

  /** `drainWithinMs`: the server is draining (4012): reconnect at once, within that, without
   * backoff (PROTOCOL.md section 8); a failure of that reconnect backs off from 0. */
  private scheduleReconnect(drainWithinMs?: number): void {
    if (this.subs.size === 0) {
      this.move("closed");
      return;
    }
    let attempt: number;
    let delay: number;
    if (drainWithinMs !== undefined) {
      attempt = this.attempt = 0;
      delay = this.random() * Math.min(drainWithinMs, this.backoff.maxMs);
    } else {
      attempt = this.attempt++;
      delay = backoffDelay(attempt, this.backoff, this.random);
    }
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => this.open(), delay);
    this.listenForWake(true);
    this.emit("retry", delay, attempt + 1, "connect");
  }

  /**
   * In a browser, the network coming back (`online`) or the page shown again
   * (`visibilitychange`; browsers throttle timers of hidden tabs to once a minute or less) cuts a
   * waiting reconnect short: retry now, within one base delay of jitter so a control room's
   * screens do not all arrive in the same millisecond.
   */
  private readonly wake = (): void => {
    const doc = (globalThis as { document?: { visibilityState?: string } }).document;
    if (this.retryTimer === undefined || doc?.visibilityState === "hidden") return;
    clearTimeout(this.retryTimer);
    this.attempt = 0;
    this.retryTimer = setTimeout(() => this.open(), backoffDelay(0, this.backoff, this.random));
  };

  private listenForWake(on: boolean): void {
    if (on === this.wakeListening) return;
    this.wakeListening = on;
    type Target = { addEventListener(type: string, fn: () => void): void; removeEventListener(type: string, fn: () => void): void };
    const g = globalThis as { document?: Target } & Partial<Target>;
    // `online` fires at the window, `visibilitychange` at the document; Node has neither.
    const targets: [Target | undefined, string][] = [
      [typeof g.addEventListener === "function" ? (g as Target) : undefined, "online"],
      [g.document, "visibilitychange"],
    ];
    for (const [target, type] of targets) {
      if (on) target?.addEventListener(type, this.wake);
      else target?.removeEventListener(type, this.wake);
    }
  }
}
