// The demo page's strip chart opens with the archive's past: with the facility's archive behind the
// server (launch_stack.py --with-archiver: tests/archiver.py, an archiver of the published format
// holding a sample of every PV every 100 ms), a channel the server never recorded shows its last
// minute at once, in Chromium, against the real server; widened to an hour, the span's first rows
// are the archive's; and a channel whose archiver is down says so beside the chart.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const STATIC = join(import.meta.dirname, "../../../server/pvwire/static/index.html");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`) ?? (existsSync(STATIC) ? undefined : "page not built (npm run build)");
if (skip) throw new Error(`browser tests cannot run: ${skip}`);

interface StripStats { points: number; oldestMs: number; past: number; span: number; rows: number; resolution: number; archive: string; archiveRows: number; archiveMissing: string }
const stats = (page: Page) => page.evaluate(() => (globalThis as { pvwireStrip?: StripStats }).pvwireStrip!);
const strip = "globalThis.pvwireStrip"; // in the page's own JavaScript

describe("strip chart with the archive behind the server", () => {
  let stack: Stack;
  let browser: BrowserContext;
  let profile: string;

  beforeAll(async () => {
    // sim://sine's archiver is down (nothing listens on port 9); every other PV's is tests/archiver.py.
    stack = await startStack(["--archiver", "sim://sine*=http://127.0.0.1:9/retrieval", "--with-archiver"]);
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1400, height: 1000 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
  });
  afterAll(async () => {
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await stack?.stop();
  });

  it("opens with the archive's past of a channel the server never recorded", async () => {
    const opened = Date.now();
    const page = browser.pages()[0] ?? (await browser.newPage());
    await page.goto(`${stack.url}/`);
    await page.waitForFunction(`(${strip}?.past ?? 0) > 300 && (${strip}?.points ?? 0) > 0`, null, { timeout: 60_000 });
    const s = await stats(page);
    await page.close();
    // The archive holds a sample every 100 ms: about 600 in the minute before the page opened.
    expect(s.past).toBeGreaterThan(300);
    expect(s.oldestMs).toBeLessThan(opened - 30_000);
    expect(s.archiveMissing).toBe("");
  });

  it("widened to an hour, draws the archive's rows before the server's", async () => {
    const page = await browser.newPage();
    await page.goto(`${stack.url}/`);
    await page.waitForFunction(`(${strip}?.points ?? 0) > 0`, null, { timeout: 60_000 });
    await page.selectOption('[data-testid="strip-span"]', "3600");
    await page.waitForFunction(`${strip}?.archive === "JOINED" && ${strip}.rows > 0`, null, { timeout: 60_000 });
    const s = await stats(page);
    const note = await page.locator('[data-testid="strip-archive"]').textContent();
    await page.close();
    expect(s.archiveRows).toBeGreaterThan(100); // an hour of the archive in the chart's bins
    expect(s.rows).toBeGreaterThanOrEqual(s.archiveRows);
    expect(s.resolution).toBeGreaterThan(0);
    expect(note).toContain(`the first ${s.archiveRows} rows from the archive`);
  });

  it("says beside the chart that the archive part is missing, and why", async () => {
    const page = await browser.newPage();
    await page.goto(`${stack.url}/`);
    await page.locator('[data-testid="pv-input"]').fill("sim://sine");
    await page.locator('[data-testid="pv-add"]').click();
    const name = page.locator('[data-testid="row"]', { hasText: "sim://sine" }).locator('[data-testid="name"]');
    await name.click();
    await page.waitForFunction(`(${strip}?.archiveMissing ?? "") !== ""`, null, { timeout: 60_000 });
    const s = await stats(page);
    const note = await page.locator('[data-testid="strip-archive"]').textContent();
    await page.close();
    expect(s.archiveMissing).toContain("cannot be reached");
    expect(note).toContain("archive part missing");
  });
});
