// PvwireClient against an in-process fake server (`ws`), to drive every reconnect/terminal path
// deterministically: shared socket, snapshot + deltas, reconnect on 1012, heartbeat watchdog,
// bad token (no reconnect loop), expired token (re-register), sequence gap.
import { afterEach, describe, expect, it } from "vitest";
import WebSocket, { WebSocketServer } from "ws";
import { decode, encode, PvwireClient, type ChangedField, type ChannelState, type ConnectionState, type Encodable, type WebSocketConstructor } from "../src/index.js";

interface FakeServer {
  url: string;
  connections: number;
  tokens: string[];
  registrations: number;
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
  const s: FakeServer = { url: `http://127.0.0.1:${port}`, connections: 0, tokens: [], registrations: 0, behaviour, heartbeatMs, wss, sockets: new Set() };
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
  const fetch = async (_url: string, init: { body: string }) => {
    const body = JSON.parse(init.body) as { query: string };
    if (!body.query.includes("subscribe")) throw new Error("unexpected query");
    s.registrations++;
    return { ok: true, status: 200, json: async () => ({ data: { subscribe: { token: `tok-${s.registrations}`, expiresAt: Date.now() / 1000 + 3600, streamPath: "/stream", channels: [] } } }) };
  };
  const c = new PvwireClient(s.url, { WebSocket: WebSocket as unknown as WebSocketConstructor, fetch, backoff: { baseMs: 20, maxMs: 100 }, ...extra });
  clients.push(c);
  return c;
}

const until = async (cond: () => boolean, ms = 3000): Promise<void> => {
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
    const values: unknown[] = [];
    const sub = c.subscribe(["A", "B"], (st) => st.sid === 0 && values.push(st.value));
    await sub.ready;
    await until(() => values.length === 2);
    for (const ws of s.sockets) ws.close(1012, "restart");
    await until(() => values.length === 4);
    expect(s.connections).toBe(2);
    expect(s.tokens).toEqual(["tok-1", "tok-1"]);
    expect(c.state).toBe("connected");
  });

  it("declares a silent connection dead after 2 × heartbeat + 1 s", async () => {
    const s = await fakeServer(standardAttach, 10);
    const c = client(s, { heartbeatTimeoutMs: 150 });
    const sub = c.subscribe(["A"], () => undefined);
    await sub.ready;
    await until(() => s.connections >= 2, 3000);
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
      if (msg[0] === 16 && msg[2] === "tok-1") ws.close(4402, "expired");
      else standardAttach(ws, msg, ctx);
    });
    const c = client(s);
    const values: unknown[] = [];
    const sub = c.subscribe(["A", "B"], (st) => st.sid === 0 && values.push(st.value));
    await sub.ready;
    await until(() => values.includes(20));
    expect(s.registrations).toBe(2);
    expect(s.tokens).toEqual(["tok-1", "tok-2"]);
  });

  it("re-registers once when a token accepted before is refused (server restarted with a new key)", async () => {
    let connection = 0;
    const s = await fakeServer((ws, msg, ctx) => {
      if (msg[0] === 16 && connection > 1 && msg[2] === "tok-1") ws.close(4401, "signature");
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
    c.subscribe(["A"], () => undefined);
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
    const sub = c.subscribe(["A"], () => undefined);
    await sub.ready;
    await until(() => closes.length === 1);
    expect(closes).toEqual([4000]);
    expect(s.connections).toBe(2);
  });

  it("rejects a ping without PONG within requestTimeoutMs", async () => {
    const s = await fakeServer(standardAttach);
    const c = client(s, { requestTimeoutMs: 200 });
    const sub = c.subscribe(["A"], () => undefined);
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
    c.subscribe(["A"], () => undefined);
    await until(() => s.connections >= 2);
    expect(errors[0]?.message).toMatch(/sequence gap: expected 3, got 99/);
  });
});
