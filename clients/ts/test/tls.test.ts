// pvwire's own TLS (`--tls-cert`, `--tls-key`, a certificate of a test CA: tests/certs.py) from
// the TypeScript side: the client under Node over https and wss with Node's own fetch and
// WebSocket, trusting the CA through NODE_EXTRA_CA_CERTS (and refusing the server without it);
// the demo page served by pvwire over https in headless Chromium, its stream over wss; cs-web-lib
// (npm) over wss, and /pvws/info fetched over https from the page as cs-web-lib 0.10 asks it
// before switching to a host. Chromium trusts the certificate by the hash of its key.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CHROMIUM, openCsWebLibPage } from "./cs-web-lib/harness.js";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const DIST = join(import.meta.dirname, "../dist/index.js");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`) ?? (existsSync(DIST) ? undefined : "client not built (npm run build)");
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`TLS tests cannot run: ${skip}`);

const P = "PVWIRE:DEMO:";

/** A Node process running the built client with Node's global fetch and WebSocket: the first
 * CONNECTED value of the counter it streams, or the error it stopped with. */
function nodeClient(url: string, env: Record<string, string>): Promise<{ value?: number; error?: string }> {
  const script = `
    import { PvwireClient } from ${JSON.stringify(DIST)};
    const client = new PvwireClient(${JSON.stringify(url)}, { backoff: { baseMs: 100, maxMs: 200 } });
    const done = (doc) => { process.stdout.write(JSON.stringify(doc) + "\\n"); client.close(); process.exit(0); };
    const sub = client.subscribe(["ca://${P}COUNTER"], (ch) => {
      if (ch.connection === "CONNECTED" && typeof ch.value === "number") done({ value: ch.value });
    }, { onError: (e) => done({ error: e.message }) });
    client.on("retry", () => done({ error: "the stream could not connect" }));
    sub.ready.catch((e) => done({ error: e.message }));`;
  return new Promise((resolve, reject) => {
    const { NODE_EXTRA_CA_CERTS: _, ...inherited } = process.env;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { env: { ...inherited, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => { out += d.toString(); });
    child.stderr.on("data", (d: Buffer) => { err += d.toString(); });
    const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
    child.on("exit", () => {
      clearTimeout(timer);
      const line = out.trim().split("\n").at(-1);
      if (!line) reject(new Error(`the Node client said nothing: ${err.slice(-2000)}`));
      else resolve(JSON.parse(line) as { value?: number; error?: string });
    });
  });
}

describe("pvwire's TLS from TypeScript", () => {
  let stack: Stack;

  beforeAll(async () => {
    stack = await startStack(["--tls"]);
  });
  afterAll(async () => {
    await stack?.stop();
  });

  it("the client under Node streams over https and wss, trusting the CA through NODE_EXTRA_CA_CERTS", async () => {
    expect(stack.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
    const trusted = await nodeClient(stack.url, { NODE_EXTRA_CA_CERTS: stack.ca! });
    expect(trusted.error).toBeUndefined();
    expect(typeof trusted.value).toBe("number");
    // Without the CA, Node does not trust the server: the registration fails.
    const untrusted = await nodeClient(stack.url, {});
    expect(untrusted.value).toBeUndefined();
    expect(untrusted.error).toBeDefined();
  });

  describe("in Chromium", () => {
    let browser: BrowserContext;
    let profile: string;

    beforeAll(async () => {
      profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
      browser = await chromium.launchPersistentContext(profile, {
        executablePath: CHROMIUM,
        headless: true,
        viewport: { width: 1400, height: 1000 },
        args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
          `--ignore-certificate-errors-spki-list=${stack.spki!}`],
      });
    });
    afterAll(async () => {
      await browser?.close();
      if (profile) rmSync(profile, { recursive: true, force: true });
    });

    it("the demo page is served over https and streams over wss", async () => {
      const page = browser.pages()[0] ?? (await browser.newPage());
      const errors: string[] = [];
      page.on("pageerror", (e) => errors.push(e.message));
      const sockets: string[] = [];
      page.on("websocket", (ws) => sockets.push(ws.url()));
      await page.goto(`${stack.url}/`);
      await page.locator('[data-testid="conn-state"]', { hasText: "connected" }).waitFor({ timeout: 30_000 });
      await page.waitForFunction(() => document.querySelector('tr[data-pv$="COUNTER"] [data-testid="conn"]')?.textContent?.startsWith("CONNECTED"), null, { timeout: 30_000 });
      const before = await page.locator('tr[data-pv$="COUNTER"] [data-testid="value"]').textContent();
      await page.waitForFunction((b) => document.querySelector('tr[data-pv$="COUNTER"] [data-testid="value"]')?.textContent !== b, before, { timeout: 15_000 });
      expect(sockets.length).toBeGreaterThan(0);
      expect(sockets.every((u) => u.startsWith("wss://"))).toBe(true);
      expect(errors).toEqual([]);
    });

    it("cs-web-lib streams over wss, and /pvws/info answers over https as cs-web-lib 0.10 asks", async () => {
      const pvs = [`ca://${P}COUNTER`, `ca://${P}SINE`];
      const shown = await openCsWebLibPage(stack.url, pvs, 1300, "page.ts", stack.spki);
      try {
        const { page, errors } = shown;
        for (const pv of pvs) await page.locator(`tr[data-pv="${pv}"][data-connected="true"]`).waitFor({ timeout: 30_000 });
        const before = await shown.text(`ca://${P}COUNTER`, "value");
        await page.waitForFunction((b) => document.querySelector('tr[data-pv="ca://PVWIRE:DEMO:COUNTER"] [data-testid="value"]')?.textContent !== b, before, { timeout: 15_000 });
        // cs-web-lib 0.10's PvwsPlugin.updatePvwsHost: `fetch(https://HOST/pvws/info)` from the
        // page (another origin), switching to HOST only when the answer is ok.
        const host = new URL(stack.url).host;
        const info = await page.evaluate(async (h) => {
          const r = await fetch(`https://${h}/pvws/info`);
          return { ok: r.ok, body: await r.text() };
        }, host);
        expect(info.ok).toBe(true);
        expect(JSON.parse(info.body)).toHaveProperty("start_time");
        expect(errors).toEqual([]);
      } finally {
        await shown.close();
      }
    });
  });
});
