// The status page (/status) in headless Chromium against the real server and demo IOC: it lists a
// /stream client and a pvws client connected from this test, each with its channels and a frame
// rate, the upstream channels they hold open (subscribers, rate, connection, last update), the
// event-loop lag and the tick time; it follows a client that leaves; and for someone who is not
// an administrator it says so instead of showing empty tables. Saves test-artifacts/status-page.png.
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { PvwireClient, type Subscription, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = join(import.meta.dirname, "../../../test-artifacts");
const STATIC = join(import.meta.dirname, "../../../server/pvwire/static/status.html");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`) ?? (existsSync(STATIC) ? undefined : "status page not built (npm run build)");
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`status page tests cannot run: ${skip}`);

const P = "PVWIRE:DEMO:";

async function launch(profile: string): Promise<BrowserContext> {
  return chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1400, height: 900 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}

/** A pvws client as the web UIs that speak pvws open one: a JSON text WebSocket at /pvws/pv. */
async function pvwsClient(url: string, pvs: string[]): Promise<{ ws: WebSocket; seen: Set<string> }> {
  const ws = new WebSocket(`${url.replace(/^http/, "ws")}/pvws/pv`);
  const seen = new Set<string>();
  ws.on("message", (data) => {
    const msg = JSON.parse(String(data)) as { type: string; pv?: string };
    if (msg.type === "update" && msg.pv) seen.add(msg.pv);
  });
  await new Promise<void>((resolve, reject) => { ws.once("open", () => resolve()); ws.once("error", reject); });
  ws.send(JSON.stringify({ type: "subscribe", pvs }));
  await until(() => pvs.every((pv) => seen.has(pv)), 15_000, `pvws updates of ${pvs.join(", ")}`);
  return { ws, seen };
}

describe("status page in Chromium", () => {
  let stack: Stack;
  let browser: BrowserContext;
  let page: Page;
  let profile: string;
  let client: PvwireClient;
  let sub: Subscription;
  let pvws: WebSocket;
  const errors: string[] = [];
  const clientRow = (endpoint: string) => page.locator(`#clients tr[data-endpoint="${endpoint}"]`);
  const channelRow = (id: string) => page.locator(`#channels tr[data-channel="${id}"]`);

  beforeAll(async () => {
    stack = await startStack();
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
    const streamed = new Set<string>();
    sub = client.subscribe([`${P}COUNTER`, `${P}SINE`], (st) => { if (st.value !== undefined) streamed.add(st.id); });
    await until(() => streamed.size === 2, 15_000, "values of the /stream subscription");
    pvws = (await pvwsClient(stack.url, [`${P}COUNTER`, `${P}WAVEFORM`, `${P}MODE`])).ws;
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await launch(profile);
    page = browser.pages()[0] ?? (await browser.newPage());
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(`${stack.url}/status`);
  });
  afterAll(async () => {
    sub?.unsubscribe();
    client?.close();
    pvws?.close();
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await stack?.stop();
  });

  it("lists the /stream client and the pvws client with their channels and frame rates", async () => {
    const stream = clientRow("stream");
    const ws = clientRow("pvws");
    await stream.waitFor({ timeout: 10_000 });
    await ws.waitFor({ timeout: 10_000 });
    expect(await stream.count()).toBe(1);
    expect(await ws.count()).toBe(1);
    expect(await stream.locator('[data-testid="channels"]').textContent()).toBe("2");
    expect(await ws.locator('[data-testid="channels"]').textContent()).toBe("3");
    for (const r of [stream, ws]) {
      expect(await r.locator('[data-testid="address"]').textContent()).toMatch(/^127\.0\.0\.1(:\d+)?$/);
      expect(await r.locator('[data-testid="identity"]').textContent()).not.toBe("");
      expect(await r.locator('[data-testid="queued"]').textContent()).toMatch(/^\d+$/);
      expect(await r.locator('[data-testid="conflated"]').textContent()).toMatch(/^\d+$/);
    }
    // COUNTER changes at 10 Hz: both clients get frames, and the rate is computed between polls.
    for (const endpoint of ["stream", "pvws"]) {
      await page.waitForFunction((e) => Number(document.querySelector(`#clients tr[data-endpoint="${e}"] [data-testid="frame-rate"]`)?.textContent) > 0, endpoint, { timeout: 10_000 });
    }
  });

  it("lists the upstream channels with subscribers, update rate, connection and last update", async () => {
    const counter = channelRow(`ca://${P}COUNTER`);
    await counter.waitFor({ timeout: 10_000 });
    // One upstream channel for COUNTER, held by the /stream subscription and the pvws client.
    expect(Number(await counter.locator('[data-testid="subscribers"]').textContent())).toBeGreaterThanOrEqual(2);
    expect(await counter.locator('[data-testid="connection"]').textContent()).toBe("CONNECTED");
    await page.waitForFunction((id) => Number(document.querySelector(`#channels tr[data-channel="${id}"] [data-testid="update-rate"]`)?.textContent) > 0, `ca://${P}COUNTER`, { timeout: 10_000 });
    expect(await counter.locator('[data-testid="last-update"]').textContent()).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}.* ago$/);
    for (const name of ["SINE", "WAVEFORM", "MODE"]) await channelRow(`ca://${P}${name}`).waitFor({ timeout: 10_000 });
    expect(await page.locator('[data-testid="channel-count"]').textContent()).toBe(String(await page.locator("#channels tr").count()));
  });

  it("shows the event-loop lag and the tick time, and refreshes", async () => {
    expect(await page.locator('[data-testid="loop-lag"]').textContent()).toMatch(/^\d+\.\d ms$/);
    await page.waitForFunction(() => /^\d+\.\d{3} ms of \d+(\.\d+)? ms$/.test(document.querySelector('[data-testid="tick-time"]')?.textContent ?? ""), null, { timeout: 10_000 });
    expect(Number(await page.locator('[data-testid="tick-rate"]').textContent())).toBeGreaterThan(0);
    expect(await page.locator('[data-testid="error"]').textContent()).toBe("");
    const first = await page.locator('[data-testid="refreshed"]').textContent();
    await page.waitForFunction((f) => document.querySelector('[data-testid="refreshed"]')?.textContent !== f, first, { timeout: 10_000 });
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "status-page.png"), fullPage: true });
    expect(errors).toEqual([]);
  });

  it("drops a client that leaves", async () => {
    pvws.close();
    await page.waitForFunction(() => document.querySelectorAll('#clients tr[data-endpoint="pvws"]').length === 0, null, { timeout: 10_000 });
    expect(await clientRow("stream").count()).toBe(1);
    // WAVEFORM and MODE were the pvws client's alone: the hub closes them after its linger.
    await page.waitForFunction((id) => !document.querySelector(`#channels tr[data-channel="${id}"]`), `ca://${P}WAVEFORM`, { timeout: 20_000 });
  });
});

describe("status page for someone who is not an administrator", () => {
  it("shows the public figures and says why clients and channels are not shown", async () => {
    // With an admin group configured, a request from this machine is no longer enough.
    const stack = await startStack(["--admin-group", "operators"]);
    const profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    const browser = await launch(profile);
    try {
      const page = browser.pages()[0] ?? (await browser.newPage());
      const pageErrors: string[] = [];
      page.on("pageerror", (e) => pageErrors.push(e.message));
      await page.goto(`${stack.url}/status`);
      await page.locator('[data-testid="error"]', { hasText: /administrator/ }).waitFor({ timeout: 10_000 });
      expect(await page.locator('[data-testid="loop-lag"]').textContent()).toMatch(/ ms$/);
      expect(await page.locator('[data-testid="version"]').textContent()).not.toBe("–");
      expect(await page.locator("#clients tr").count()).toBe(0);
      expect(pageErrors).toEqual([]);
    } finally {
      await browser.close();
      rmSync(profile, { recursive: true, force: true });
      await stack.stop();
    }
  });
});
