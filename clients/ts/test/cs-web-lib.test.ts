// Diamond's cs-web-lib (from npm, unchanged) against pvwire's /pvws/pv in headless Chromium: a
// page built at test time from test/cs-web-lib/page.ts, served from its own origin as a site's
// screens are, connects with cs-web-lib's own pvws connection and shows live PVs of the demo IOC
// (numbers with units and precision, an enum label, a string, a waveform from base64, over CA and
// PVA). pvwire's `server` query sees it as a pvws client. Saves test-artifacts/cs-web-lib-page.png.
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CHROMIUM, openCsWebLibPage, type CsWebLibPage } from "./cs-web-lib/harness.js";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const ARTIFACTS = join(import.meta.dirname, "../../../test-artifacts");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`);
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`cs-web-lib tests cannot run: ${skip}`);

const P = "PVWIRE:DEMO:";
const PVS = [`ca://${P}COUNTER`, `ca://${P}SINE`, `ca://${P}MODE`, `ca://${P}MESSAGE`, `ca://${P}WAVEFORM`, `pva://${P}SP`, `loc://pvwire_test(42)`];

describe("cs-web-lib's pvws connection against pvwire", () => {
  let stack: Stack;
  let shown: CsWebLibPage;
  let page: Page;
  let errors: string[];
  const text = (pv: string, cell: string) => shown.text(pv, cell);

  beforeAll(async () => {
    // Local PVs are written by screens for their own state: a site allows it with a write rule.
    stack = await startStack(["--write-rule", "loc://*"]);
    shown = await openCsWebLibPage(stack.url, PVS);
    ({ page, errors } = shown);
  });
  afterAll(async () => {
    await shown?.close();
    await stack?.stop();
  });

  it("connects every PV and shows its first value with metadata", async () => {
    for (const pv of PVS) {
      await page.locator(`tr[data-pv="${pv}"][data-connected="true"]`).waitFor({ timeout: 15_000 });
    }
    await page.waitForFunction(() => document.querySelector('tr[data-pv$="DEMO:SINE"] [data-testid="value"]')?.textContent !== "–", null, { timeout: 10_000 });
    expect(await text(`ca://${P}SINE`, "units")).toBe("V");
    expect(await text(`ca://${P}SINE`, "alarm")).toBe("valid");
    expect(await text(`pva://${P}SP`, "units")).toBe("mm");
    expect(await text(`pva://${P}SP`, "value")).toMatch(/^-?\d+\.\d{3}$/); // PREC 3
    expect(await text(`ca://${P}MESSAGE`, "value")).not.toBe("–");
    expect(await text(`loc://pvwire_test(42)`, "value")).toBe("42");
    // The enum shows one of its labels, not its index.
    const mode = (await text(`ca://${P}MODE`, "value"))!;
    expect(mode).not.toMatch(/^\d+$/);
    expect(mode.length).toBeGreaterThan(0);
    // The waveform arrives as base64 doubles and cs-web-lib decodes all 1000 of them.
    await page.locator(`tr[data-pv="ca://${P}WAVEFORM"] [data-testid="value"]`, { hasText: /^\[1000 values: / }).waitFor({ timeout: 10_000 });
    expect(await text(`ca://${P}COUNTER`, "time")).toMatch(/^\d{4}-\d\d-\d\dT/);
    expect(errors).toEqual([]);
  });

  it("keeps updating: the counter and the waveform change", async () => {
    for (const name of ["COUNTER", "WAVEFORM"]) {
      const before = await text(`ca://${P}${name}`, "value");
      await page.waitForFunction(([n, b]) => document.querySelector(`tr[data-pv="ca://PVWIRE:DEMO:${n}"] [data-testid="value"]`)?.textContent !== b, [name, before], { timeout: 10_000 });
    }
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "cs-web-lib-page.png"), fullPage: true });
  });

  it("writes through cs-web-lib's write action: the IOC has the value and the page shows it", async () => {
    const target = (Math.round(Math.random() * 40_000) / 1000 + 5).toFixed(3);
    const sp = page.locator(`tr[data-pv="pva://${P}SP"]`);
    await sp.locator('[data-testid="write-input"]').fill(target);
    await sp.locator('[data-testid="write-button"]').click();
    await sp.locator('[data-testid="value"]', { hasText: new RegExp(`^${target.replace(".", "\\.")}$`) }).waitFor({ timeout: 10_000 });
    const res = await fetch(`${stack.url}/graphql`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ query: `{ channel(id: "ca://${P}SP") { value } }` }),
    });
    expect(((await res.json()) as { data: { channel: { value: number } } }).data.channel.value).toBeCloseTo(Number(target), 6);
    // A loc:// PV takes a write too, and every subscriber of it sees the new value.
    const loc = page.locator('tr[data-pv="loc://pvwire_test(42)"]');
    await loc.locator('[data-testid="write-input"]').fill("17");
    await loc.locator('[data-testid="write-button"]').click();
    await loc.locator('[data-testid="value"]', { hasText: /^17$/ }).waitFor({ timeout: 10_000 });
    expect(errors).toEqual([]);
  });

  it("is a pvws client of pvwire, holding its channels", async () => {
    const res = await fetch(`${stack.url}/graphql`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ query: "{ server { clients { endpoint channels } } }" }),
    });
    const body = (await res.json()) as { data: { server: { clients: { endpoint: string; channels: number }[] } } };
    const pvws = body.data.server.clients.filter((c) => c.endpoint === "pvws");
    expect(pvws).toHaveLength(1);
    expect(pvws[0]!.channels).toBe(PVS.length);
  });
});
