// Faults under load (test/launch_stack.py: demo IOC + real server, private ports): the IOC killed
// and restarted, the IOC frozen (SIGSTOP) past CA's echo timeout then resumed, the server
// SIGKILLed and restarted on the same port with its default random token key (old tokens are
// refused with 4401 and the client re-registers). The client resumes each time with a full
// snapshot and no action from the application; while the server is down every channel shows
// DISCONNECTED with its last value. Recovery times are printed for the report; only
// generous bounds are asserted.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { PvwireClient, type ChannelState, type Subscription, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

const skip = stackUnavailable();
if (skip) throw new Error(`fault tests cannot run: ${skip}`);

// 5 s instead of 30 s: a frozen IOC is declared unresponsive after ~5 s + libca's 5 s echo wait.
const FAULT_ENV = { EPICS_CA_CONN_TMO: "5", EPICS_PVA_CONN_TMO: "5" };
const BOUND_MS = 60_000;

interface Seen { t: number; connection: string; value: unknown }

describe("fault recovery against the real server and demo IOC", () => {
  let stack: Stack;
  let client: PvwireClient;
  let sub: Subscription;
  let ids: string[];
  const history = new Map<string, Seen[]>();

  const latest = (id: string): ChannelState => sub.channels.find((c) => c.id === id)!;
  /** Connected now, with `n` connected values that arrived after `mark`. */
  const freshSince = (id: string, mark: number, n = 3): boolean => {
    const h = (history.get(id) ?? []).filter((s) => s.t > mark);
    return h.length > 0 && h.at(-1)!.connection === "CONNECTED" && h.filter((s) => s.connection === "CONNECTED" && s.value != null).length >= n;
  };
  const firstFresh = (id: string, mark: number): number =>
    (history.get(id) ?? []).find((s) => s.t > mark && s.connection === "CONNECTED" && s.value != null)!.t;
  const firstState = (id: string, state: string, mark: number): number =>
    (history.get(id) ?? []).find((s) => s.t > mark && s.connection === state)!.t;
  const complete = (id: string): boolean => {
    const s = latest(id);
    return s?.connection === "CONNECTED" && s.value != null && s.time !== undefined && s.metadata.units !== undefined;
  };
  const report = (name: string, ms: number): void => console.log(`recovery ${name}: ${(ms / 1000).toFixed(2)} s`);

  beforeAll(async () => {
    stack = await startStack([], FAULT_ENV);
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
    ids = [`ca://${stack.prefix}COUNTER`, `pva://${stack.prefix}COUNTER`, `ca://${stack.prefix}WAVEFORM`, "sim://counter?rate=50"];
    sub = client.subscribe(ids, (st) => {
      const h = history.get(st.id) ?? [];
      h.push({ t: Date.now(), connection: st.connection, value: st.value });
      history.set(st.id, h);
    });
    await sub.ready;
    await until(() => ids.slice(0, 3).every(complete), 20_000, "every channel complete");
  });
  afterAll(async () => {
    client?.close();
    await stack?.stop();
  });

  const [CA, PVA] = [0, 1];

  it("resumes after the IOC is killed and restarted", async () => {
    const killed = Date.now();
    await stack.command("kill-ioc");
    await until(() => latest(ids[CA]!).connection === "DISCONNECTED" && latest(ids[PVA]!).connection === "DISCONNECTED", BOUND_MS, "DISCONNECTED");
    report("ioc kill to DISCONNECTED (ca)", firstState(ids[CA]!, "DISCONNECTED", killed) - killed);
    // The IOC's absence touches nothing else: the sim counter keeps streaming.
    const mark = Date.now();
    await until(() => freshSince(ids[3]!, mark, 10), 30_000, "sim values while the IOC is down");
    await stack.command("start-ioc");
    const up = Date.now();
    await until(() => freshSince(ids[CA]!, up) && freshSince(ids[PVA]!, up), BOUND_MS, "CA and PVA resumed");
    report("ioc restart ca", firstFresh(ids[CA]!, up) - up);
    report("ioc restart pva", firstFresh(ids[PVA]!, up) - up);
    await until(() => ids.every(complete), BOUND_MS, "every channel complete");
  }, 3 * BOUND_MS);

  it("resumes after the IOC is frozen past the echo timeout", async () => {
    const before = latest(ids[CA]!).value as number;
    const frozen = Date.now();
    await stack.command("freeze-ioc");
    try {
      await until(() => latest(ids[CA]!).connection === "DISCONNECTED" && latest(ids[PVA]!).connection === "DISCONNECTED", BOUND_MS, "DISCONNECTED while frozen");
      report("freeze to DISCONNECTED ca", firstState(ids[CA]!, "DISCONNECTED", frozen) - frozen);
      report("freeze to DISCONNECTED pva", firstState(ids[PVA]!, "DISCONNECTED", frozen) - frozen);
    } finally {
      await stack.command("resume-ioc");
    }
    const resumed = Date.now();
    await until(() => freshSince(ids[CA]!, resumed) && freshSince(ids[PVA]!, resumed), BOUND_MS, "CA and PVA resumed");
    report("resume ca", firstFresh(ids[CA]!, resumed) - resumed);
    report("resume pva", firstFresh(ids[PVA]!, resumed) - resumed);
    expect(latest(ids[CA]!).value as number).toBeGreaterThan(before); // the same IOC counts on
    await until(() => ids.every(complete), BOUND_MS, "every channel complete");
  }, 3 * BOUND_MS);

  it("resumes after the server is SIGKILLed and restarted with a new random token key", async () => {
    const errors: Error[] = [];
    const off = client.on("error", (e) => errors.push(e));
    const connectsBefore = client.stats.connects;
    const killed = Date.now();
    await stack.command("kill-server"); // returns once the new server answers
    const up = Date.now();
    // A snapshot of every channel arrives after the re-attach: each one is reported afresh.
    await until(() => client.state === "connected" && ids.every((id) => freshSince(id, up, 1) && complete(id)), BOUND_MS, "every channel after the restart");
    const done = Math.max(...ids.map((id) => firstFresh(id, up)));
    report("server kill, from new server up", done - up);
    report("server kill, from kill", done - killed);
    // Between the kill (1006, no close frame) and the snapshot every channel showed DISCONNECTED,
    // its last value kept.
    for (const id of ids) {
      const h = history.get(id)!;
      const i = h.findIndex((s) => s.t >= killed && s.connection === "DISCONNECTED");
      expect(i).toBeGreaterThan(0);
      expect(h[i]!.value).toEqual(h[i - 1]!.value);
      expect(h.slice(i + 1).some((s) => s.connection === "CONNECTED")).toBe(true);
    }
    const mark = Date.now();
    await until(() => freshSince(ids[CA]!, mark, 3), 30_000, "counter advancing");
    expect(client.stats.connects).toBeGreaterThan(connectsBefore);
    expect(errors).toEqual([]);
    expect(latest(ids[2]!).value).toBeInstanceOf(Float64Array);
    off();
  }, 3 * BOUND_MS);

  it("shows every channel DISCONNECTED, value kept, while the server is down, and restores them from the snapshot after the restart", async () => {
    const c = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
    const seen = new Map<string, { t: number; state: ChannelState; changed: readonly string[] }[]>();
    const s = c.subscribe(ids, (st, changed) => {
      const h = seen.get(st.id) ?? [];
      h.push({ t: Date.now(), state: st, changed });
      seen.set(st.id, h);
    });
    let attempts = 0;
    c.on("retry", (_ms, _attempt, what) => { if (what === "connect") attempts++; });
    const now = (id: string): ChannelState | undefined => s.channels.find((ch) => ch.id === id);
    const live = (id: string): boolean => now(id)?.connection === "CONNECTED" && now(id)?.value != null;
    try {
      await s.ready;
      await until(() => ids.every(live), BOUND_MS, "every channel connected with a value");
      const stopping = Date.now();
      await stack.command("stop-server"); // 4012 (a drain without delay), then down until start-server
      await until(() => ids.every((id) => now(id)?.connection === "DISCONNECTED"), BOUND_MS, "every channel DISCONNECTED");
      expect(c.state).toBe("connecting");
      // Several failed attempts while the server is down say nothing new: one notice per channel.
      await until(() => attempts >= 3, BOUND_MS, "three reconnect attempts");
      for (const id of ids) {
        const after = seen.get(id)!.filter((u) => u.t >= stopping && u.state.connection !== "CONNECTED");
        expect(after).toHaveLength(1);
        const [lost] = after;
        expect(lost!.changed).toEqual(["connection"]);
        expect(lost!.state.connection).toBe("DISCONNECTED");
        expect(lost!.state.reason).toMatch(/^stream closed: \d+ [A-Z_]+/);
        // The last value stays, shown as stale: the update before the notice carried it.
        const before = seen.get(id)!.at(-2)!.state;
        expect(before.connection).toBe("CONNECTED");
        expect(lost!.state.value).toEqual(before.value);
        expect(lost!.state.time).toEqual(before.time);
        expect(now(id)).toBe(lost!.state);
      }
      const stale = now(ids[CA]!)!.value as number;
      await stack.command("start-server");
      const up = Date.now();
      await until(() => c.state === "connected" && ids.every((id) => live(id) && seen.get(id)!.some((u) => u.t >= up && u.state.connection === "CONNECTED")), BOUND_MS, "every channel CONNECTED after the restart");
      for (const id of ids) expect(now(id)!.reason).toBe("");
      // Fresh values, not the stale ones: the IOC counted on while the server was down.
      await until(() => (now(ids[CA]!)!.value as number) > stale, BOUND_MS, "the CA counter past its stale value");
    } finally {
      c.close();
    }
  }, 4 * BOUND_MS);

  it("retries every few seconds through a long server outage and starts again from the base delay after a HELLO", async () => {
    // random() = 1: every delay is the whole backoff window, so the schedule is exact.
    const c = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor, random: () => 1 });
    const delays: number[] = [];
    c.on("retry", (ms, _attempt, what) => { if (what === "connect") delays.push(ms); });
    const values: number[] = [];
    const s = c.subscribe(["sim://counter?rate=10"], (st) => { if (st.connection === "CONNECTED" && st.value != null) values.push(Date.now()); });
    try {
      await s.ready;
      await stack.command("stop-server"); // 4012 (a drain without delay), then down
      await until(() => delays.length >= 7, BOUND_MS, "seven reconnect attempts");
      // The drain's close first: within its reason's 1,000 ms (all closed at once), no backoff.
      // Then doubling from 0.5 s, capped at 5 s (it grew to 30 s before: up to 17.7 s away
      // after a 30 s outage).
      expect(delays.slice(0, 2)).toEqual([1_000, 500]);
      expect(Math.max(...delays)).toBe(5_000);
      expect(delays.slice(-2)).toEqual([5_000, 5_000]);
      await stack.command("start-server");
      const up = Date.now();
      await until(() => c.state === "connected" && values.some((t) => t > up), BOUND_MS, "values after the restart");
      report("server down 6 retries, from up to first value", values.find((t) => t > up)! - up);
      // The HELLO restarted the count: the next outage's first retry is within 0.5 s again.
      delays.length = 0;
      await stack.command("kill-server"); // SIGKILL, a new server on the same port, a new key
      const again = Date.now();
      await until(() => values.some((t) => t > again), BOUND_MS, "values after the kill");
      expect(delays[0]).toBe(500);
    } finally {
      c.close();
    }
  }, 3 * BOUND_MS);

  it("registers again through an outage that begins as it re-registers, and resumes when the server is back", async () => {
    let stopOnAsk = false;
    const c = new PvwireClient(stack.url, {
      WebSocket: WebSocket as unknown as WebSocketConstructor,
      // Asked before each registration: the server goes down just as the client registers again.
      getToken: async () => {
        if (stopOnAsk) {
          stopOnAsk = false;
          await stack.command("stop-server");
        }
        return undefined;
      },
    });
    const retries: number[] = [];
    c.on("retry", (_ms, attempt, what) => { if (what === "register") retries.push(attempt); });
    const errors: Error[] = [];
    c.on("error", (e) => errors.push(e));
    const values: number[] = [];
    const s = c.subscribe(["sim://counter?rate=10"], (st) => { if (st.connection === "CONNECTED" && st.value != null) values.push(Date.now()); });
    try {
      await s.ready;
      stopOnAsk = true;
      await stack.command("kill-server"); // a new key: the old token is refused with 4401
      await until(() => retries.length >= 3, BOUND_MS, "three retries to register again");
      expect(s.closed).toBe(false);
      expect(c.state).toBe("connecting"); // the socket is down too, and says so
      await stack.command("start-server");
      const up = Date.now();
      await until(() => values.some((t) => t > up), BOUND_MS, "values after the server is back");
      report("re-registration through an outage, from up to first value", values.find((t) => t > up)! - up);
      expect(errors).toEqual([]);
    } finally {
      c.close();
    }
  }, 3 * BOUND_MS);
});
