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

interface StripStats { points: number; oldestMs: number; past: number }

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
});
