// Phoebus PV names through the real cs-web-lib (npm 0.9.14) in headless Chromium against pvwire's
// /pvws/pv: names written with spaces as Phoebus' own examples write them (they were refused with
// "has no usable name"), sim names that used to get neither an update nor an error, a name that
// cannot work reaching the page as an `error` message, and pvws' /info readable from the page's
// origin while /summary stays for administrators. Saves test-artifacts/cs-web-lib-names.png.
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CHROMIUM, openCsWebLibPage, type CsWebLibPage } from "./cs-web-lib/harness.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

const ARTIFACTS = join(import.meta.dirname, "../../../test-artifacts");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`);
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`cs-web-lib tests cannot run: ${skip}`);

// Names with spaces (Phoebus' examples) -> what the page's value cell must match.
const SPACED: Record<string, RegExp> = {
  "sim://sine(-10, 10, 0.2)": /^-?\d/,
  "sim://ramp(0, 10, 1, 0.5)": /^\d/,
  "sim://flipflop( 2 )": /^(0|1|true|false)/i,
  'loc://msg("Hello World")': /^Hello World$/,
  "loc://arr(1, 2, 3)": /^\[3 values: 1\.00, 2\.00, 3\.00, …\]$/,
  'loc://e<VEnum>(0, "A", "B")': /^A$/,
};
// Phoebus sim names that used to fail silently: each must show a value.
const SIM = ["sim://sinewave()", "sim://sinewave", "sim://gaussianNoise", "sim://noiseWave", "sim://sawtooth", "sim://const(5)", "sim://strings", "sim://intermittent"];
const BAD = "sim://no_such_function(1)";
const PVS = [...Object.keys(SPACED), ...SIM, BAD];

/** The row of `pv`: a CSS string literal takes JSON's escapes, so quotes in a name are safe. */
const row = (page: Page, pv: string) => page.locator(`tr[data-pv=${JSON.stringify(pv)}]`);

describe("cs-web-lib with Phoebus PV names through pvwire", () => {
  let stack: Stack;
  let shown: CsWebLibPage;
  let page: Page;
  // Every text frame the page's cs-web-lib socket received from /pvws/pv.
  const frames: string[] = [];

  beforeAll(async () => {
    // With an admin group a request from this machine is no longer an administrator's; the
    // page's origin may read the server cross-origin, as a site's screens on their own host do.
    const dir = mkdtempSync(join(tmpdir(), "pvwire-cs-names-"));
    writeFileSync(join(dir, "settings.toml"), 'cors_origins = ["*"]\n');
    stack = await startStack(["--admin-group", "operators", "--config", join(dir, "settings.toml")]);
    shown = await openCsWebLibPage(stack.url, []);
    page = shown.page;
    page.on("websocket", (ws) => {
      if (ws.url().endsWith("/pvws/pv")) ws.on("framereceived", (f) => { if (typeof f.payload === "string") frames.push(f.payload); });
    });
    // The same page, given names that hold commas as a JSON list (the comma-separated `pvs` cannot).
    const url = new URL(page.url());
    url.searchParams.delete("pvs");
    url.searchParams.set("pvlist", JSON.stringify(PVS));
    await page.goto(url.toString());
  });
  afterAll(async () => {
    await shown?.close();
    await stack?.stop();
  });

  it("shows live values of names written with spaces", async () => {
    for (const [pv, shows] of Object.entries(SPACED)) {
      await row(page, pv).locator('[data-testid="value"]', { hasText: shows }).waitFor({ timeout: 20_000 });
      expect(await row(page, pv).getAttribute("data-connected")).toBe("true");
    }
    // The sine keeps moving within its range.
    const sine = row(page, "sim://sine(-10, 10, 0.2)").locator('[data-testid="value"]');
    const before = (await sine.textContent())!;
    await page.waitForFunction(([sel, b]) => document.querySelector(sel)?.textContent !== b,
      [`tr[data-pv=${JSON.stringify("sim://sine(-10, 10, 0.2)")}] [data-testid="value"]`, before] as const, { timeout: 20_000 });
    const now = Number(await sine.textContent());
    expect(now).toBeGreaterThanOrEqual(-10);
    expect(now).toBeLessThanOrEqual(10);
    const ramp = Number(await row(page, "sim://ramp(0, 10, 1, 0.5)").locator('[data-testid="value"]').textContent());
    expect(ramp).toBeGreaterThanOrEqual(0);
    expect(ramp).toBeLessThanOrEqual(10);
    expect(shown.errors).toEqual([]);
  });

  it("shows a value for every Phoebus sim name that used to fail silently", async () => {
    for (const pv of SIM) {
      // data-updates counts the values the row rendered; "intermittent" may disconnect again.
      await page.locator(`tr[data-pv=${JSON.stringify(pv)}]:not([data-updates="0"])`).waitFor({ timeout: 20_000 });
    }
    await row(page, "sim://const(5)").locator('[data-testid="value"]', { hasText: /^5(\.0+)?$/ }).waitFor({ timeout: 10_000 });
    expect(await row(page, "sim://strings").locator('[data-testid="value"]').textContent()).not.toBe("–");
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "cs-web-lib-names.png"), fullPage: true });
  });

  it("a name that cannot work reaches cs-web-lib's socket as an error, and its row stays empty", async () => {
    // cs-web-lib 0.9.14's pvws connection reads only `update` messages (handleMessage drops the
    // rest): what the page can observe is the frame on its socket and a PV that never connects.
    const isError = (f: string) => {
      const m = JSON.parse(f) as { type?: string; pv?: string; message?: string };
      return m.type === "error" && `${m.pv ?? ""} ${m.message ?? ""}`.includes("no_such_function");
    };
    await until(() => frames.some(isError), 20_000, `an error frame for ${BAD}`);
    expect(await row(page, BAD).getAttribute("data-connected")).toBe("false");
    expect(await row(page, BAD).locator('[data-testid="value"]').textContent()).toBe("–");
    expect(frames.some((f) => { const m = JSON.parse(f) as { type?: string; pv?: string }; return m.type === "update" && m.pv === BAD; })).toBe(false);
  });

  it("/pvws/info answers the page's origin with JSON; /pvws/summary is refused to a non-administrator", async () => {
    const got = await page.evaluate(async (server) => {
      const one = async (path: string) => { const r = await fetch(server + path); return { status: r.status, type: r.headers.get("content-type"), body: await r.text() }; };
      return { info: await one("/pvws/info"), summary: await one("/pvws/summary") };
    }, stack.url);
    expect(got.info.status).toBe(200);
    expect(got.info.type).toMatch(/^application\/json/);
    expect(JSON.parse(got.info.body)).toHaveProperty("start_time");
    expect(got.summary.status).toBe(403);
    expect(got.summary.body).toMatch(/not an administrator/);
  });
});
