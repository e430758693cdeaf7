// Sign-in on the demo page, in headless Chromium, against a real identity provider (Keycloak,
// tests/keycloak.py) and the real server and demo IOC started with --oidc-issuer: the page
// learns the provider from the server, signs in as operator through Keycloak's own login form
// (authorization code + PKCE), puts, has its access token refreshed before it expires, signs
// out, and is refused the put.
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { PvwireClient, type WebSocketConstructor } from "../src/index.js";
import { PYTHON, stackUnavailable, startStack, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const ROOT = join(import.meta.dirname, "../../..");
const STATIC = join(ROOT, "server/pvwire/static/index.html");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`) ?? (existsSync(STATIC) ? undefined : "page not built (npm run build)");
// make test installs every prerequisite (Keycloak too: make keycloak): a missing one is a failure.
if (skip) throw new Error(`browser tests cannot run: ${skip}`);

const P = "PVWIRE:DEMO:";
const RULES = `default = "READ"
[[rule]]
channels = ["ca://${P}SP"]
groups = ["operators"]
access = "WRITE"
`;

interface Keycloak { issuer: string; stop(): Promise<void> }

/** One Keycloak for this file (tests/keycloak.py): started, then stopped at EOF on its stdin. */
async function startKeycloak(): Promise<Keycloak> {
  const proc: ChildProcessWithoutNullStreams = spawn(PYTHON, ["-m", "tests.keycloak"], { cwd: ROOT, stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d: Buffer) => { stderr += d.toString(); });
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: proc.stdout }).once("line", resolve);
    proc.once("exit", (code) => reject(new Error(`Keycloak launcher exited (${code}): ${stderr.slice(-2000)}`)));
  });
  const first = JSON.parse(line) as { issuer?: string; error?: string };
  if (!first.issuer) throw new Error(`Keycloak did not start: ${first.error}`);
  const exited = new Promise((r) => proc.once("exit", r));
  return {
    issuer: first.issuer,
    async stop() {
      proc.stdin.end();
      await Promise.race([exited, new Promise((r) => setTimeout(r, 90_000))]);
      if (proc.exitCode === null) proc.kill("SIGKILL");
    },
  };
}

describe("demo page signing in with the site's identity provider", () => {
  let keycloak: Keycloak;
  let stack: Stack;
  let browser: BrowserContext;
  let page: Page;
  let profile: string;
  let client: PvwireClient;
  const row = (name: string) => page.locator(`tr[data-pv="${name}"]`);
  const putInput = () => row(`${P}SP`).locator('[data-testid="put-input"]');
  const identity = (text: string) => page.locator('[data-testid="identity"]', { hasText: text }).waitFor({ timeout: 60_000 });
  const accessToken = () => page.evaluate(() => {
    const key = Object.keys(sessionStorage).find((k) => k.startsWith("oidc.user:"));
    return key ? (JSON.parse(sessionStorage.getItem(key)!) as { access_token: string }).access_token : "";
  });

  async function iocValue(): Promise<unknown> {
    return (await client.get(`ca://${P}SP`)).value;
  }

  async function putFromThePage(value: string): Promise<void> {
    await putInput().fill(value);
    await row(`${P}SP`).locator('[data-testid="put-button"]').click();
  }

  beforeAll(async () => {
    keycloak = await startKeycloak();
    stack = await startStack(["--oidc-issuer", keycloak.issuer, "--oidc-client-id", "pvwire-page", "--jwt-audience", "pvwire", "--access-rules-toml", RULES]);
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1400, height: 800 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    page = browser.pages()[0] ?? (await browser.newPage());
    await page.goto(`${stack.url}/?pvs=${P}SP,${P}RBV`);
    await row(`${P}SP`).waitFor({ timeout: 30_000 });
  }, 400_000);
  afterAll(async () => {
    client?.close();
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await stack?.stop();
    await keycloak?.stop();
  }, 200_000);

  it("anonymous: a Sign in button, no token field, and the put box disabled", async () => {
    await identity("anonymous");
    await page.locator('[data-testid="sign-in"]').waitFor({ state: "visible", timeout: 30_000 });
    expect(await page.locator('[data-testid="sign-out"]').isVisible()).toBe(false);
    expect(await page.locator('[data-testid="token-input"]').isVisible()).toBe(false);
    await putInput().waitFor({ timeout: 30_000 });
    expect(await putInput().isDisabled()).toBe(true);
  });

  it("signs in as operator through the provider's login form, and puts", async () => {
    await page.locator('[data-testid="sign-in"]').click();
    await page.waitForURL((url) => url.href.startsWith(keycloak.issuer), { timeout: 60_000 });
    await page.locator("#username").fill("operator");
    await page.locator("#password").fill("operator-pass");
    await page.locator("#kc-login").click();
    await page.waitForURL((url) => url.href.startsWith(stack.url), { timeout: 60_000 });
    await identity("operator (operators)");
    // Back where it was: the page's own query kept, the provider's code and state gone.
    expect(page.url()).toContain(`pvs=${P}SP`);
    expect(page.url()).not.toMatch(/[?&](code|state)=/);
    expect(await page.locator('[data-testid="sign-out"]').isVisible()).toBe(true);
    await page.waitForFunction((name) => {
      const input = document.querySelector(`tr[data-pv="${name}"] [data-testid="put-input"]`) as HTMLInputElement | null;
      return input !== null && !input.disabled;
    }, `${P}SP`, { timeout: 30_000 });
    const target = (Math.round(Math.random() * 40_000) / 1000 + 5).toFixed(3);
    await putFromThePage(target);
    const t0 = Date.now();
    let value = await iocValue();
    while (Date.now() - t0 < 30_000 && !(typeof value === "number" && Math.abs(value - Number(target)) < 1e-6)) {
      await new Promise((r) => setTimeout(r, 100));
      value = await iocValue();
    }
    expect(value).toBeCloseTo(Number(target), 6);
    expect(await row(`${P}SP`).locator('[data-testid="put-error"]').textContent()).toBe("");
  });

  it("refreshes the access token before it expires (the realm's tokens live 120 s)", async () => {
    const first = await accessToken();
    expect(first).not.toBe("");
    await page.waitForFunction((old) => {
      const key = Object.keys(sessionStorage).find((k) => k.startsWith("oidc.user:"));
      return key !== undefined && (JSON.parse(sessionStorage.getItem(key)!) as { access_token: string }).access_token !== old;
    }, first, { timeout: 150_000, polling: 500 });
    await identity("operator (operators)");
    // The refreshed token is the one the page uses: a put still goes through.
    const target = (Math.round(Math.random() * 40_000) / 1000 + 50).toFixed(3);
    await putFromThePage(target);
    const t0 = Date.now();
    let value = await iocValue();
    while (Date.now() - t0 < 30_000 && !(typeof value === "number" && Math.abs(value - Number(target)) < 1e-6)) {
      await new Promise((r) => setTimeout(r, 100));
      value = await iocValue();
    }
    expect(value).toBeCloseTo(Number(target), 6);
  }, 240_000);

  it("signs out, at the provider too, and the put is refused", async () => {
    const before = await iocValue();
    await page.locator('[data-testid="sign-out"]').click();
    await page.waitForURL((url) => url.href.startsWith(stack.url), { timeout: 60_000 });
    await identity("anonymous");
    expect(await accessToken()).toBe("");
    await page.waitForFunction((name) => {
      const input = document.querySelector(`tr[data-pv="${name}"] [data-testid="put-input"]`) as HTMLInputElement | null;
      return input !== null && input.disabled;
    }, `${P}SP`, { timeout: 30_000 });
    // The disabled box switched back on by hand: the server refuses anonymous.
    await page.evaluate((name) => {
      for (const el of document.querySelectorAll(`tr[data-pv="${name}"] form input, tr[data-pv="${name}"] form button`)) (el as HTMLInputElement).disabled = false;
    }, `${P}SP`);
    await putFromThePage("1.5");
    const error = row(`${P}SP`).locator('[data-testid="put-error"]');
    await error.locator("xpath=self::*[@data-code='WRITE_DENIED']").waitFor({ timeout: 30_000 });
    expect(await iocValue()).toBe(before);
    // Signed out at the provider: Sign in asks for the password again.
    await page.locator('[data-testid="sign-in"]').click();
    await page.locator("#password").waitFor({ timeout: 60_000 });
  });
});
