/**
 * PvwireClient: GraphQL calls (get, put, search) and subscriptions multiplexed over ONE shared
 * WebSocket, with reconnect/re-attach, token renewal and a heartbeat watchdog.
 */
import { defaultGetToken } from "./storedToken.js";
import { applyEntry, initialState, linkLost, withAccess, type Access, type ChangedField, type ChannelState } from "./channel.js";
import { closeClass, closeName, CloseCode } from "./closeCodes.js";
import { backoffDelay, DEFAULT_BACKOFF, transition, type BackoffOptions, type ConnectionEvent, type ConnectionState } from "./connection.js";
import { ProtocolError, PvwireError, RequestError, StreamClosedError, StreamRequestError } from "./errors.js";
import {
  CHANNEL_FIELDS, graphqlRequest, type Channel, type FetchLike, type PutResult, type StreamRegistration,
} from "./graphql.js";
import { ALIGNED_SUBPROTOCOL, decodeServerMessage, encodeClientMessage, PROTOCOL_VERSION, SUBPROTOCOL, type ClientMessage, type Entry, type ServerMessage } from "./protocol.js";

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
  return out;
}
/** ERROR codes for a refused token (PROTOCOL.md section 7): register again, once. */
const RENEW_CODES: readonly number[] = [CloseCode.BAD_TOKEN, CloseCode.TOKEN_EXPIRED];
/** ERROR codes about one attachment's token: the DETACHED that follows reports them. */
const TOKEN_CODES: readonly number[] = [CloseCode.BAD_TOKEN, CloseCode.TOKEN_EXPIRED, CloseCode.FORBIDDEN];

/** Stop listening to a socket we are done with. onerror stays a no-op: `ws` emits an error for
 * a socket closed while still connecting, and an EventEmitter error without a listener throws. */
function silence(ws: WebSocketLike): void {
  ws.onclose = ws.onmessage = ws.onopen = null;
  ws.onerror = () => undefined;
}

class Sub implements Subscription {
  att: number | undefined;
  states: ChannelState[] = [];
  closed = false;
  token: string | undefined;
  expiresAt = Infinity;
  registering = false;
  /** A token was refused (4401/4402) and the subscription registered again; reset by ATTACHED,
   * so a server that refuses every token causes one retry, not a loop. */
  renewed = false;
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

export class PvwireClient {
  readonly url: string;
  private readonly WS: WebSocketConstructor;
  private readonly fetchFn: FetchLike;
  private readonly backoff: Required<BackoffOptions>;
  private readonly random: () => number;
  private readonly opts: ClientOptions;

  private connState: ConnectionState = "disconnected";
  private ws: WebSocketLike | undefined;
  private subs = new Set<Sub>();
  private byAtt = new Map<number, Sub>();
  /** ATTACH requests without an answer yet, in the order sent. */
  private pending = new Map<number, Sub>();
  private nextReq = 1;
  private lastSeq = 0;
  private attempt = 0;
  private heartbeatMs = 15_000;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private watchdog: ReturnType<typeof setTimeout> | undefined;
  /** Why we closed the socket ourselves (then we reconnect whatever the code). */
  private localClose: string | undefined;
  private closedByUser = false;
  private pings = new Map<number, { sent: number; resolve: (ms: number) => void; reject: (e: PvwireError) => void }>();
  /** Time-outs of requests sent on the current socket and not answered yet, by req (or nonce). */
  private requestTimers = new Map<number, ReturnType<typeof setTimeout>>();
  private listeners: { [K in keyof ClientEvents]: Set<ClientEvents[K]> } = { state: new Set(), retry: new Set(), error: new Set(), hello: new Set() };
  /** Listening to the browser's `online` and `visibilitychange` while a reconnect waits. */
  private wakeListening = false;
  private streamPath = "/stream";
  /** The last ERROR that answered no request, for a DETACHED that may follow it at once. */
  private notice: Extract<ServerMessage, { kind: "ERROR" }> | undefined;
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
    this.ensureSocket();
    if (this.connState === "connected") this.attach(sub);
    return sub;
  }

  /** Round-trip time (ms) through the server's send queue. */
  ping(): Promise<number> {
    const nonce = this.nextReq++;
    return new Promise((resolve, reject) => {
      if (!this.send({ kind: "PING", nonce })) return reject(new PvwireError("not connected"));
      this.pings.set(nonce, { sent: performance.now(), resolve, reject });
      this.expectAnswer(nonce);
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
    this.byAtt.clear();
    this.pending.clear();
    clearTimeout(this.retryTimer);
    clearTimeout(this.watchdog);
    this.clearRequestTimers();
    for (const p of this.pings.values()) p.reject(new PvwireError("client closed before the PONG"));
    this.pings.clear();
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
    if (sub.att !== undefined) {
      this.byAtt.delete(sub.att);
      this.detach(sub.att);
      sub.att = undefined;
    }
  }

  private detach(att: number): void {
    const req = this.nextReq++;
    if (this.send({ kind: "DETACH", req, att })) this.expectAnswer(req);
  }

  /** Start the time-out of a request just sent on the current socket. */
  private expectAnswer(req: number): void {
    const ws = this.ws;
    const ms = this.opts.requestTimeoutMs ?? 30_000;
    this.requestTimers.set(req, setTimeout(() => {
      if (ws === this.ws) this.dropSocket(`no answer to request ${req} within ${ms} ms`, CloseCode.HEARTBEAT_TIMEOUT);
    }, ms));
  }

  private answered(req: number | null): void {
    if (req === null) return;
    clearTimeout(this.requestTimers.get(req));
    this.requestTimers.delete(req);
  }

  private clearRequestTimers(): void {
    for (const t of this.requestTimers.values()) clearTimeout(t);
    this.requestTimers.clear();
  }

  /** Get a (fresh) token through GraphQL, then attach it. */
  private async renew(sub: Sub): Promise<void> {
    if (sub.registering || sub.closed) return;
    sub.registering = true;
    clearTimeout(sub.renewTimer);
    sub.renewTimer = undefined;
    try {
      const reg = await this.register(sub.ids, sub.options);
      if (sub.closed) return;
      sub.registeredOnce = true;
      sub.renewAttempt = 0;
      sub.token = reg.token;
      sub.expiresAt = reg.expiresAt * 1000;
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
    this.ensureSocket();
    if (this.connState === "connected") this.attach(sub);
  }

  private fail(sub: Sub, err: PvwireError): void {
    if (sub.closed) return;
    this._unsubscribe(sub);
    sub.rejectReady(err);
    if (sub.options.onError) sub.options.onError(err);
    else this.emit("error", err);
  }

  private attach(sub: Sub): void {
    if (sub.closed || sub.token === undefined || sub.att !== undefined || [...this.pending.values()].includes(sub)) return;
    if (sub.registering || sub.renewTimer !== undefined) return; // a fresh token is on its way
    if (sub.renewable && sub.expiresAt < Date.now() + 1000) {
      sub.token = undefined;
      void this.renew(sub);
      return;
    }
    const req = this.nextReq++;
    if (this.send({ kind: "ATTACH", req, token: sub.token })) {
      this.pending.set(req, sub);
      this.expectAnswer(req);
    }
  }

  private send(m: ClientMessage): boolean {
    const ws = this.ws;
    if (!ws || ws.readyState !== WS_OPEN || this.connState !== "connected") return false;
    ws.send(encodeClientMessage(m));
    return true;
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
    this.lastSeq = 0;
    this.localClose = undefined;
    let ws: WebSocketLike;
    try {
      ws = new this.WS(this.wsUrl(), [ALIGNED_SUBPROTOCOL, SUBPROTOCOL]);
    } catch (err) {
      this.emit("error", new PvwireError(`cannot open ${this.wsUrl()}: ${(err as Error).message}`));
      this.scheduleReconnect();
      return;
    }
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.stats.connects++;
    this.armWatchdog(2 * this.heartbeatMs + 1000);
    ws.onmessage = (ev) => this.onMessage(ev.data);
    ws.onclose = (ev) => this.onClose(ws, ev.code, ev.reason);
    ws.onerror = () => undefined; // a close event always follows
  }

  private armWatchdog(ms: number): void {
    clearTimeout(this.watchdog);
    this.watchdog = setTimeout(() => this.dropSocket(`no message for ${ms} ms`, CloseCode.HEARTBEAT_TIMEOUT), this.opts.heartbeatTimeoutMs ?? ms);
  }

  /**
   * Close the socket ourselves and reconnect: 4000 for a dead connection or an unanswered
   * request, 1002 for a message the protocol does not allow (this connection's state may be
   * wrong; the snapshots after the reconnect restore it).
   */
  private dropSocket(reason: string, code: number): void {
    const ws = this.ws;
    if (!ws) return;
    this.localClose = reason;
    // Do not wait for the close handshake of a dead connection: detach the handlers now.
    silence(ws);
    try { ws.close(code, reason.slice(0, 100)); } catch { /* ignore */ }
    this.onClose(ws, code, reason);
  }

  private onMessage(data: unknown): void {
    let msg: ServerMessage | null;
    try {
      if (!(data instanceof ArrayBuffer)) throw new ProtocolError("invalid server message: text WebSocket message (pvwire sends binary only)");
      this.stats.messages++;
      this.stats.bytes += data.byteLength;
      msg = decodeServerMessage(new Uint8Array(data));
    } catch (err) {
      const e = err instanceof PvwireError ? err : new ProtocolError(String(err));
      this.emit("error", e);
      this.dropSocket(e.message, CloseCode.PROTOCOL_ERROR);
      return;
    }
    this.armWatchdog(2 * this.heartbeatMs + 1000);
    if (msg === null) return;
    try {
      this.handle(msg);
    } catch (err) {
      const e = err instanceof PvwireError ? err : new PvwireError(String(err));
      this.emit("error", e);
      this.dropSocket(e.message, e instanceof ProtocolError ? CloseCode.PROTOCOL_ERROR : CloseCode.INTERNAL);
    }
  }

  private checkSeq(seq: number): void {
    if (seq !== this.lastSeq + 1) throw new ProtocolError(`sequence gap: expected ${this.lastSeq + 1}, got ${seq}`);
    this.lastSeq = seq;
  }

  private deliver(sub: Sub, entries: readonly Entry[], baseline: boolean): void {
    for (const e of entries) {
      const prev = sub.states[e.sid];
      if (prev === undefined) throw new ProtocolError(`entry for sid ${e.sid}, attachment has ${sub.states.length} channels`);
      const [next, changed] = applyEntry(prev, e, baseline);
      sub.states[e.sid] = next;
      this.stats.entries++;
      if (sub.closed) return;
      sub.listener(next, changed);
    }
  }

  private handle(msg: ServerMessage): void {
    const notice = this.notice;
    this.notice = undefined;
    switch (msg.kind) {
      case "HELLO": {
        if (msg.version !== PROTOCOL_VERSION) {
          this.terminal(new StreamClosedError(`server speaks protocol version ${msg.version}, client ${PROTOCOL_VERSION}`, CloseCode.UNSUPPORTED, ""));
          return;
        }
        this.heartbeatMs = msg.heartbeatMs;
        this.armWatchdog(2 * msg.heartbeatMs + 1000);
        // The server answered: its next loss starts a new outage, first retry within baseMs.
        // A server refusing before HELLO (1013 TRY_AGAIN) keeps the backoff growing.
        this.attempt = 0;
        this.move("hello");
        this.emit("hello", msg);
        for (const sub of this.subs) {
          if (sub.token === undefined) void this.renew(sub);
          else this.attach(sub);
        }
        return;
      }
      case "ATTACHED": {
        this.answered(msg.req);
        const sub = this.pending.get(msg.req);
        if (sub === undefined) throw new ProtocolError(`ATTACHED answers req ${msg.req}, which is no pending ATTACH`);
        this.pending.delete(msg.req);
        if (sub.closed) {
          this.detach(msg.att);
          return;
        }
        sub.att = msg.att;
        sub.renewed = false;
        this.byAtt.set(msg.att, sub);
        // Keep previous states (serial continuity) when the ids are the same.
        sub.states = msg.ids.map((id, sid) => {
          const prev = sub.states[sid];
          return prev !== undefined && prev.id === id ? withAccess(prev, sub.access[sid]) : initialState(id, sid, sub.access[sid]);
        });
        return;
      }
      case "SNAPSHOT": {
        this.checkSeq(msg.seq);
        const sub = this.byAtt.get(msg.att);
        if (sub === undefined) return;
        this.deliver(sub, msg.entries, true);
        if (!sub.isReady) {
          sub.isReady = true;
          sub.resolveReady();
        }
        return;
      }
      case "DATA":
        this.checkSeq(msg.seq);
        for (const g of msg.groups) {
          const sub = this.byAtt.get(g.att);
          if (sub !== undefined) this.deliver(sub, g.entries, false);
        }
        return;
      case "DETACHED": {
        this.answered(msg.req);
        const sub = this.byAtt.get(msg.att);
        this.byAtt.delete(msg.att);
        if (sub !== undefined && msg.req === null) {
          sub.att = undefined;
          // The server says why just before (e.g. 4403 naming the channel after a rules reload).
          const err = notice !== undefined
            ? new StreamRequestError(`server ended the subscription: ${notice.code} ${closeName(notice.code)}: ${notice.message}`, notice.code)
            : new StreamRequestError(`server ended attachment ${msg.att}`);
          this.fail(sub, err);
        }
        return;
      }
      case "ERROR": {
        this.answered(msg.req);
        const sub = msg.req === null ? undefined : this.pending.get(msg.req);
        if (sub !== undefined && msg.req !== null) {
          this.pending.delete(msg.req);
          this.refused(sub, msg.code, msg.message);
        } else {
          this.notice = msg;
          if (msg.code !== 4404 && !TOKEN_CODES.includes(msg.code)) {
            this.emit("error", new StreamRequestError(`stream error ${msg.code}: ${msg.message}`, msg.code));
          }
        }
        return;
      }
      case "PONG": {
        const p = typeof msg.nonce === "number" ? this.pings.get(msg.nonce) : undefined;
        if (p && typeof msg.nonce === "number") {
          this.answered(msg.nonce);
          this.pings.delete(msg.nonce);
          p.resolve(performance.now() - p.sent);
        }
        return;
      }
      case "HEARTBEAT":
        return;
    }
  }

  /** The server answered an ATTACH with ERROR: only that subscription is concerned. */
  private refused(sub: Sub, code: number, message: string): void {
    if (sub.closed) return;
    if (RENEW_CODES.includes(code) && sub.renewable && !sub.renewed) {
      // Expired, or signed with a key the server no longer has (a restart without a shared
      // key): register again, with a fresh token from getToken, once.
      sub.renewed = true;
      sub.token = undefined;
      void this.renew(sub);
      return;
    }
    this.fail(sub, new StreamRequestError(`subscription refused: ${code} ${closeName(code)}: ${message}`, code));
  }

  /** A terminal condition for the whole connection: fail every subscription, no reconnect. */
  private terminal(err: StreamClosedError): void {
    for (const sub of [...this.subs]) this.fail(sub, err);
    const ws = this.ws;
    this.ws = undefined;
    clearTimeout(this.watchdog);
    this.clearRequestTimers();
    if (ws) {
      silence(ws);
      try { ws.close(CloseCode.NORMAL, err.message.slice(0, 100)); } catch { /* ignore */ }
    }
    if (this.subs.size === 0 && this.listeners.error.size > 0 && err.code !== CloseCode.NORMAL) this.emit("error", err);
    this.move("closed");
  }

  private onClose(ws: WebSocketLike, code: number, reason: string): void {
    if (ws !== this.ws) return;
    this.ws = undefined;
    clearTimeout(this.watchdog);
    this.clearRequestTimers();
    for (const p of this.pings.values()) p.reject(new PvwireError(`connection closed before the PONG: ${code} ${closeName(code)}`));
    this.pings.clear();
    this.pending.clear();
    for (const sub of this.subs) sub.att = undefined;
    this.byAtt.clear();
    if (this.closedByUser) return;

    const local = this.localClose !== undefined;
    // A close concerns every subscription: refused tokens are answered per attachment (ERROR).
    if (!local && closeClass(code) === "terminal") {
      this.terminal(new StreamClosedError(`stream closed: ${code} ${closeName(code)}${reason ? `: ${reason}` : ""}`, code, reason));
      return;
    }
    if (this.opts.reconnect === false) {
      this.terminal(new StreamClosedError(`stream closed: ${code} ${closeName(code)}`, code, reason));
      return;
    }
    this.move("lost");
    this.scheduleReconnect();
    this.markLost(`stream closed: ${code} ${closeName(code)}${reason ? ` (${reason})` : ""}`);
  }

  /**
   * The socket is gone and a reconnect is scheduled: every connected channel shows DISCONNECTED
   * with the close as its reason, each listener told once per channel, so a display does not show
   * values that no longer update as live. A further failed attempt says nothing new (the
   * channels are already DISCONNECTED); the snapshots after the re-attach restore the state.
   * Called after the reconnect is scheduled: a listener that throws is reported as an error and
   * cannot stop the reconnect or the other channels' notices.
   */
  private markLost(reason: string): void {
    for (const sub of [...this.subs]) {
      for (let sid = 0; sid < sub.states.length && !sub.closed; sid++) {
        const next = linkLost(sub.states[sid]!, reason);
        if (next === undefined) continue;
        sub.states[sid] = next;
        try {
          sub.listener(next, ["connection"]);
        } catch (err) {
          this.emit("error", err instanceof PvwireError ? err : new PvwireError(`subscription listener failed: ${String(err)}`));
        }
      }
    }
  }

  private scheduleReconnect(): void {
    if (this.subs.size === 0) {
      this.move("closed");
      return;
    }
    const attempt = this.attempt++;
    const delay = backoffDelay(attempt, this.backoff, this.random);
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
