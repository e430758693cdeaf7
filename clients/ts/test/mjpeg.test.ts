// pvwire's /mjpeg in headless Chromium: cs-web-lib's Image widget (npm, unchanged) shows the demo
// IOC's PVA NTNDArray image, and a plain <img> the RGB sim test card, both live MJPEG streams
// from another origin, as a site's screens load them; and <img>s at the URLs cs-web-lib 0.10.24's
// Image widget builds, one of an image that never changes. Saves test-artifacts/mjpeg-page.png.
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { build } from "esbuild";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = join(import.meta.dirname, "../../../test-artifacts");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`);
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`MJPEG browser tests cannot run: ${skip}`);

async function buildPage(dir: string): Promise<void> {
  await build({
    entryPoints: [join(import.meta.dirname, "cs-web-lib/image-page.ts")],
    bundle: true,
    format: "esm",
    target: "es2022",
    outfile: join(dir, "page.js"),
    logLevel: "warning",
    define: { "process.env.NODE_ENV": '"production"', "process.env": "{}", "import.meta.env": "{}" },
  });
  // Sizes fixed with !important: cs-web-lib's global styles stretch every <img>.
  writeFileSync(join(dir, "index.html"), '<!doctype html><html><head><meta charset="utf-8"><title>MJPEG from pvwire</title>'
    + "<style>#plain{width:320px!important;height:240px!important}</style></head>"
    + '<body><div style="display:flex;gap:16px;align-items:flex-start"><div id="widget" style="position:relative;width:256px;height:256px;flex:none"></div>'
    + '<img id="plain" alt="plain img"></div><script type="module" src="page.js"></script></body></html>');
}

async function serve(dir: string): Promise<Server> {
  const server = createServer((req, res) => {
    const js = (req.url ?? "/").split("?")[0] === "/page.js";
    res.writeHead(200, { "content-type": js ? "text/javascript" : "text/html" });
    res.end(readFileSync(join(dir, js ? "page.js" : "index.html")));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

/**
 * The MJPEG URLs cs-web-lib 0.10.24's Image widget tries, in order (`buildMjpgPvUrls`,
 * src/ui/widgets/DynamicImage/demoImage.tsx): each endpoint, "/", then the PV name as it is (not
 * encoded) but for `pva://` cut off its start and `:ARRAY` at its end renamed `:OUTPUT`; its own
 * "disconnected" picture last.
 */
function csWebLibMjpegUrls(endpoints: (string | null | undefined)[] | undefined, pvName: string): string[] {
  if (!pvName || !endpoints || endpoints.length === 0) return [];
  const name = pvName.replace(/^pva:\/\//, "").replace(/:ARRAY$/, ":OUTPUT");
  const urls = endpoints.filter((e): e is string => e != null).map((e) => `${e}/${name}`);
  return [...urls, "/images/disconnectedImage.svg"];
}

/** What an element shows now, as PNG bytes (the images are cross-origin: no canvas readback). */
async function shot(page: Page, selector: string): Promise<string> {
  return (await page.locator(selector).screenshot()).toString("base64");
}

describe("MJPEG in Chromium", () => {
  let stack: Stack;
  let web: Server;
  let dir: string;
  let profile: string;
  let browser: BrowserContext;
  let page: Page;
  const errors: string[] = [];

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "pvwire-mjpeg-"));
    [stack] = await Promise.all([startStack(), buildPage(dir)]);
    web = await serve(dir);
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 700, height: 320 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    page = browser.pages()[0] ?? (await browser.newPage());
    page.on("pageerror", (e) => errors.push(e.message));
    const mjpeg = (id: string, query: string) => `${stack.url}/mjpeg/${encodeURIComponent(id)}?${query}`;
    const src = mjpeg(`pva://${stack.prefix}IMAGE`, "maxPixels=65536&fps=10");
    const img = mjpeg("sim://image?width=320&height=240&dtype=uint8&color=RGB1&rate=10", "quality=90");
    const origin = `http://127.0.0.1:${(web.address() as AddressInfo).port}`;
    await page.goto(`${origin}/?src=${encodeURIComponent(src)}&img=${encodeURIComponent(img)}`);
  });
  afterAll(async () => {
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await new Promise((r) => web ? web.close(r) : r(undefined));
    if (dir) rmSync(dir, { recursive: true, force: true });
    await stack?.stop();
  });

  it("shows the frames at their size, in cs-web-lib's Image widget and in a plain <img>", async () => {
    // The demo image is 512 x 512: maxPixels=65536 keeps every 2nd row and column.
    await page.waitForFunction(() => (document.querySelector("#widget img") as HTMLImageElement | null)?.naturalWidth === 256, null, { timeout: 30_000 });
    await page.waitForFunction(() => (document.getElementById("plain") as HTMLImageElement).naturalWidth === 320, null, { timeout: 30_000 });
    expect(await page.evaluate(() => (document.querySelector("#widget img") as HTMLImageElement).naturalHeight)).toBe(256);
    expect(await page.evaluate(() => (document.getElementById("plain") as HTMLImageElement).naturalHeight)).toBe(240);
    expect(errors).toEqual([]);
  });

  it("shows images at the URLs cs-web-lib 0.10.24 builds, a still one too", async () => {
    const endpoint = `${stack.url}/mjpeg`;
    const [still] = csWebLibMjpegUrls([endpoint], `pva://${stack.prefix}IMAGE:RGB`);
    const [live] = csWebLibMjpegUrls([endpoint], `pva://${stack.prefix}IMAGE`);
    expect(still).toBe(`${endpoint}/${stack.prefix}IMAGE:RGB`); // no scheme: an image channel
    await page.evaluate((srcs) => {
      for (const [id, src] of Object.entries(srcs)) {
        const img = document.createElement("img");
        img.id = id;
        img.src = src;
        document.body.append(img);
      }
    }, { still: still!, live: live! });
    // The 96 x 64 card never changes: it shows because the end of its part comes with it, not
    // with a next frame (which never comes).
    await page.waitForFunction(() => (document.getElementById("still") as HTMLImageElement).naturalWidth === 96, null, { timeout: 30_000 });
    await page.waitForFunction(() => (document.getElementById("live") as HTMLImageElement).naturalWidth === 512, null, { timeout: 30_000 });
    const first = await shot(page, "#live");
    await expect.poll(() => shot(page, "#live"), { timeout: 30_000, interval: 200 }).not.toBe(first);
    expect(errors).toEqual([]);
  });

  it("shows a still picture under 1 KiB from another origin, with a cache-busting parameter", async () => {
    // IMAGE:LZ4's JPEG is ~700 bytes and never changes: Chromium holds a cross-origin <img>
    // response until it has 1,024 bytes, so the part must be longer than its picture.
    const src = `${stack.url}/mjpeg/${stack.prefix}IMAGE:LZ4?t=${Date.now()}`;
    await page.evaluate((url) => {
      const img = document.createElement("img");
      img.id = "small";
      img.src = url;
      document.body.append(img);
    }, src);
    await page.waitForFunction(() => (document.getElementById("small") as HTMLImageElement).naturalWidth === 96, null, { timeout: 30_000 });
    expect(await page.evaluate(() => (document.getElementById("small") as HTMLImageElement).naturalHeight)).toBe(64);
    expect(errors).toEqual([]);
  });

  it("keeps updating: both pictures change", async () => {
    for (const selector of ["#widget img", "#plain"]) {
      const first = await shot(page, selector);
      await expect.poll(() => shot(page, selector), { timeout: 30_000, interval: 200 }).not.toBe(first);
    }
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.evaluate(() => window.scrollTo(0, 0)); // an element screenshot scrolls it into view
    await page.screenshot({ path: join(ARTIFACTS, "mjpeg-page.png") });
  });
});
