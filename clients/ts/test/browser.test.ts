// The demo page in headless Chromium (Debian's /usr/bin/chromium through playwright-core) against
// the real server and demo IOC: loads, values change, a put from the page reaches the IOC, the
// waveform canvas draws, a dead IOC shows as DISCONNECTED. Saves test-artifacts/demo-page.png.
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { PvwireClient, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = join(import.meta.dirname, "../../../test-artifacts");
const STATIC = join(import.meta.dirname, "../../../server/pvwire/static/index.html");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`) ?? (existsSync(STATIC) ? undefined : "page not built (npm run build)");
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`browser tests cannot run: ${skip}`);

describe("demo page in Chromium", () => {
  let stack: Stack;
  let browser: BrowserContext;
  let page: Page;
  let profile: string;
  let client: PvwireClient;
  const P = "PVWIRE:DEMO:";
  const row = (name: string) => page.locator(`tr[data-pv$="${name}"]`);
  const cellText = (name: string, cell: string) => row(name).locator(`[data-testid="${cell}"]`).textContent();

  beforeAll(async () => {
    stack = await startStack();
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    // A fresh profile per run (playwright passes it as --user-data-dir).
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1400, height: 1000 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    page = browser.pages()[0] ?? (await browser.newPage());
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(`${stack.url}/`);
    expect(errors).toEqual([]);
  });
  afterAll(async () => {
    client?.close();
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await stack?.stop();
  });

  it("loads, connects and shows the demo channels", async () => {
    await page.locator('[data-testid="conn-state"]', { hasText: "connected" }).waitFor({ timeout: 10_000 });
    await row(`${P}SINE`).waitFor({ timeout: 10_000 });
    await page.waitForFunction(() => document.querySelector('tr[data-pv$="COUNTER"] [data-testid="conn"]')?.textContent?.startsWith("CONNECTED"), null, { timeout: 10_000 });
    // SP is shown with its precision (3) and units.
    await page.waitForFunction(() => /^-?\d+\.\d{3} mm$/.test(document.querySelector('tr[data-pv$="DEMO:SP"] [data-testid="value"]')?.textContent ?? ""), null, { timeout: 10_000 });
  });

  it("shows values that change over time and an update rate", async () => {
    const before = await cellText(`${P}COUNTER`, "value");
    await page.waitForFunction((b) => document.querySelector('tr[data-pv$="COUNTER"] [data-testid="value"]')?.textContent !== b, before, { timeout: 5000 });
    await page.waitForFunction(() => Number(document.querySelector('[data-testid="update-rate"]')?.textContent) > 0, null, { timeout: 5000 });
  });

  it("draws the waveform on its canvas", async () => {
    await page.waitForFunction(() => {
      const c = document.querySelector('[data-testid="waveform-canvas"]') as HTMLCanvasElement | null;
      if (!c) return false;
      const d = c.getContext("2d")!.getImageData(0, 0, c.width, c.height).data;
      let line = 0;
      for (let i = 0; i < d.length; i += 4) if (d[i + 2]! > 150 && d[i]! < 80) line++; // the blue trace
      return line > 200;
    }, null, { timeout: 10_000 });
  });

  it("puts a value from the page and the IOC has it", async () => {
    const target = (Math.round(Math.random() * 40_000) / 1000 + 5).toFixed(3);
    await row(`${P}SP`).locator('[data-testid="put-input"]').fill(target);
    await row(`${P}SP`).locator('[data-testid="put-button"]').click();
    const t0 = Date.now();
    let value: unknown;
    while (Date.now() - t0 < 10_000) {
      value = (await client.get(`ca://${P}SP`)).value;
      if (typeof value === "number" && Math.abs(value - Number(target)) < 1e-6) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(value).toBeCloseTo(Number(target), 6);
    await page.waitForFunction((t) => document.querySelector('tr[data-pv$="RBV"] [data-testid="value"]')?.textContent === `${t} mm`, target, { timeout: 10_000 });
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.waitForTimeout(1500); // let the strip chart gather some points
    await page.screenshot({ path: join(ARTIFACTS, "demo-page.png"), fullPage: true });
  });

  it("serves GraphiQL that works with no network but the server's", async () => {
    const gq = await browser.newPage();
    const external: string[] = [];
    // Control rooms are often offline: refuse every request that does not go to the server.
    await gq.route("**/*", (route) => {
      const url = route.request().url();
      if (url.startsWith(stack.url)) return route.continue();
      external.push(url);
      return route.abort();
    });
    await gq.goto(`${stack.url}/graphql`);
    const editor = gq.locator(".graphiql-query-editor");
    await editor.waitFor({ timeout: 15_000 });
    expect(external).toEqual([]);
    // Run a query: the result pane shows the server's answer.
    await gq.evaluate(() => {
      const cm = (document.querySelector(".graphiql-query-editor .CodeMirror") as unknown as { CodeMirror: { setValue(v: string): void } }).CodeMirror;
      cm.setValue('{ channel(id: "PVWIRE:DEMO:SP") { metadata { units } } }');
    });
    await gq.locator(".graphiql-execute-button").click();
    await gq.locator(".graphiql-response", { hasText: '"units": "mm"' }).waitFor({ timeout: 10_000 });
    mkdirSync(ARTIFACTS, { recursive: true });
    await gq.screenshot({ path: join(ARTIFACTS, "graphiql-offline.png") });
    await gq.close();
  }, 30_000);

  it("shows a dead IOC as DISCONNECTED", async () => {
    await stack.command("kill-ioc");
    await page.waitForFunction(() => document.querySelector('tr[data-pv$="COUNTER"] [data-testid="conn"]')?.textContent?.startsWith("DISCONNECTED"), null, { timeout: 15_000 });
    await page.screenshot({ path: join(ARTIFACTS, "demo-page-disconnected.png"), fullPage: true });
    await stack.command("start-ioc");
  }, 40_000);
});
