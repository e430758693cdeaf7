// The demo page in headless Chromium (Debian's /usr/bin/chromium through playwright-core) against
// the real server and demo IOC: loads, values change, a put from the page reaches the IOC, the
// waveform canvas draws, charts have labelled axes, an unknown alarm is not shown as an alarm, a
// refused put shows its error in its row, error rows do not reflow the table, an unknown PV says
// "not found", a dead IOC shows as DISCONNECTED (alarm badge and stale image and plots), and so
// does every live channel while the server is down. Saves screenshots in test-artifacts/.
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
    await page.locator('[data-testid="conn-state"]', { hasText: "connected" }).waitFor({ timeout: 30_000 });
    await row(`${P}SINE`).waitFor({ timeout: 30_000 });
    await page.waitForFunction(() => document.querySelector('tr[data-pv$="COUNTER"] [data-testid="conn"]')?.textContent?.startsWith("CONNECTED"), null, { timeout: 30_000 });
    // SP is shown with its precision (3) and units.
    await page.waitForFunction(() => /^-?\d+\.\d{3} mm$/.test(document.querySelector('tr[data-pv$="DEMO:SP"] [data-testid="value"]')?.textContent ?? ""), null, { timeout: 30_000 });
  });

  it("shows values that change over time and an update rate", async () => {
    const before = await cellText(`${P}COUNTER`, "value");
    await page.waitForFunction((b) => document.querySelector('tr[data-pv$="COUNTER"] [data-testid="value"]')?.textContent !== b, before, { timeout: 15_000 });
    await page.waitForFunction(() => Number(document.querySelector('[data-testid="update-rate"]')?.textContent) > 0, null, { timeout: 15_000 });
  });

  it("draws the waveform on its canvas", async () => {
    await page.waitForFunction(() => {
      const c = document.querySelector('[data-testid="waveform-canvas"]') as HTMLCanvasElement | null;
      if (!c) return false;
      const d = c.getContext("2d")!.getImageData(0, 0, c.width, c.height).data;
      let line = 0;
      for (let i = 0; i < d.length; i += 4) if (d[i + 2]! > 150 && d[i]! < 80) line++; // the blue trace
      return line > 200;
    }, null, { timeout: 30_000 });
  });

  it("puts a value from the page and the IOC has it", async () => {
    const target = (Math.round(Math.random() * 40_000) / 1000 + 5).toFixed(3);
    await row(`${P}SP`).locator('[data-testid="put-input"]').fill(target);
    await row(`${P}SP`).locator('[data-testid="put-button"]').click();
    const t0 = Date.now();
    let value: unknown;
    while (Date.now() - t0 < 30_000) {
      value = (await client.get(`ca://${P}SP`)).value;
      if (typeof value === "number" && Math.abs(value - Number(target)) < 1e-6) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(value).toBeCloseTo(Number(target), 6);
    await page.waitForFunction((t) => document.querySelector('tr[data-pv$="RBV"] [data-testid="value"]')?.textContent === `${t} mm`, target, { timeout: 30_000 });
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.waitForTimeout(1500); // let the strip chart gather some points
    await page.screenshot({ path: join(ARTIFACTS, "demo-page.png"), fullPage: true });
  });

  it("serves GraphiQL that works with no network but the server's, opening on a pvwire query", async () => {
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
    await editor.waitFor({ timeout: 30_000 });
    expect(external).toEqual([]);
    const cm = () => gq.evaluate(() => (document.querySelector(".graphiql-query-editor .CodeMirror") as unknown as { CodeMirror: { getValue(): string } }).CodeMirror.getValue());
    // The editor opens on a query of this server's own channels, in ASCII (offline fonts may lack
    // anything else), not on the stock welcome text.
    const initial = await cm();
    expect(initial).toContain('channel(id: "PVWIRE:DEMO:SINE")');
    expect(initial).toContain("search(");
    expect(initial).not.toMatch(/welcome/i);
    expect(initial).toMatch(/^[\x00-\x7f]*$/);
    // Run it as it is: the result pane shows the server's answer to both parts.
    await gq.locator(".graphiql-execute-button").click();
    await gq.locator(".graphiql-response", { hasText: '"units": "V"' }).waitFor({ timeout: 30_000 });
    await gq.locator(".graphiql-response", { hasText: "ca://PVWIRE:DEMO:COUNTER" }).waitFor({ timeout: 30_000 });
    mkdirSync(ARTIFACTS, { recursive: true });
    await gq.screenshot({ path: join(ARTIFACTS, "graphiql-example.png") });
    // Another query typed in runs too.
    await gq.evaluate(() => {
      const cm = (document.querySelector(".graphiql-query-editor .CodeMirror") as unknown as { CodeMirror: { setValue(v: string): void } }).CodeMirror;
      cm.setValue('{ channel(id: "PVWIRE:DEMO:SP") { metadata { units } } }');
    });
    await gq.locator(".graphiql-execute-button").click();
    await gq.locator(".graphiql-response", { hasText: '"units": "mm"' }).waitFor({ timeout: 30_000 });
    mkdirSync(ARTIFACTS, { recursive: true });
    await gq.screenshot({ path: join(ARTIFACTS, "graphiql-offline.png") });
    await gq.close();
  });

  it("labels the chart axes: index and units for the waveform, clock time and units for the strip chart", async () => {
    const ticks = (id: string) => page.locator(`[data-testid="${id}"] span`).allTextContents();
    // The waveform has 1000 points (index 0..999) and degC units; the strip chart shows SINE (V).
    await page.waitForFunction(() => document.querySelector('[data-testid="waveform-y-title"]')?.textContent === "degC", null, { timeout: 30_000 });
    await page.waitForFunction(() => [...document.querySelectorAll('[data-testid="waveform-x-ticks"] span')].map((e) => e.textContent).includes("800"), null, { timeout: 30_000 });
    expect((await ticks("waveform-x-ticks"))[0]).toBe("0");
    expect((await ticks("waveform-y-ticks")).length).toBeGreaterThanOrEqual(2);
    for (const t of await ticks("waveform-y-ticks")) expect(t).toMatch(/^-?\d+(\.\d+)?$/);
    await page.waitForFunction(() => document.querySelector('[data-testid="strip-y-title"]')?.textContent === "V", null, { timeout: 30_000 });
    const times = await ticks("strip-x-ticks");
    expect(times.length).toBeGreaterThanOrEqual(3); // every 15 s over the last minute
    for (const t of times) expect(t).toMatch(/^\d\d:\d\d:\d\d$/);
    // The y range grows with the samples the strip has gathered (SINE at 10 Hz): on a loaded
    // machine the title can be there while the few samples so far span one tick.
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="strip-y-ticks"] span').length >= 2, null, { timeout: 30_000 });
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.locator(".plots").screenshot({ path: join(ARTIFACTS, "demo-charts.png") });
  });

  it("shows a refused put next to its row's put box, not in the toolbar", async () => {
    const message = row(`${P}MESSAGE`);
    // A stringout holds at most 39 bytes: the server refuses the put (TYPE_MISMATCH).
    await message.locator('[data-testid="put-input"]').fill("x".repeat(60));
    await message.locator('[data-testid="put-button"]').click();
    await message.locator('[data-testid="put-error"]', { hasText: "39 bytes" }).waitFor({ timeout: 30_000 });
    expect(await page.locator('[data-testid="error"]').textContent()).toBe("");
    // A value that is not a number never leaves the page, and says so in its row too.
    await row(`${P}SP`).locator('[data-testid="put-input"]').fill("abc");
    await row(`${P}SP`).locator('[data-testid="put-button"]').click();
    await row(`${P}SP`).locator('[data-testid="put-error"]', { hasText: "not a number" }).waitFor({ timeout: 15_000 });
    // A good put clears the row's error.
    await message.locator('[data-testid="put-input"]').fill("all good");
    await message.locator('[data-testid="put-button"]').click();
    await page.waitForFunction(() => document.querySelector('tr[data-pv$="DEMO:MESSAGE"] [data-testid="put-error"]')?.textContent === "", null, { timeout: 30_000 });
    await row(`${P}MESSAGE`).locator('[data-testid="value"]', { hasText: "all good" }).waitFor({ timeout: 30_000 });
  });

  it("keeps every column where it was when a row with a long error appears", async () => {
    const columns = () => page.locator('[data-testid="pv-table"] th').evaluateAll((ths) => ths.map((th) => {
      const r = th.getBoundingClientRect();
      return [Math.round(r.left), Math.round(r.width)];
    }));
    const before = await columns();
    // An unknown scheme: the subscription fails with the server's (long) message in the row.
    await page.locator('[data-testid="pv-input"]').fill("bogus-scheme://A:VERY:LONG:CHANNEL:NAME:THAT:DOES:NOT:EXIST:ANYWHERE:AT:ALL");
    await page.locator('[data-testid="pv-add"]').click();
    const bad = page.locator('tr[data-pv^="bogus-scheme://"]');
    await bad.locator('[data-testid="conn"]', { hasText: "ERROR" }).waitFor({ timeout: 30_000 });
    expect(await columns()).toEqual(before);
    // The message is all there, wrapped inside its cell.
    expect((await bad.locator('[data-testid="conn"]').textContent())!.length).toBeGreaterThan(20);
  });

  it("shows a channel whose alarm is not known yet as a neutral dash, never as a severity", async () => {
    // No IOC serves this name: its row never gets an alarm state.
    await page.locator('[data-testid="pv-input"]').fill(`${P}NOPE`);
    await page.locator('[data-testid="pv-add"]').click();
    const nope = page.locator(`tr[data-pv="${P}NOPE"]`);
    await nope.waitFor({ timeout: 30_000 });
    // Wait for the server's first state of this channel (CONNECTING, or NOT_FOUND), then look.
    await page.locator(`tr[data-pv="${P}NOPE"][data-connection]`).waitFor({ timeout: 30_000 });
    // One look at both (NOT_FOUND may arrive in between): still connecting, a dash; once not
    // found, the connection state (next test); never an alarm severity.
    const seen = await nope.evaluate((tr) => ({ conn: tr.getAttribute("data-connection"), text: tr.querySelector('[data-testid="severity"]')!.textContent, badges: tr.querySelectorAll('[data-testid="severity"] .sev').length }));
    expect(seen.text).not.toMatch(/NO_ALARM|MINOR|MAJOR|INVALID|UNKNOWN/);
    if (seen.conn === "CONNECTING") expect(seen).toEqual({ conn: "CONNECTING", text: "–", badges: 0 });
    else expect(seen).toEqual({ conn: "NOT_FOUND", text: "NOT_FOUND", badges: 1 });
    expect(await page.locator('[data-testid="severity"]', { hasText: /^\s*UNKNOWN\s*$/ }).count()).toBe(0);
  });

  // The server sends connection state 4 NOT_FOUND after its search time (not_found_s).
  it("says 'not found' for a PV no IOC serves, and keeps the row", async () => {
    const nope = page.locator(`tr[data-pv="${P}NOPE"]`);
    await nope.locator('[data-testid="conn"]', { hasText: /not found/i }).waitFor({ timeout: 30_000 });
    expect(await nope.locator('[data-testid="conn"]').getAttribute("class")).toContain("conn-NOT_FOUND");
    // Its badge says so in the disconnected style, not an alarm severity.
    await nope.locator('[data-testid="severity"] .sev-disconnected', { hasText: "NOT_FOUND" }).waitFor({ timeout: 30_000 });
    expect(await nope.count()).toBe(1);
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.locator('[data-testid="pv-table"]').screenshot({ path: join(ARTIFACTS, "demo-not-found.png") });
  });

  // A channel's first value carries its alarm; a PVA setpoint's put box follows the access that
  // subscribe grants (PVA tells no access rights of its own).
  it("shows a healthy PVA setpoint as NO_ALARM with its put box", async () => {
    await page.locator('[data-testid="pv-input"]').fill(`pva://${P}SP`);
    await page.locator('[data-testid="pv-add"]').click();
    const sp = page.locator(`tr[data-pv="pva://${P}SP"]`);
    await sp.locator('[data-testid="conn"]', { hasText: "CONNECTED" }).waitFor({ timeout: 30_000 });
    await sp.locator('[data-testid="severity"] .sev-NO_ALARM').waitFor({ timeout: 30_000 });
    await sp.locator('[data-testid="put-input"]').waitFor({ timeout: 30_000 });
    const target = (Math.round(Math.random() * 40_000) / 1000 + 5).toFixed(3);
    await sp.locator('[data-testid="put-input"]').fill(target);
    await sp.locator('[data-testid="put-button"]').click();
    await sp.locator('[data-testid="value"]', { hasText: `${target} mm` }).waitFor({ timeout: 30_000 });
    expect(await sp.locator('[data-testid="put-error"]').textContent()).toBe("");
  });

  // Control-room convention (Phoebus, EDM): a disconnected PV never shows its last (green) alarm,
  // and every widget showing it is visibly stale until it is connected again.
  const CANVASES = ["image-canvas", "waveform-canvas", "strip-canvas"];
  const staleMarks = () => page.evaluate((ids) => ids.map((id) => (document.querySelector(`[data-testid="${id}"]`) as HTMLCanvasElement).dataset.stale ?? null), CANVASES);
  /** The pixel just inside the top of the stale marker's label (drawStaleMarker), as [r, g, b]. */
  const labelPixel = (id: string) => page.locator(`[data-testid="${id}"]`).evaluate((c: HTMLCanvasElement) => {
    const size = Math.max(10, Math.round(Math.min(c.width, c.height) / 10));
    const d = c.getContext("2d")!.getImageData(Math.floor(c.width / 2), Math.floor(c.height / 2 - 0.75 * size), 1, 1).data;
    return [d[0], d[1], d[2]];
  });
  const MAGENTA = [200, 0, 200]; // STALE_COLOR
  const badge = (name: string) => row(name).locator('[data-testid="severity"] .sev');

  async function expectStale(): Promise<void> {
    await page.waitForFunction((ids) => ids.every((id) => (document.querySelector(`[data-testid="${id}"]`) as HTMLElement).dataset.stale === "DISCONNECTED"), CANVASES, { timeout: 60_000 });
    for (const id of CANVASES) expect(await labelPixel(id)).toEqual(MAGENTA);
    await row(`${P}COUNTER`).locator('[data-testid="severity"] .sev-disconnected', { hasText: "DISCONNECTED" }).waitFor({ timeout: 60_000 });
    expect(await badge(`${P}COUNTER`).textContent()).toBe("DISCONNECTED");
    expect(await badge(`${P}COUNTER`).evaluate((el) => getComputedStyle(el).backgroundColor)).toBe("rgb(200, 0, 200)");
    expect(await page.locator('tr.disconnected [data-testid="severity"] .sev-NO_ALARM').count()).toBe(0);
    // A put box of a channel that is not connected is greyed with the reason (a put would fail).
    await page.waitForFunction(() => {
      const form = document.querySelector('tr[data-pv$="DEMO:SP"] form');
      const input = form?.querySelector('[data-testid="put-input"]') as HTMLInputElement | null | undefined;
      return input?.disabled === true && /^DISCONNECTED: no put until the channel is connected$/.test(form?.getAttribute("title") ?? "");
    }, null, { timeout: 60_000 });
  }

  async function expectLive(): Promise<void> {
    try {
      await page.waitForFunction((ids) => ids.every((id) => (document.querySelector(`[data-testid="${id}"]`) as HTMLElement).dataset.stale === undefined), CANVASES, { timeout: 60_000 });
    } catch (e) {
      const rows = await page.locator("tr[data-pv]").evaluateAll((trs) => trs.map((tr) => `${tr.getAttribute("data-pv")}=${tr.getAttribute("data-connection")}`));
      throw new Error(`still stale: ${JSON.stringify(await staleMarks())}; rows ${rows.join(" ")}; ${String(e)}`);
    }
    // The image is redrawn without the marker; a plot redrawn by the next animation frame.
    for (const id of CANVASES) await page.waitForFunction(([id, m]) => {
      const c = document.querySelector(`[data-testid="${id}"]`) as HTMLCanvasElement;
      const size = Math.max(10, Math.round(Math.min(c.width, c.height) / 10));
      const d = c.getContext("2d")!.getImageData(Math.floor(c.width / 2), Math.floor(c.height / 2 - 0.75 * size), 1, 1).data;
      return !(d[0] === m[0] && d[1] === m[1] && d[2] === m[2]);
    }, [id, MAGENTA] as const, { timeout: 60_000 });
    await page.waitForFunction(() => {
      const sev = document.querySelector('tr[data-pv$="COUNTER"] [data-testid="severity"] .sev');
      return sev !== null && !sev.classList.contains("sev-disconnected") && /^(NO_ALARM|MINOR|MAJOR|INVALID)$/.test(sev.textContent ?? "");
    }, null, { timeout: 60_000 });
    await page.waitForFunction(() => (document.querySelector('tr[data-pv$="DEMO:SP"] [data-testid="put-input"]') as HTMLInputElement | null)?.disabled === false, null, { timeout: 60_000 });
  }

  it("shows a dead IOC as DISCONNECTED: the alarm badge says so, the image and plots are marked stale until it is back", async () => {
    await page.waitForFunction(() => (document.querySelector('[data-testid="image-stats"]') as HTMLElement).dataset.drawn !== undefined, null, { timeout: 60_000 });
    expect(await staleMarks()).toEqual([null, null, null]);
    await stack.command("kill-ioc");
    try {
      await page.waitForFunction(() => document.querySelector('tr[data-pv$="COUNTER"] [data-testid="conn"]')?.textContent?.startsWith("DISCONNECTED"), null, { timeout: 60_000 });
      await expectStale();
      await page.screenshot({ path: join(ARTIFACTS, "demo-page-disconnected.png"), fullPage: true });
    } finally {
      await stack.command("start-ioc");
    }
    await expectLive();
  }, 180_000);

  it("shows every live channel DISCONNECTED, last value struck through, while the server is down, and live again after the restart", async () => {
    await page.waitForFunction(() => document.querySelector('tr[data-pv$="COUNTER"]')?.getAttribute("data-connection") === "CONNECTED", null, { timeout: 60_000 });
    const live = await page.locator('tr[data-connection="CONNECTED"]').evaluateAll((trs) => trs.map((tr) => tr.getAttribute("data-pv")!));
    expect(live).toEqual(expect.arrayContaining([expect.stringMatching(/DEMO:COUNTER$/), expect.stringMatching(/DEMO:SINE$/)]));
    await stack.command("stop-server"); // 4012 (a drain without delay), then down until start-server
    try {
      await page.waitForFunction((names) => names.every((name) => {
        const tr = document.querySelector(`tr[data-pv="${name}"]`);
        const value = tr?.querySelector('[data-testid="value"]')?.textContent ?? "";
        return tr?.getAttribute("data-connection") === "DISCONNECTED" && tr.classList.contains("disconnected") && value !== "" && value !== "–";
      }), live, { timeout: 60_000 });
      expect(await cellText(`${P}COUNTER`, "conn")).toMatch(/^DISCONNECTED \(stream closed: \d+ [A-Z_]+/);
      expect(await row(`${P}COUNTER`).locator('[data-testid="value"]').evaluate((td) => getComputedStyle(td).textDecorationLine)).toBe("line-through");
      expect(await page.locator('[data-testid="conn-state"]').textContent()).not.toBe("connected");
      await expectStale();
      mkdirSync(ARTIFACTS, { recursive: true });
      await page.screenshot({ path: join(ARTIFACTS, "demo-page-server-down.png"), fullPage: true });
    } finally {
      await stack.command("start-server");
    }
    await page.waitForFunction((names) => names.every((name) => document.querySelector(`tr[data-pv="${name}"]`)?.getAttribute("data-connection") === "CONNECTED"), live, { timeout: 60_000 });
    await page.locator('[data-testid="conn-state"]', { hasText: "connected" }).waitFor({ timeout: 60_000 });
    expect(await row(`${P}COUNTER`).evaluate((tr) => tr.classList.contains("disconnected"))).toBe(false);
    await expectLive();
  }, 180_000);
});
