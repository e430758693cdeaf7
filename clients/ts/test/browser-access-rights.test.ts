// The demo page's put box follows the IOC's access rights as they change, in headless Chromium:
// an IOC enforcing tests/dbs/acf.acf moves ACF:FLIP to a read-only access security group and
// back (`dbpf ACF:FLIP.ASG ...`), then to one that may not even read it, pvwire's own rules
// letting everyone write it all along. The TypeScript client's `writable` follows the same way.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { PvwireClient, type ChannelState, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const STATIC = join(import.meta.dirname, "../../../server/pvwire/static/index.html");
const DBS = join(import.meta.dirname, "../../../tests/dbs");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`) ?? (existsSync(STATIC) ? undefined : "page not built (npm run build)");
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`browser tests cannot run: ${skip}`);

const PV = "ACF:FLIP";

describe("the put box follows the IOC's access rights", () => {
  let stack: Stack;
  let browser: BrowserContext;
  let page: Page;
  let profile: string;
  let client: PvwireClient;
  let latest: ChannelState | undefined;

  /** Wait until the row's put box is enabled (or disabled). */
  async function putBoxEnabled(enabled: boolean): Promise<void> {
    await page.waitForFunction(([name, want]) => {
      const input = document.querySelector(`tr[data-pv="${name}"] [data-testid="put-input"]`) as HTMLInputElement | null;
      return input !== null && input.disabled !== want;
    }, [PV, enabled] as const, { timeout: 30_000 });
  }

  beforeAll(async () => {
    stack = await startStack(["--write-rule", `ca://${PV}`], { PVWIRE_STACK_DB: join(DBS, "acf.db"), PVWIRE_STACK_ACF: join(DBS, "acf.acf") });
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
    client.subscribe([PV], (st) => { latest = st; });
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1400, height: 800 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    page = browser.pages()[0] ?? (await browser.newPage());
    await page.goto(`${stack.url}/?pvs=${PV}`);
    await page.locator(`tr[data-pv="${PV}"]`).waitFor({ timeout: 30_000 });
  });
  afterAll(async () => {
    client?.close();
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await stack?.stop();
  });

  it("greys out when the record turns read-only at the IOC, and comes back", async () => {
    await putBoxEnabled(true);
    await until(() => latest?.writable === true, 30_000, "writable in the TypeScript client");

    await stack.command(`dbpf ${PV}.ASG READONLY`);
    await putBoxEnabled(false);
    expect(await page.locator(`tr[data-pv="${PV}"] form`).getAttribute("title")).toBe("the IOC refuses writes to this channel");
    await until(() => latest?.writable === false && latest.metadata.writable === false, 30_000, "writable false in the TypeScript client");

    await stack.command(`dbpf ${PV}.ASG DEFAULT`);
    await putBoxEnabled(true);
    await until(() => latest?.writable === true, 30_000, "writable again in the TypeScript client");
  });

  it("greys out when the record turns unreadable too (no value comes to say so)", async () => {
    await stack.command(`dbpf ${PV}.ASG NOACCESS`);
    await putBoxEnabled(false);
    await until(() => latest?.writable === false, 30_000, "writable false in the TypeScript client");
    await stack.command(`dbpf ${PV}.ASG DEFAULT`);
    await putBoxEnabled(true);
  });
});
