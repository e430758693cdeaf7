// PvwireClient against an in-process fake server (`ws`), to drive every reconnect/terminal path
// deterministically: shared socket, snapshot + deltas, reconnect on 1012, heartbeat watchdog,
// bad token (no reconnect loop), expired token (re-register), sequence gap; identities: the
// bearer token from getToken, refused tokens per attachment (ERROR), access and writable.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket, { WebSocketServer } from "ws";
import { decode, encode, ProtocolError, PvwireClient, PvwireError, type ChangedField, type ChannelState, type ConnectionState, type Encodable, type History, type WebSocketConstructor } from "../src/index.js";

interface FakeServer {
  url: string;
  connections: number;
  tokens: string[];
  registrations: number;
  /** The subscribe options of each registration. */
  options: unknown[];
  /** Channel ids of each registration, by the token it returned. */
  registered: Map<string, string[]>;
  /** Authorization header of each GraphQL request. */
  authorization: (string | undefined)[];
  /** Access `subscribe` grants, by requested id (default READ). */
  access: Record<string, "READ" | "WRITE">;
  behaviour: (ws: WebSocket, msg: unknown[], ctx: { seq: () => number; att: () => number }) => void;
  heartbeatMs: number;
  wss: WebSocketServer;
  sockets: Set<WebSocket>;
}

const servers: FakeServer[] = [];
const clients: PvwireClient[] = [];
afterEach(async () => {
  for (const c of clients.splice(0)) c.close();
  for (const s of servers.splice(0)) {
    for (const ws of s.sockets) ws.terminate();
    await new Promise((r) => s.wss.close(r));
  }
});

const full = (sid: number, v: number, serial: number): Encodable => [sid, 31, v, serial, 1700000000, 0, 0, 0, "", { units: "mm", precision: 2 }, 1, ""];

function standardAttach(ws: WebSocket, msg: unknown[], ctx: { seq: () => number; att: () => number }): void {
  const [kind, req, token] = msg as [number, number, string];
  if (kind !== 16) return;
  const att = ctx.att();
  ws.send(encode([1, req, att, ["ca://A", "ca://B"]]));
  ws.send(encode([2, ctx.seq(), att, [full(0, 1.5, 1), full(1, 2.5, 1)]]));
  ws.send(encode([3, ctx.seq(), [[att, [[0, 3, token === "tok-2" ? 20 : 10, 3, 1700000001, 5]]]]]));
}

async function fakeServer(behaviour = standardAttach, heartbeatMs = 15000): Promise<FakeServer> {
  const wss = new WebSocketServer({ port: 0, host: "127.0.0.1", handleProtocols: (p) => (p.has("pvwire.v1") ? "pvwire.v1" : false) });
  await new Promise((r) => wss.once("listening", r));
  const port = (wss.address() as { port: number }).port;
  const s: FakeServer = {
    url: `http://127.0.0.1:${port}`, connections: 0, tokens: [], registrations: 0, options: [], registered: new Map(), authorization: [], access: {},
    behaviour, heartbeatMs, wss, sockets: new Set(),
  };
  wss.on("connection", (ws) => {
    s.connections++;
    s.sockets.add(ws);
    let seq = 0;
    let att = 0;
    const ctx = { seq: () => ++seq, att: () => ++att };
    ws.send(encode([0, 1, "fake", 20, s.heartbeatMs, 65536]));
    ws.on("message", (data: Buffer) => {
      const msg = decode(new Uint8Array(data)) as unknown[];
      if (msg[0] === 16) s.tokens.push(msg[2] as string);
      s.behaviour(ws, msg, ctx);
    });
    ws.on("close", () => s.sockets.delete(ws));
  });
  servers.push(s);
  return s;
}

function client(s: FakeServer, extra: Partial<ConstructorParameters<typeof PvwireClient>[1]> = {}): PvwireClient {
  const fetch = async (_url: string, init: { headers: Record<string, string>; body: string }) => {
    const body = JSON.parse(init.body) as { query: string; variables: { ids: string[]; o: unknown } };
    if (!body.query.includes("subscribe")) throw new Error("unexpected query");
    s.options.push(body.variables.o);
    s.authorization.push(init.headers.authorization);
    s.registrations++;
    const token = `tok-${s.registrations}`;
    const ids = body.variables.ids;
    s.registered.set(token, ids);
    const channels = ids.map((id, sid) => ({ sid, id: `ca://${id}`, access: s.access[id] ?? "READ" }));
    return { ok: true, status: 200, json: async () => ({ data: { subscribe: { token, expiresAt: Date.now() / 1000 + 3600, streamPath: "/stream", channels } } }) };
  };
  const c = new PvwireClient(s.url, { WebSocket: WebSocket as unknown as WebSocketConstructor, fetch, backoff: { baseMs: 20, maxMs: 100 }, ...extra });
  clients.push(c);
  return c;
}

// A bound, not a measure: it returns as soon as `cond` holds, and the machine may be busy.
const until = async (cond: () => boolean, ms = 30_000): Promise<void> => {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 10));
  }
};

describe("PvwireClient with a fake server", () => {
  it("applies the snapshot then deltas, with many subscriptions on one socket", async () => {
    const s = await fakeServer();
    const c = client(s);
    const states: ConnectionState[] = [];
    c.on("state", (st) => states.push(st));
    const seen: [ChannelState, readonly ChangedField[]][] = [];
    const sub1 = c.subscribe(["A", "B"], (st, ch) => seen.push([st, ch]));
    const sub2 = c.subscribe(["A", "B"], () => undefined);
    await Promise.all([sub1.ready, sub2.ready]);
    await until(() => seen.length === 3);
    expect(s.connections).toBe(1);
    expect(seen[0]![0]).toMatchObject({ id: "ca://A", sid: 0, value: 1.5, connection: "CONNECTED", metadata: { units: "mm" } });
    expect(seen[0]![1]).toEqual(["value", "time", "alarm", "metadata", "connection"]);
    expect([10, 20]).toContain(seen[2]![0].value);
    expect(seen[2]![0]).toMatchObject({ id: "ca://A", serial: 3, conflated: 1, metadata: { units: "mm" } });
    expect(seen[2]![1]).toEqual(["value", "time"]);
    expect(states).toEqual(["connecting", "connected"]);
    sub1.unsubscribe();
    await until(() => s.tokens.length === 2);
  });

  it("reconnects after 1012 and re-attaches, snapshot making the state whole", async () => {
    const s = await fakeServer();
    const c = client(s);
    const seen: [string, unknown, string][] = [];
    const sub = c.subscribe(["A", "B"], (st) => st.sid === 0 && seen.push([st.connection, st.value, st.reason]));
    await sub.ready;
    await until(() => seen.length === 2);
    for (const ws of s.sockets) ws.close(1012, "restart");
    await until(() => seen.length === 5);
    // Shown DISCONNECTED with its last value while the socket is down, once; then the snapshot.
    expect(seen).toEqual([
      ["CONNECTED", 1.5, ""], ["CONNECTED", 10, ""],
      ["DISCONNECTED", 10, "stream closed: 1012 RESTART (restart)"],
      ["CONNECTED", 1.5, ""], ["CONNECTED", 10, ""],
    ]);
    expect(sub.channels.map((ch) => ch.connection)).toEqual(["CONNECTED", "CONNECTED"]);
    expect(s.connections).toBe(2);
    expect(s.tokens).toEqual(["tok-1", "tok-1"]);
    expect(c.state).toBe("connected");
  });

  it("reconnects after a drain's 4012 within the delay its reason gives, capped at the backoff's cap, without backoff", async () => {
    const s = await fakeServer();
    const c = client(s, { random: () => 0.5 });
    const retries: [number, number][] = [];
    c.on("retry", (delay, attempt, what) => what === "connect" && retries.push([delay, attempt]));
    const sub = c.subscribe(["A", "B"], () => undefined);
    await sub.ready;
    for (const ws of s.sockets) ws.close(4012, "reconnect within 60 ms");
    await until(() => s.connections === 2 && sub.channels.every((ch) => ch.connection === "CONNECTED"));
    for (const ws of s.sockets) ws.close(4012, "reconnect within 90000 ms");
    await until(() => s.connections === 3 && sub.channels.every((ch) => ch.connection === "CONNECTED"));
    // Half of 60 ms, then half of the 100 ms cap (not 90 s); the backoff (base 20 ms) plays no part.
    expect(retries).toEqual([[30, 1], [50, 1]]);
    expect(s.tokens).toEqual(["tok-1", "tok-1", "tok-1"]);
  });

  it("reports a listener that throws on the loss notice as an error, and still tells the other channels and reconnects", async () => {
    const s = await fakeServer();
    const c = client(s);
    const errors: Error[] = [];
    c.on("error", (e) => errors.push(e));
    const lost: number[] = [];
    const sub = c.subscribe(["A", "B"], (st) => {
      if (st.connection !== "DISCONNECTED") return;
      lost.push(st.sid);
      if (st.sid === 0) throw new Error("display broke");
    });
    await sub.ready;
    for (const ws of s.sockets) ws.close(1012, "restart");
    await until(() => s.connections === 2 && sub.channels.every((ch) => ch.connection === "CONNECTED"));
    expect(lost).toEqual([0, 1]);
    expect(errors.map((e) => e.message)).toEqual(["subscription listener failed: Error: display broke"]);
  });

  it("declares a silent connection dead after 2 × heartbeat + 1 s", async () => {
    const s = await fakeServer(standardAttach, 10);
    const c = client(s, { heartbeatTimeoutMs: 150 });
    const sub = c.subscribe(["A", "B"], () => undefined);
    await sub.ready;
    await until(() => s.connections >= 2, 10_000);
  });

  it("reports a bad token as terminal and does not reconnect", async () => {
    const s = await fakeServer((ws, msg) => {
      if (msg[0] === 16) ws.close(4401, "bad signature");
    });
    const c = client(s);
    const errors: unknown[] = [];
    const sub = c.subscribeToken("pvw1.k1.bogus.sig", () => undefined, { onError: (e) => errors.push(e) });
    await expect(sub.ready).rejects.toMatchObject({ code: 4401 });
    await new Promise((r) => setTimeout(r, 300));
    expect(errors).toHaveLength(1);
    expect(s.connections).toBe(1);
    expect(c.state).toBe("disconnected");
  });

  it("re-registers through GraphQL when the token expired", async () => {
    const s = await fakeServer((ws, msg, ctx) => {
      if (msg[0] === 16 && msg[2] === "tok-1") ws.send(encode([5, msg[1] as number, 4402, "expired"]));
      else standardAttach(ws, msg, ctx);
    });
    const c = client(s);
    const values: unknown[] = [];
    const sub = c.subscribe(["A", "B"], (st) => st.sid === 0 && values.push(st.value));
    await sub.ready;
    await until(() => values.includes(20));
    expect(s.registrations).toBe(2);
    expect(s.tokens).toEqual(["tok-1", "tok-2"]);
    expect(s.connections).toBe(1);
  });

  it("re-registers once when a token accepted before is refused (server restarted with a new key)", async () => {
    let connection = 0;
    const s = await fakeServer((ws, msg, ctx) => {
      if (msg[0] === 16 && connection > 1 && msg[2] === "tok-1") ws.send(encode([5, msg[1] as number, 4401, "signature"]));
      else standardAttach(ws, msg, ctx);
    });
    s.wss.on("connection", () => connection++);
    const c = client(s);
    const values: unknown[] = [];
    const sub = c.subscribe(["A", "B"], (st) => st.sid === 0 && values.push(st.value));
    await sub.ready;
    for (const ws of s.sockets) ws.close(1012, "restart");
    await until(() => values.includes(20));
    expect(s.tokens).toEqual(["tok-1", "tok-1", "tok-2"]);
    expect(sub.closed).toBe(false);
  });

  it("closes with 1002 PROTOCOL_ERROR after a malformed message, then reconnects", async () => {
    let first = true;
    const closes: number[] = [];
    const s = await fakeServer((ws, msg, ctx) => {
      standardAttach(ws, msg, ctx);
      if (first) {
        first = false;
        ws.on("close", (code) => closes.push(code));
        ws.send(encode([3, 3, [[1, [[0, 33, 1.5, 9]]]]])); // reserved mask bit
      }
    });
    const c = client(s);
    const errors: Error[] = [];
    c.on("error", (e) => errors.push(e));
    c.subscribe(["A", "B"], () => undefined);
    await until(() => s.connections >= 2 && closes.length === 1);
    expect(closes).toEqual([1002]);
    expect(errors[0]?.message).toMatch(/unknown bits/);
  });

  it("closes with 4000 when an ATTACH gets no answer within requestTimeoutMs, then reconnects", async () => {
    let first = true;
    const closes: number[] = [];
    const s = await fakeServer((ws, msg, ctx) => {
      if (first) {
        first = false; // swallow the first ATTACH
        ws.on("close", (code) => closes.push(code));
        return;
      }
      standardAttach(ws, msg, ctx);
    });
    const c = client(s, { requestTimeoutMs: 200 });
    const sub = c.subscribe(["A", "B"], () => undefined);
    await sub.ready;
    await until(() => closes.length === 1);
    expect(closes).toEqual([4000]);
    expect(s.connections).toBe(2);
  });

  it("rejects a ping without PONG within requestTimeoutMs", async () => {
    const s = await fakeServer(standardAttach);
    const c = client(s, { requestTimeoutMs: 200 });
    const sub = c.subscribe(["A", "B"], () => undefined);
    await sub.ready;
    await expect(c.ping()).rejects.toThrow(/before the PONG/); // the fake server never answers PING
  });

  it("reconnects on a sequence gap", async () => {
    let first = true;
    const s = await fakeServer((ws, msg, ctx) => {
      standardAttach(ws, msg, ctx);
      if (first) {
        first = false;
        ws.send(encode([3, 99, [[1, [[0, 3, 1, 9, 1, 1]]]]]));
      }
    });
    const c = client(s);
    const errors: Error[] = [];
    c.on("error", (e) => errors.push(e));
    c.subscribe(["A", "B"], () => undefined);
    await until(() => s.connections >= 2);
    expect(errors[0]?.message).toMatch(/sequence gap: expected 3, got 99/);
  });

  it("hands the backfill to onHistory before the first state, and not again after a reconnect", async () => {
    // The vector's HISTORY is att 1, sid 0: four rows up to 1700000004.0, the third a gap. This
    // server ignores ATTACH's since and sends it again (PROTOCOL.md section 2.8); the reader had
    // those rows.
    const history = readFileSync(join(import.meta.dirname, "../../../protocol/vectors/history_points.bin"));
    const attaches: unknown[][] = [];
    const s = await fakeServer((ws, msg, ctx) => {
      const [kind, req] = msg as [number, number];
      if (kind !== 16) return;
      attaches.push(msg as unknown[]);
      const att = ctx.att();
      ws.send(encode([1, req, att, ["ca://A"]]));
      ws.send(history);
      ws.send(encode([2, ctx.seq(), att, [[0, 31, 7 * s.connections, s.connections, 1700000004 + s.connections, 0, 0, 0, "", {}, 1, ""]]]));
    });
    const c = client(s);
    const seen: string[] = [];
    const sub = c.subscribe(["A"], (st) => seen.push(`${st.connection} ${String(st.value)}`), {
      backfill: 60,
      onHistory: (sid: number, h: History) => seen.push(`history ${sid} ${Array.from(h.value as Float64Array).join(",")} gap ${Array.from(h.gap).join(",")}`),
    });
    await sub.ready;
    for (const ws of s.sockets) ws.close(1012, "restart");
    await until(() => seen.length === 4);
    expect(seen).toEqual(["history 0 1,2,NaN,0.5 gap 0,0,1,0", "CONNECTED 7", "DISCONNECTED 7", "CONNECTED 14"]);
    expect(s.options).toEqual([{ maxRate: 0, mode: "LATEST", backfill: 60 }]);
    expect(sub.channels[0]).toMatchObject({ serial: 2, conflated: 0 }); // untouched by HISTORY
    // The re-attach said what it held (the snapshot's time); this server sent everything anyway.
    expect(attaches[0]).toHaveLength(3);
    expect(attaches[1]!.slice(3)).toEqual([[1700000005000000000n]]);
  });
});

type Refusal = [number, string] | undefined;

/** A fake stream that attaches each token to its registration's ids (sid 0's first value is the
 * attachment number) unless `refuse(token)` answers [code, message]; `live` sends more. */
function attaching(server: () => FakeServer, refuse: (token: string) => Refusal = () => undefined) {
  const live = {
    ws: undefined as WebSocket | undefined,
    seq: () => 0,
    atts: new Map<string, number>(),
    send(m: unknown[]): void { live.ws!.send(encode(m as Encodable)); },
  };
  const behaviour = (ws: WebSocket, msg: unknown[], ctx: { seq: () => number; att: () => number }): void => {
    live.ws = ws;
    live.seq = ctx.seq;
    if (msg[0] === 17) return void ws.send(encode([4, msg[1] as number, msg[2] as number]));
    if (msg[0] !== 16) return;
    const [, req, token] = msg as [number, number, string];
    const refusal = refuse(token);
    if (refusal) return void ws.send(encode([5, req, ...refusal]));
    const att = ctx.att();
    const ids = server().registered.get(token)!.map((i) => `ca://${i}`);
    live.atts.set(ids[0]!, att);
    ws.send(encode([1, req, att, ids]));
    ws.send(encode([2, ctx.seq(), att, ids.map((_, sid) => full(sid, att, 1))]));
  };
  return { live, behaviour };
}

async function identityServer(refuse?: (token: string) => Refusal) {
  let s: FakeServer | undefined;
  const { live, behaviour } = attaching(() => s!, refuse);
  s = await fakeServer(behaviour);
  return { s, live };
}

describe("PvwireClient with identities", () => {
  it("re-registers a refused token once, on the same socket, and the other subscription does not notice", async () => {
    const { s, live } = await identityServer((t) => (t === "tok-2" ? [4402, "token expired"] : undefined));
    const c = client(s);
    const states: ConnectionState[] = [];
    c.on("state", (st) => states.push(st));
    const a: unknown[] = [];
    const subA = c.subscribe(["X"], (st) => a.push(st.value));
    await subA.ready;
    const subB = c.subscribe(["Y"], () => undefined);
    await subB.ready;
    expect(subB.channels[0]).toMatchObject({ id: "ca://Y", value: 2 });
    expect(s.tokens).toEqual(["tok-1", "tok-2", "tok-3"]);
    expect(s.connections).toBe(1);
    live.send([3, live.seq(), [[live.atts.get("ca://X")!, [[0, 1, 42, 2]]]]]);
    await until(() => a.includes(42));
    expect(states).toEqual(["connecting", "connected"]);
  });

  it("ends only the subscription whose fresh token is refused again", async () => {
    const { s, live } = await identityServer((t) => (t !== "tok-1" ? [4401, "bad signature"] : undefined));
    const c = client(s);
    const clientErrors: unknown[] = [];
    c.on("error", (e) => clientErrors.push(e));
    const a: unknown[] = [];
    await c.subscribe(["X"], (st) => a.push(st.value)).ready;
    const errors: PvwireError[] = [];
    const subB = c.subscribe(["Y"], () => undefined, { onError: (e) => errors.push(e) });
    await expect(subB.ready).rejects.toMatchObject({ code: 4401 });
    expect(errors).toHaveLength(1);
    expect(errors[0]!.message).toMatch(/4401 BAD_TOKEN: bad signature/);
    expect(subB.closed).toBe(true);
    expect(s.tokens).toEqual(["tok-1", "tok-2", "tok-3"]); // one re-registration, no loop
    live.send([3, live.seq(), [[live.atts.get("ca://X")!, [[0, 1, 7, 2]]]]]);
    await until(() => a.includes(7));
    expect(c.state).toBe("connected");
    expect(s.connections).toBe(1);
    expect(clientErrors).toEqual([]);
  });

  it("ends a subscription refused with 4403 without registering again", async () => {
    const { s } = await identityServer(() => [4403, "ca://X: not readable by bob"]);
    const c = client(s);
    const sub = c.subscribe(["X"], () => undefined, { onError: () => undefined });
    await expect(sub.ready).rejects.toMatchObject({ code: 4403, message: expect.stringMatching(/4403 FORBIDDEN: ca:\/\/X: not readable by bob/) });
    expect(s.registrations).toBe(1);
  });

  it("reports an attachment the server ended with the ERROR that named its channel", async () => {
    const { s, live } = await identityServer();
    const c = client(s);
    const clientErrors: unknown[] = [];
    c.on("error", (e) => clientErrors.push(e));
    const a: unknown[] = [];
    await c.subscribe(["X"], (st) => a.push(st.value)).ready;
    const errors: PvwireError[] = [];
    const subY = c.subscribe(["Y"], () => undefined, { onError: (e) => errors.push(e) });
    await subY.ready;
    live.send([5, null, 4403, "ca://Y: no longer readable by bob"]);
    live.send([4, null, live.atts.get("ca://Y")!]);
    await until(() => errors.length === 1);
    expect(errors[0]).toMatchObject({ code: 4403, message: expect.stringMatching(/ca:\/\/Y: no longer readable/) });
    expect(subY.closed).toBe(true);
    live.send([3, live.seq(), [[live.atts.get("ca://X")!, [[0, 1, 9, 2]]]]]);
    await until(() => a.includes(9));
    expect(clientErrors).toEqual([]); // reported once, to the subscription
  });

  it("ends only a subscription whose ATTACHED names other channels than it registered, and detaches it", async () => {
    const detached: number[] = [];
    let s: FakeServer | undefined;
    const { live, behaviour } = attaching(() => s!);
    s = await fakeServer((ws, msg, ctx) => {
      if (msg[0] === 17) detached.push(msg[2] as number);
      if (msg[0] === 16 && msg[2] === "tok-2") { // registered as [ca://Y, ca://Z]
        const att = ctx.att();
        ws.send(encode([1, msg[1] as number, att, ["ca://Z", "ca://Y"]]));
        ws.send(encode([2, ctx.seq(), att, [full(0, 1, 1), full(1, 2, 1)]]));
        return;
      }
      behaviour(ws, msg, ctx);
    });
    const c = client(s);
    const clientErrors: unknown[] = [];
    c.on("error", (e) => clientErrors.push(e));
    const a: unknown[] = [];
    await c.subscribe(["X"], (st) => a.push(st.value)).ready;
    const errors: PvwireError[] = [];
    const seenB: ChannelState[] = [];
    const subB = c.subscribe(["Y", "Z"], (st) => seenB.push(st), { onError: (e) => errors.push(e) });
    await expect(subB.ready).rejects.toBeInstanceOf(ProtocolError);
    expect(errors[0]!.message).toMatch(/ATTACHED ids \["ca:\/\/Z","ca:\/\/Y"\] differ/);
    await until(() => detached.length === 1);
    expect(seenB).toEqual([]); // no value shown under another channel's name
    live.send([3, live.seq(), [[live.atts.get("ca://X")!, [[0, 1, 9, 2]]]]]);
    await until(() => a.includes(9));
    expect(s.connections).toBe(1);
    expect(clientErrors).toEqual([]);
  });

  it("reports an ERROR without req that explains no DETACHED as a stream error, and ends nothing", async () => {
    const { s, live } = await identityServer();
    const c = client(s);
    const clientErrors: PvwireError[] = [];
    c.on("error", (e) => clientErrors.push(e));
    const a: unknown[] = [];
    const sub = c.subscribe(["X"], (st) => a.push(st.value));
    await sub.ready;
    live.send([5, null, 4400, "a message must be an array"]);
    live.send([3, live.seq(), [[live.atts.get("ca://X")!, [[0, 1, 9, 2]]]]]);
    await until(() => a.includes(9));
    expect(clientErrors.map((e) => e.code)).toEqual([4400]);
    expect(sub.closed).toBe(false);
  });

  it("asks getToken before every registration and sends it as a bearer token", async () => {
    const { s } = await identityServer((t) => (t === "tok-1" ? [4402, "expired"] : undefined));
    let n = 0;
    const c = client(s, { getToken: () => `jwt-${++n}` });
    await c.subscribe(["X"], () => undefined).ready;
    expect(s.authorization).toEqual(["Bearer jwt-1", "Bearer jwt-2"]);
  });

  it("accepts an async getToken; undefined is anonymous", async () => {
    const { s } = await identityServer();
    const c = client(s, { getToken: async () => undefined });
    await c.subscribe(["X"], () => undefined).ready;
    const withToken = client(s, { getToken: async () => "jwt-async" });
    await withToken.subscribe(["X"], () => undefined).ready;
    expect(s.authorization).toEqual([undefined, "Bearer jwt-async"]);
  });

  it("fails the subscription when getToken throws", async () => {
    const { s } = await identityServer();
    const c = client(s, { getToken: () => { throw new Error("identity provider unreachable"); } });
    const sub = c.subscribe(["X"], () => undefined, { onError: () => undefined });
    await expect(sub.ready).rejects.toMatchObject({ code: "TOKEN", message: expect.stringMatching(/identity provider unreachable/) });
    expect(s.registrations).toBe(0);
  });

  it("puts the access from subscribe on the channel state, writable combining it with the upstream's", async () => {
    const { s, live } = await identityServer();
    s.access = { W: "WRITE" };
    const c = client(s);
    const seen: ChannelState[] = [];
    const sub = c.subscribe(["W", "R"], (st) => seen.push(st));
    await sub.ready;
    expect(sub.channels.map((st) => [st.access, st.writable])).toEqual([["WRITE", true], ["READ", false]]);
    // The IOC refuses writes (e.g. its access security): not writable whatever the rules say.
    live.send([3, live.seq(), [[live.atts.get("ca://W")!, [[0, 8, { writable: false }]]]]]);
    await until(() => seen.length === 3);
    expect(seen[2]).toMatchObject({ id: "ca://W", access: "WRITE", writable: false });
  });
});
