// Arrays of every integer width through the real cs-web-lib (npm) in headless Chromium, from the
// IOC of tests/dbs/alltypes.db over CA and PVA and from sim images: what its pvws decoding shows is
// what docs/PVWS.md section 4 says. The reported case: a PVA ubyte[] [0, 255, 1] showed as 0, -1, 1
// because every uint8 array travelled as b64byt, which cs-web-lib decodes as signed bytes.
// Saves test-artifacts/cs-web-lib-types.png.
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CHROMIUM, openCsWebLibPage, type CsWebLibPage } from "./cs-web-lib/harness.js";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const ARTIFACTS = join(import.meta.dirname, "../../../test-artifacts");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`);
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`cs-web-lib tests cannot run: ${skip}`);

const IMAGE = "sim://image?dtype=uint8&width=4&height=2";
// PV -> what the page's value cell shows (the first three elements, as cs-web-lib decoded them).
const SHOWS: Record<string, string> = {
  "pva://AT:WF:UCHAR": "[3 values: 0.00, 255.00, 1.00, …]",
  "pva://AT:WF:USHORT": "[3 values: 0.00, 65535.00, 1.00, …]",
  "pva://AT:WF:CHAR": "[3 values: -128.00, 0.00, 127.00, …]",
  "pva://AT:WF:SHORT": "[3 values: -32768.00, 0.00, 32767.00, …]",
  "pva://AT:WF:LONG": "[3 values: -2147483648.00, 0.00, 2147483647.00, …]",
  // CA has one char type, read as signed by pvws' Java client: UCHAR 255 shows as -1 through pvws
  // and through pvwire alike (docs/PVWS.md section 4).
  "ca://AT:WF:UCHAR": "[3 values: 0.00, -1.00, 1.00, …]",
  "ca://AT:WF:USHORT": "[3 values: 0.00, 65535.00, 1.00, …]",
};
const PVS = [...Object.keys(SHOWS), IMAGE];

describe("cs-web-lib shows integer arrays as pvws sends them", () => {
  let stack: Stack;
  let shown: CsWebLibPage;

  beforeAll(async () => {
    stack = await startStack([], { PVWIRE_STACK_DB: join(import.meta.dirname, "../../../tests/dbs/alltypes.db") });
    shown = await openCsWebLibPage(stack.url, PVS);
  });
  afterAll(async () => {
    await shown?.close();
    await stack?.stop();
  });

  it("PVA unsigned bytes show 0..255, every other width its own range", async () => {
    for (const [pv, text] of Object.entries(SHOWS)) {
      await shown.page.locator(`tr[data-pv="${pv}"] [data-testid="value"]`, { hasText: text }).waitFor({ timeout: 20_000 });
      expect(await shown.text(pv, "value")).toBe(text);
    }
    expect(shown.errors).toEqual([]);
  });

  it("a uint8 sim image shows no negative pixel", async () => {
    const cell = shown.page.locator(`tr[data-pv="${IMAGE}"] [data-testid="value"]`, { hasText: /^\[8 values: / });
    await cell.waitFor({ timeout: 20_000 });
    expect(await cell.textContent()).toMatch(/^\[8 values: \d+\.00, \d+\.00, \d+\.00, …\]$/);
    mkdirSync(ARTIFACTS, { recursive: true });
    await shown.page.screenshot({ path: join(ARTIFACTS, "cs-web-lib-types.png"), fullPage: true });
  });
});
