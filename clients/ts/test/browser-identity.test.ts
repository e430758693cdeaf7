// The demo page with a token, in headless Chromium, against the real server and demo IOC started
// with a JWT secret and access rules (operators may write SP, everyone else reads). JWTs are
// minted here (HS256 with Node's HMAC). As operator a put from the page reaches the IOC; as viewer
// the put box is disabled and a forged put is refused with WRITE_DENIED; the token stays in
// sessionStorage, never in the URL.
import { createHmac } from "node:crypto";
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

const SECRET = "page-identity-test-secret-0123456789-abcdef";
const P = "PVWIRE:DEMO:";
const RULES = `default = "READ"
[[rule]]
channels = ["ca://${P}SP"]
groups = ["operators"]
access = "WRITE"
`;

/** An HS256 JWT: base64url(header).base64url(claims).base64url(HMAC-SHA256 of the two). */
function mint(user: string, groups: string[], ttlSeconds = 600): string {
  const now = Math.floor(Date.now() / 1000);
  const part = (o: object) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const head = part({ alg: "HS256", typ: "JWT" });
  const body = part({ sub: user, preferred_username: user, groups, iat: now, exp: now + ttlSeconds, aud: "pvwire" });
  const signature = createHmac("sha256", SECRET).update(`${head}.${body}`).digest("base64url");
  return `${head}.${body}.${signature}`;
}

const OPERATOR = mint("olga", ["operators"]);
const VIEWER = mint("vic", ["viewers"]);

describe("demo page with a token in Chromium", () => {
  let stack: Stack;
  let browser: BrowserContext;
  let page: Page;
  let profile: string;
  let client: PvwireClient;
  let lastPut = NaN;
  const row = (name: string) => page.locator(`tr[data-pv="${name}"]`);
  const putInput = () => row(`${P}SP`).locator('[data-testid="put-input"]');

  async function useToken(token: string, identity: string): Promise<void> {
    await page.locator('[data-testid="token-input"]').fill(token);
    await page.locator('[data-testid="token-button"]').click();
    await page.locator('[data-testid="identity"]', { hasText: identity }).waitFor({ timeout: 15_000 });
  }

  async function iocValue(): Promise<unknown> {
    return (await client.get(`ca://${P}SP`)).value;
  }

  beforeAll(async () => {
    stack = await startStack(["--jwt-secret", SECRET, "--jwt-audience", "pvwire", "--access-rules-toml", RULES]);
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor, getToken: () => OPERATOR });
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1400, height: 800 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    page = browser.pages()[0] ?? (await browser.newPage());
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(`${stack.url}/?token-field&pvs=${P}SP,${P}RBV`);
    await row(`${P}SP`).waitFor({ timeout: 30_000 });
    expect(errors).toEqual([]);
  });
  afterAll(async () => {
    client?.close();
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await stack?.stop();
  });

  it("anonymous: the put box is there but disabled, and says why", async () => {
    await page.locator('[data-testid="identity"]', { hasText: "anonymous" }).waitFor({ timeout: 15_000 });
    await putInput().waitFor({ timeout: 30_000 });
    expect(await putInput().isDisabled()).toBe(true);
    expect(await row(`${P}SP`).locator("form").getAttribute("title")).toMatch(/read-only for anonymous/);
  });

  it("as operator: the put box is enabled and a put from the page reaches the IOC", async () => {
    await useToken(OPERATOR, "olga (operators)");
    await page.waitForFunction((name) => {
      const input = document.querySelector(`tr[data-pv="${name}"] [data-testid="put-input"]`) as HTMLInputElement | null;
      return input !== null && !input.disabled;
    }, `${P}SP`, { timeout: 30_000 });
    const target = (Math.round(Math.random() * 40_000) / 1000 + 5).toFixed(3);
    await putInput().fill(target);
    await row(`${P}SP`).locator('[data-testid="put-button"]').click();
    const t0 = Date.now();
    let value = await iocValue();
    while (Date.now() - t0 < 30_000 && !(typeof value === "number" && Math.abs(value - Number(target)) < 1e-6)) {
      await new Promise((r) => setTimeout(r, 100));
      value = await iocValue();
    }
    expect(value).toBeCloseTo(Number(target), 6);
    lastPut = Number(target);
    expect(await row(`${P}SP`).locator('[data-testid="put-error"]').textContent()).toBe("");
    // The token is kept for this tab only, and never put in the address.
    expect(await page.evaluate(() => sessionStorage.getItem("pvwire.token"))).toBe(OPERATOR);
    expect(page.url()).not.toContain(OPERATOR.slice(0, 20));
  });

  it("as viewer: the put box is disabled and a forged put is refused with WRITE_DENIED", async () => {
    await useToken(VIEWER, "vic (viewers)");
    await page.waitForFunction((name) => {
      const input = document.querySelector(`tr[data-pv="${name}"] [data-testid="put-input"]`) as HTMLInputElement | null;
      return input !== null && input.disabled;
    }, `${P}SP`, { timeout: 30_000 });
    expect(await row(`${P}SP`).locator("form").getAttribute("title")).toBe("read-only for this identity");
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "demo-page-viewer.png"), fullPage: true });

    // Forged in the page: the disabled box switched back on by hand; the server still refuses,
    // and the refusal shows in the row.
    await page.evaluate((name) => {
      for (const el of document.querySelectorAll(`tr[data-pv="${name}"] form input, tr[data-pv="${name}"] form button`)) (el as HTMLInputElement).disabled = false;
    }, `${P}SP`);
    await putInput().fill("1.5");
    await row(`${P}SP`).locator('[data-testid="put-button"]').click();
    const error = row(`${P}SP`).locator('[data-testid="put-error"]');
    await error.locator("xpath=self::*[@data-code='WRITE_DENIED']").waitFor({ timeout: 30_000 });
    expect(await error.textContent()).toMatch(/^write denied: .*vic/);

    // Forged outside the page: the GraphQL mutation with the viewer's token.
    const res = await fetch(`${stack.url}/graphql`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${VIEWER}` },
      body: JSON.stringify({ query: `mutation { put(id: "ca://${P}SP", value: 2.5) { ok } }` }),
    });
    const doc = (await res.json()) as { errors?: { extensions?: { code?: string } }[] };
    expect(doc.errors?.[0]?.extensions?.code).toBe("WRITE_DENIED");
    expect(await iocValue()).toBeCloseTo(lastPut, 6);
  });

  it("keeps the token across a reload of the tab, and an empty token is anonymous again", async () => {
    await page.reload();
    await page.locator('[data-testid="identity"]', { hasText: "vic (viewers)" }).waitFor({ timeout: 15_000 });
    await page.locator('[data-testid="token-input"]').fill("");
    await page.locator('[data-testid="token-button"]').click();
    await page.locator('[data-testid="identity"]', { hasText: "anonymous" }).waitFor({ timeout: 15_000 });
    expect(await page.evaluate(() => sessionStorage.getItem("pvwire.token"))).toBeNull();
  });
});
