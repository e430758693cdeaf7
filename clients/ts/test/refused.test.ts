// A connection the server refuses as it opens (an Origin not allowed: 1008) reaches the browser,
// and the client, with the code the server sent. A browser fails a handshake in which the server
// selects none of the subprotocols it offered, and then reports 1006, a reconnect code: the client
// retried forever instead of stopping. Headless Chromium (Debian's /usr/bin/chromium through
// playwright-core) against the real server and demo IOC (test/launch_stack.py).
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { PvwireClient, StreamClosedError, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`);
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`refusal tests cannot run: ${skip}`);

const ALLOWED = "https://controls.example.org";

/** Node's `ws` sends no Origin unless told: this one says it comes from a page elsewhere. */
class ElsewhereWebSocket extends WebSocket {
  constructor(url: string, protocols?: string | string[]) {
    super(url, protocols, { origin: "https://elsewhere.example.org" });
  }
}

describe("a connection refused as it opens", () => {
  let stack: Stack;
  let browser: BrowserContext;
  let profile: string;

  beforeAll(async () => {
    stack = await startStack([], { PVWIRE_ALLOWED_ORIGINS: ALLOWED });
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
  });
  afterAll(async () => {
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await stack?.stop();
  });

  it("closes with 1008 in a browser on another origin, not 1006", async () => {
    const page = browser.pages()[0] ?? (await browser.newPage());
    await page.goto(`${stack.url}/healthz`); // an origin the server does not allow
    const code = await page.evaluate(() => new Promise<number>((resolve) => {
      // The page's own WebSocket (a bare `WebSocket` here would name this module's import of ws).
      const ws = new globalThis.WebSocket(`${location.origin.replace("http", "ws")}/stream`, ["pvwire.v1.aligned", "pvwire.v1"]);
      ws.onclose = (e) => resolve(e.code);
    }));
    expect(code).toBe(1008);
  });

  it("stops the client with the terminal 1008 instead of retrying", async () => {
    const client = new PvwireClient(stack.url, { WebSocket: ElsewhereWebSocket as unknown as WebSocketConstructor });
    const retries: number[] = [];
    client.on("retry", (delayMs) => retries.push(delayMs));
    try {
      const sub = client.subscribe([`ca://${stack.prefix}COUNTER`], () => undefined, { onError: () => undefined });
      const failed = await sub.ready.then(() => undefined, (e: unknown) => e);
      expect(failed).toBeInstanceOf(StreamClosedError);
      expect((failed as StreamClosedError).code).toBe(1008);
      expect(retries).toEqual([]);
    } finally {
      client.close();
    }
  });
});
