// The demo page's strip chart opens full: the page subscribes with `backfill`, so a channel the
// server already records shows its last minute at once, in Chromium, against the real server.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { PvwireClient, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const STATIC = join(import.meta.dirname, "../../../server/pvwire/static/index.html");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`) ?? (existsSync(STATIC) ? undefined : "page not built (npm run build)");
if (skip) throw new Error(`browser tests cannot run: ${skip}`);

interface StripStats { points: number; oldestMs: number; past: number; span: number; rows: number; resolution: number; gaps: number; asked: number }
interface HistoryRows { resolution: number; seconds: number[]; gap: boolean[] }

describe("strip chart with recorded history", () => {
  let stack: Stack;
  let browser: BrowserContext;
  let profile: string;
  let client: PvwireClient;

  beforeAll(async () => {
    stack = await startStack();
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1400, height: 1000 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
  });
  afterAll(async () => {
    client?.close();
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await stack?.stop();
  });

  it("opens with the channel's past, from before the page existed", async () => {
    // Another client watches the demo's first plotted channel: the server records it.
    const page = browser.pages()[0] ?? (await browser.newPage());
    await page.goto(`${stack.url}/`);
    const name = await page.waitForFunction(() => { const t = document.querySelector('[data-testid="strip-name"]')?.textContent; return t && t !== "-" ? t : null; }, null, { timeout: 30_000 });
    const id = String(await name.jsonValue());
    await page.close();
    const seen: number[] = [];
    const keeper = client.subscribe([id], (st) => { if (typeof st.value === "number") seen.push(st.value); });
    await until(() => seen.length > 40, 30_000, `40 updates of ${id}`);
    const opened = Date.now();
    const fresh = await browser.newPage();
    await fresh.goto(`${stack.url}/`);
    await fresh.waitForFunction(() => ((globalThis as { pvwireStrip?: StripStats }).pvwireStrip?.past ?? 0) > 0, null, { timeout: 30_000 });
    await fresh.waitForFunction(() => ((globalThis as { pvwireStrip?: StripStats }).pvwireStrip?.points ?? 0) > 0, null, { timeout: 30_000 });
    const stats = await fresh.evaluate(() => (globalThis as { pvwireStrip?: StripStats }).pvwireStrip!);
    keeper.unsubscribe();
    await fresh.close();
    expect(stats.past).toBeGreaterThanOrEqual(30);
    // Points from well before the page opened: the chart did not start empty.
    expect(stats.oldestMs).toBeLessThan(opened - 2000);
  });

  it("widened to an hour, draws the server's recorded buckets with their gaps", async () => {
    const page = await browser.newPage();
    await page.goto(`${stack.url}/`);
    const name = await page.waitForFunction(() => { const t = document.querySelector('[data-testid="strip-name"]')?.textContent; return t && t !== "-" ? t : null; }, null, { timeout: 30_000 });
    const id = String(await name.jsonValue());
    await page.selectOption('[data-testid="strip-span"]', "3600");
    // More 10 Hz updates recorded than the chart's columns hold: the server answers with buckets
    // (the page asks again every 10 s), which takes the channel's first ~30 s of recording.
    await page.waitForFunction(() => ((globalThis as { pvwireStrip?: StripStats }).pvwireStrip?.resolution ?? 0) > 0, null, { timeout: 150_000 });
    const stats = await page.evaluate(() => (globalThis as { pvwireStrip?: StripStats }).pvwireStrip!);
    const since = Date.now() / 1000 - 3600;
    const d = await client.graphql<{ history: HistoryRows }>(`query($id: String!, $since: Float!, $max: Int!) { history(id: $id, since: $since, maxPoints: $max) { resolution seconds gap } }`, { id, since, max: stats.asked });
    await page.close();
    expect(stats.span).toBe(3600);
    // maxPoints ~ the chart's width: one row per two of its 628 pixel columns
    expect(stats.asked).toBe(314);
    expect(stats.resolution).toBe(10); // the finest tier
    expect(stats.resolution).toBe(d.history.resolution);
    expect(stats.rows).toBeGreaterThanOrEqual(3);
    expect(Math.abs(stats.rows - d.history.seconds.length)).toBeLessThanOrEqual(1); // a bucket may close between
    expect(stats.gaps).toBe(d.history.gap.filter(Boolean).length);
  }, 200_000);
});
