// The pvws browser client pvwire serves at /pvws/js/pvws.js (with /pvws/js/base64.js), used in
// headless Chromium the way dbwr's view page uses it: a page on another origin (dbwr with
// PVWS_HOST set) loads both scripts from the pvwire server with plain <script> tags, constructs
// `PVWS(url, connect_handler, message_handler)`, opens it, subscribes when connected (again after
// every reconnect, as dbwr re-initialises its widgets), writes, clears, and closes the socket (dbwr's
// status icon). A real IOC PV (the demo IOC), a sim PV and a local PV.
import { createServer, type Server } from "node:http";
import { type AddressInfo } from "node:net";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { existsSync } from "node:fs";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`);
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`pvws.js tests cannot run: ${skip}`);

const P = "PVWIRE:DEMO:";
const IOC_PV = `ca://${P}COUNTER`;
const SETPOINT = `pva://${P}SP`;
const SIM_PV = "sim://ramp?min=0&max=1000&step=1&rate=20";
const LOCAL_PV = "loc://pvwsjs_text(\"hello\")";
const PVS = [IOC_PV, SETPOINT, SIM_PV, LOCAL_PV];

/** dbwr's view page, reduced to its use of pvws: scripts from the pvws server, then PVWS. */
function page(pvwsHost: string): string {
  return `<!doctype html><html><head><meta charset="utf-8"><title>pvws.js</title>
<script type="text/javascript" src="http://${pvwsHost}/pvws/js/base64.js"></script>
<script type="text/javascript" src="http://${pvwsHost}/pvws/js/pvws.js?V=12345"></script>
</head><body><pre id="log"></pre><script type="text/javascript">
const pvs = new URLSearchParams(location.search).get("pvs").split(",");
window.events = [];       // every connect_handler call and message, in order
window.connections = 0;   // connect_handler(true) calls
window.latest = {};       // PV name -> last merged update
window.pvws = new PVWS("ws://${pvwsHost}/pvws/pv",
  connected => {
    window.events.push({ connected });
    if (connected) {
      window.connections += 1;
      window.pvws.subscribe(pvs);  // dbwr subscribes each widget's PV once connected
    }
  },
  message => {
    window.events.push(JSON.parse(JSON.stringify(message)));
    // Tagged with the connection it came on: a reconnect must bring every PV again.
    if (message.type === "update") window.latest[message.pv] = { ...JSON.parse(JSON.stringify(message)), on: window.connections };
  });
window.pvws.reconnect_ms = 300;
window.pvws.open();
</script></body></html>`;
}

describe("pvws.js served by pvwire, used as dbwr uses it", () => {
  let stack: Stack;
  let web: Server;
  let profile: string;
  let browser: BrowserContext;
  let p: Page;
  const errors: string[] = [];
  const latest = (pv: string) => p.evaluate((name) => (window as unknown as { latest: Record<string, Record<string, unknown>> }).latest[name], pv);
  // Runs in the page, where the globals above are `window`'s.
  type PageWindow = { latest: Record<string, { value?: unknown; text?: unknown; on: number } | undefined>; events: { type?: string }[]; connections: number };
  const waitFor = <A,>(test: (w: PageWindow, arg: A) => boolean, arg: A, timeout = 15_000) =>
    p.waitForFunction(([body, a]) => (new Function("w", "a", `return (${body})(w, a);`))(window, a) as boolean, [test.toString(), arg] as const, { timeout });

  beforeAll(async () => {
    stack = await startStack(["--write-rule", "loc://pvwsjs*"]);
    const host = new URL(stack.url).host;
    web = createServer((_req, res) => {
      res.writeHead(200, { "content-type": "text/html" });
      res.end(page(host));
    });
    await new Promise<void>((resolve) => web.listen(0, "127.0.0.1", resolve));
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    p = browser.pages()[0] ?? (await browser.newPage());
    p.on("pageerror", (e) => errors.push(e.message));
    p.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    await p.goto(`http://127.0.0.1:${(web.address() as AddressInfo).port}/?pvs=${encodeURIComponent(PVS.join(","))}`);
  });
  afterAll(async () => {
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await new Promise((r) => web ? web.close(r) : r(undefined));
    await stack?.stop();
  });

  it("serves both scripts as JavaScript, and nothing else under /pvws/js", async () => {
    for (const name of ["pvws.js", "base64.js"]) {
      const res = await fetch(`${stack.url}/pvws/js/${name}?V=1`);
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toMatch(/^application\/javascript/);
    }
    expect((await fetch(`${stack.url}/pvws/js/other.js`)).status).toBe(404);
    expect((await fetch(`${stack.url}/pvws/js/..%2Fapp.py`)).status).toBe(404);
  });

  it("connects and merges updates of an IOC PV, a sim PV and a local PV", async () => {
    await waitFor((w, pvs) => pvs.every((pv) => w.latest[pv] !== undefined), PVS);
    // connect_handler(false) comes first, on open(), as in pvws' client.
    expect(await p.evaluate(() => (window as unknown as { events: unknown[] }).events[0])).toEqual({ connected: false });
    const counter = await latest(IOC_PV);
    expect(counter).toMatchObject({ type: "update", pv: IOC_PV, vtype: "VDouble", severity: "NONE", readonly: true });
    expect(typeof counter!.value).toBe("number");
    const text = await latest(LOCAL_PV);
    expect(text).toMatchObject({ vtype: "VString", text: "hello", readonly: false });
    // Later updates carry only what changed; the merged state keeps the metadata.
    const before = (await latest(SIM_PV))!.value as number;
    await waitFor((w, [pv, b]) => w.latest[pv]!.value !== b, [SIM_PV, before] as const);
    const ramp = (await latest(SIM_PV))!;
    expect(ramp.vtype).toBe("VDouble");
    expect(ramp.value).not.toBe(before);
    // base64.js is the page's too: its helpers round-trip bytes.
    const bytes = await p.evaluate(() => Array.from((globalThis as unknown as { toByteArray(t: string): Uint8Array }).toByteArray(
      (globalThis as unknown as { fromByteArray(b: number[]): string }).fromByteArray([0, 255, 1, 128]))));
    expect(bytes).toEqual([0, 255, 1, 128]);
    expect(errors).toEqual([]);
  });

  it("decodes a base64 array into a plain array", async () => {
    await p.evaluate(() => (window as unknown as { pvws: { subscribe(pv: string): void } }).pvws.subscribe("sim://waveform?length=8&rate=5"));
    await waitFor((w, pv) => Array.isArray(w.latest[pv]?.value), "sim://waveform?length=8&rate=5");
    const wf = (await latest("sim://waveform?length=8&rate=5"))!;
    expect(wf.vtype).toBe("VDoubleArray");
    expect((wf.value as number[]).length).toBe(8);
    expect(wf.b64dbl).toBeUndefined();
  });

  it("writes a number and a text, and every merged state shows them; a refused write is an error", async () => {
    const target = Math.round(Math.random() * 40_000) / 1000 + 5;
    await p.evaluate(([pv, v]) => (window as unknown as { pvws: { write(pv: string, v: unknown): void } }).pvws.write(pv as string, v), [SETPOINT, target]);
    await waitFor((w, [pv, v]) => w.latest[pv]?.value === v, [SETPOINT, target] as const);
    await p.evaluate((pv) => (window as unknown as { pvws: { write(pv: string, v: unknown): void } }).pvws.write(pv, "bye"), LOCAL_PV);
    await waitFor((w, pv) => w.latest[pv]?.text === "bye", LOCAL_PV);
    // A refused write reaches the page as an `error` message (dbwr shows it in its info line).
    await p.evaluate((pv) => (window as unknown as { pvws: { write(pv: string, v: unknown): void } }).pvws.write(pv, 1), IOC_PV);
    await waitFor((w) => w.events.some((m) => m.type === "error"), null);
    const error = await p.evaluate(() => (window as unknown as { events: { type?: string; message?: string }[] }).events.find((m) => m.type === "error"));
    expect(error!.message).toContain(IOC_PV);
  });

  it("clears a PV: no more updates for it, and the server no longer lists it", async () => {
    await p.evaluate((pv) => (window as unknown as { pvws: { clear(pv: string): void } }).pvws.clear(pv), SIM_PV);
    await p.evaluate(() => (window as unknown as { pvws: { list(): void } }).pvws.list());
    await waitFor((w) => w.events.some((m) => m.type === "list"), null);
    const listed = await p.evaluate(() => (window as unknown as { events: { type?: string; pvs?: string[] }[] }).events.filter((m) => m.type === "list").at(-1)!.pvs);
    expect(listed).not.toContain(SIM_PV);
    expect(listed).toContain(IOC_PV);
    expect(await p.evaluate((pv) => (window as unknown as { pvws: { values: Record<string, unknown> } }).pvws.values[pv], SIM_PV)).toBeUndefined();
    // An update sent before the server read the clear, arriving after it: dropped.
    const late = await p.evaluate((pv) => {
      const pvws = (window as unknown as { pvws: { handleMessage(text: string): void; values: Record<string, unknown> } }).pvws;
      pvws.handleMessage(JSON.stringify({ type: "update", pv, value: 1, seconds: 1, nanos: 0 }));
      return pvws.values[pv];
    }, SIM_PV);
    expect(late).toBeUndefined();
  });

  it("reconnects after close() and after the server restarts, and the page subscribes again", async () => {
    const connections = () => p.evaluate(() => (window as unknown as { connections: number }).connections);
    expect(await connections()).toBe(1);
    await p.evaluate(() => (window as unknown as { pvws: { close(): void } }).pvws.close());
    await waitFor((w, pvs) => w.connections === 2 && pvs.every((pv) => w.latest[pv]?.on === 2), PVS);

    await stack.command("restart-server");
    await waitFor((w, pvs) => w.connections === 3 && pvs.every((pv) => w.latest[pv]?.on === 3), PVS, 60_000).catch(async (e: unknown) => {
      const seen = await p.evaluate(() => Object.entries((window as unknown as { latest: Record<string, { on: number }> }).latest).map(([pv, m]) => `${pv} on ${m.on}`).join(", "));
      throw new Error(`after the restart: ${seen}: ${String(e)}`);
    });
    const events = await p.evaluate(() => (window as unknown as { events: { connected?: boolean }[] }).events.filter((e) => e.connected !== undefined).map((e) => e.connected));
    // open(): false; connected: true; each close: false, then false again on re-open, then true.
    expect(events.filter((c) => c === true)).toHaveLength(3);
    expect(events.at(-1)).toBe(true);
    // The close and the restart are logged by pvws.js as errors only when the socket errs.
    expect(errors.filter((e) => !e.includes("pvws: error on") && !e.includes("WebSocket"))).toEqual([]);
  });
});
