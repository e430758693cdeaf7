// The client against the real server and a real IOC (test/launch_stack.py): subscribe, get, put,
// metadata, waveform, enum, alarm, IOC disconnect, server restart, bad token.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { PvwireClient, type ChannelState, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

const skip = stackUnavailable();
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`integration tests cannot run: ${skip}`);

describe("against the real server and demo IOC", () => {
  let stack: Stack;
  let client: PvwireClient;
  const pv = (name: string) => `ca://${stack.prefix}${name}`;

  beforeAll(async () => {
    stack = await startStack();
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor, backoff: { baseMs: 100, maxMs: 1000 } });
    if (process.env.PVWIRE_DEBUG) { client.on("state", (s) => console.log("state", s)); client.on("error", (e) => console.log("error", e)); }
  });
  afterAll(async () => {
    client?.close();
    await stack?.stop();
  });

  it("gets a channel with metadata", async () => {
    const ch = await client.get(pv("SP"));
    expect(ch.connection).toBe("CONNECTED");
    expect(ch.metadata.units).toBe("mm");
    expect(ch.metadata.precision).toBe(3);
    expect(ch.metadata.writable).toBe(true);
    const many = await client.get([pv("SINE"), "ca://NO:SUCH:PV"], 1);
    expect(many[0]!.error).toBeNull();
    expect(many[1]!.errorCode).toBeTruthy();
  });

  it("searches the demo channels", async () => {
    const ids = await client.search(`*${stack.prefix}*`);
    expect(Array.isArray(ids)).toBe(true);
  });

  it("streams a counter: snapshot first, then increasing values on one socket", async () => {
    const seen: ChannelState[] = [];
    const sub = client.subscribe([pv("COUNTER"), pv("SINE")], (st) => seen.push(st));
    await sub.ready;
    expect(seen[0]).toMatchObject({ id: pv("COUNTER"), sid: 0 }); // snapshot first
    await until(() => sub.channels[0]?.connection === "CONNECTED", 5000, "COUNTER connected");
    expect(sub.channels[0]!.metadata.units).toBe("counts");
    const start = sub.channels[0]!.value as number;
    await until(() => (sub.channels[0]!.value as number) >= start + 3, 5000, "counter to advance");
    const sub2 = client.subscribe([pv("SINE")], () => undefined);
    await sub2.ready;
    expect(client.stats.connects).toBe(1);
    sub.unsubscribe();
    sub2.unsubscribe();
  });

  it("puts and reads back; the stream sees the readback follow", async () => {
    const sub = client.subscribe([pv("RBV")], () => undefined);
    await sub.ready;
    await until(() => sub.channels[0]?.connection === "CONNECTED", 5000, "RBV connected");
    const target = Math.round(Math.random() * 50 * 1000) / 1000 + 10;
    await client.put(pv("SP"), target, { wait: true });
    expect((await client.get(pv("SP"))).value).toBeCloseTo(target, 3);
    await until(() => Math.abs((sub.channels[0]!.value as number) - target) < 1e-3, 30_000, "RBV to reach SP");
    sub.unsubscribe();
  });

  it("streams the waveform as a Float64Array, and enum and string channels", async () => {
    const sub = client.subscribe([pv("WAVEFORM"), pv("MODE"), pv("MESSAGE")], () => undefined);
    await sub.ready;
    await until(() => sub.channels[0]!.value instanceof Float64Array && sub.channels[1]!.metadata.choices !== undefined, 5000, "waveform");
    expect(sub.channels[0]!.metadata.count).toBeGreaterThan(1);
    expect(sub.channels[1]!.metadata.choices).toContain("Off");
    expect(typeof sub.channels[1]!.value).toBe("number");
    await client.put(pv("MESSAGE"), "hello from ts", { wait: true });
    await until(() => sub.channels[2]!.value === "hello from ts", 5000, "string update");
    sub.unsubscribe();
  });

  it("carries alarm severity", async () => {
    const sub = client.subscribe([pv("NOISE")], () => undefined);
    await sub.ready;
    await until(() => sub.channels[0]?.alarm !== undefined && sub.channels[0].metadata.alarm !== undefined, 5000, "NOISE alarm");
    const st = sub.channels[0]!;
    expect(st.alarm?.severity).toMatch(/NO_ALARM|MINOR|MAJOR|INVALID/);
    expect(st.metadata.alarm?.[1]).toBe(80);
    sub.unsubscribe();
  });

  // A channel's first value carries its alarm, even NO_ALARM: cold and warm subscribers agree.
  it("knows a healthy PVA channel's alarm as soon as it has a value, in a cold and a warm subscription", async () => {
    for (const name of ["RBV", "RBV"]) { // the second subscription finds the channel already open
      const seen: ChannelState[] = [];
      const sub = client.subscribe([`pva://${stack.prefix}${name}`], (st) => seen.push(st));
      await sub.ready;
      await until(() => seen.some((st) => st.value !== undefined && st.value !== null), 30_000, `pva ${name} value`);
      const first = seen.find((st) => st.value !== undefined && st.value !== null)!;
      expect(first.alarm).toEqual({ severity: "NO_ALARM", status: 0, message: expect.any(String) as string });
      sub.unsubscribe();
    }
  });

  // The rules grant WRITE (subscribe's access); PVA cannot tell whether the upstream would
  // accept, so the stream's metadata says `writable` as the rules do (PROTOCOL.md section 5).
  it("says a PVA setpoint the rules allow is writable, and the put succeeds", async () => {
    const sub = client.subscribe([`pva://${stack.prefix}SP`], () => undefined);
    await sub.ready;
    await until(() => sub.channels[0]?.metadata.units !== undefined, 30_000, "pva SP metadata");
    expect(sub.channels[0]!.access).toBe("WRITE");
    expect(sub.channels[0]!.metadata.writable).toBe(true);
    expect(sub.channels[0]!.writable).toBe(true);
    await client.put(`pva://${stack.prefix}SP`, 7.25, { wait: true });
    await until(() => sub.channels[0]!.value === 7.25, 30_000, "pva SP to follow the put");
    sub.unsubscribe();
  });

  // The server sends connection state 4 NOT_FOUND after its search time (not_found_s).
  it("reports a PV no IOC serves as NOT_FOUND with a reason, and keeps the subscription", async () => {
    const sub = client.subscribe([pv("NOPE")], () => undefined);
    await sub.ready;
    await until(() => sub.channels[0]?.connection === "NOT_FOUND", 30_000, "NOT_FOUND");
    expect(sub.channels[0]!.reason).toMatch(/not found/);
    expect(sub.closed).toBe(false);
    sub.unsubscribe();
  });

  it("refuses a bad token for its subscription only: the socket and the others go on", async () => {
    const c = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor, backoff: { baseMs: 10, maxMs: 50 } });
    const good: unknown[] = [];
    await c.subscribe([pv("COUNTER")], (st) => good.push(st.value)).ready;
    const errors: Error[] = [];
    // A token obtained elsewhere cannot be re-registered: the ERROR 4401 ends it at once.
    const sub = c.subscribeToken("pvw1.k1.e30.bogus", () => undefined, { onError: (e) => errors.push(e) });
    await expect(sub.ready).rejects.toMatchObject({ code: 4401 });
    const before = good.length;
    await until(() => good.length > before + 2, 30_000, "COUNTER updates after the refusal");
    expect(c.stats.connects).toBe(1);
    expect(c.state).toBe("connected");
    expect(errors).toHaveLength(1);
    c.close();
  });

  it("shows an IOC going away as DISCONNECTED and back as CONNECTED", async () => {
    const sub = client.subscribe([pv("COUNTER")], () => undefined);
    await sub.ready;
    await until(() => sub.channels[0]?.connection === "CONNECTED", 5000, "COUNTER connected");
    await stack.command("kill-ioc");
    await until(() => sub.channels[0]!.connection === "DISCONNECTED", 30_000, "DISCONNECTED");
    expect(sub.channels[0]!.value).not.toBeUndefined(); // keeps its last value
    await stack.command("start-ioc");
    await until(() => sub.channels[0]!.connection === "CONNECTED", 20_000, "CONNECTED again");
    sub.unsubscribe();
  });

  it("resumes by itself after a server restart", async () => {
    const states: string[] = [];
    const off = client.on("state", (s) => states.push(s));
    const sub = client.subscribe([pv("COUNTER")], () => undefined);
    await sub.ready;
    await stack.command("restart-server");
    await until(() => states.includes("connecting") && client.state === "connected", 20_000, "reconnect");
    const v = sub.channels[0]!.value as number;
    await until(() => (sub.channels[0]!.value as number) !== v, 30_000, "fresh data after restart");
    off();
    sub.unsubscribe();
  });
});
