// Images end to end: the demo IOC's real PVA NTNDArrays (a p4p server in its process) through
// the real server to the TypeScript client and to the page's canvas, pixel for pixel; plus the
// ImageView's pixel conversion for every colour mode (unit).
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { colorMapTable, imageGeometry, NdArray, PvwireClient, renderFrame, type ChannelState, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = join(import.meta.dirname, "../../../test-artifacts");
const STATIC = join(import.meta.dirname, "../../../server/pvwire/static/index.html");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`) ?? (existsSync(STATIC) ? undefined : "page not built (npm run build)");
if (skip) throw new Error(`image tests cannot run: ${skip}`);

const P = "pva://PVWIRE:DEMO:";
// pvwire_dev.demo_images: the RGB1 test card, 96 x 64; IMAGE:LZ4 is its red plane x 257, lz4.
const W = 96;
const H = 64;
const card = (x: number, y: number): [number, number, number] => [(x * 2) % 256, (y * 4) % 256, (x + y) % 256];

describe("ImageView pixel conversion", () => {
  const grey = colorMapTable("grey");
  const rgba = (px: number) => [px & 0xff, (px >>> 8) & 0xff, (px >>> 16) & 0xff, px >>> 24];

  it("maps a fixed range onto the colour map by 256 equal bins", () => {
    const out = new Uint32Array(4);
    renderFrame(out, new Uint16Array([0, 257 * 7, 65535, 300]), imageGeometry([2, 2], "mono"), 0, 65535, grey);
    expect([...out].map((p) => rgba(p)[0])).toEqual([0, 7, 255, 1]);
    renderFrame(out, new Float64Array([-1, 0.5, 2, 1]), imageGeometry([1, 4], "mono"), 0, 1, grey);
    expect([...out].map((p) => rgba(p)[0])).toEqual([0, 128, 255, 255]);
    renderFrame(out, new Int32Array([-10, 0, 10, 5]), imageGeometry([4], undefined), -10, 10, grey);
    expect([...out].map((p) => rgba(p)[0])).toEqual([0, 128, 255, 192]);
  });

  it("subsamples by a whole step, every layout picking the same pixels", () => {
    // 4 x 3 grey frame, value = 10y + x; step 2 keeps (0,0) (2,0) (0,2) (2,2)
    const grey16 = new Uint16Array(12).map((_, i) => 10 * Math.floor(i / 4) + (i % 4));
    const out = new Uint32Array(4);
    renderFrame(out, grey16, imageGeometry([3, 4], "mono"), 0, 256, grey, 2);
    expect([...out].map((p) => rgba(p)[0])).toEqual([0, 2, 20, 22]);
    renderFrame(out, new Float32Array(grey16), imageGeometry([3, 4], "mono"), 0, 256, grey, 2);
    expect([...out].map((p) => rgba(p)[0])).toEqual([0, 2, 20, 22]);
    const rgb3 = new Uint8Array(36);
    for (let c = 0; c < 3; c++) for (let i = 0; i < 12; i++) rgb3[c * 12 + i] = grey16[i]! + 100 * c;
    const rgb1 = new Uint8Array(36);
    for (let c = 0; c < 3; c++) for (let i = 0; i < 12; i++) rgb1[i * 3 + c] = grey16[i]! + 100 * c;
    for (const [data, dims, mode] of [[rgb3, [3, 3, 4], "RGB3"], [rgb1, [3, 4, 3], "RGB1"]] as const) {
      renderFrame(out, data, imageGeometry(dims, mode), 0, 256, grey, 2);
      expect([...out].map((p) => rgba(p).slice(0, 3))).toEqual([0, 2, 20, 22].map((v) => [v, v + 100, v + 200]));
    }
  });

  it("reads RGB1, RGB2 and RGB3 layouts into the same pixels", () => {
    // 2 x 3 pixels, pixel (x, y) = [10x + y, 100 + y, 200 + x]
    const px = (x: number, y: number) => [10 * x + y, 100 + y, 200 + x];
    const rgb1 = new Uint8Array(18);
    const rgb2 = new Uint8Array(18);
    const rgb3 = new Uint8Array(18);
    for (let y = 0; y < 2; y++) {
      for (let x = 0; x < 3; x++) {
        for (let c = 0; c < 3; c++) {
          const v = px(x, y)[c]!;
          rgb1[(y * 3 + x) * 3 + c] = v;
          rgb2[(y * 3 + c) * 3 + x] = v;
          rgb3[(c * 2 + y) * 3 + x] = v;
        }
      }
    }
    const cases: [Uint8Array, number[], string][] = [[rgb1, [2, 3, 3], "RGB1"], [rgb2, [2, 3, 3], "RGB2"], [rgb3, [3, 2, 3], "RGB3"]];
    for (const [data, dims, mode] of cases) {
      const g = imageGeometry(dims, mode);
      expect([g.width, g.height, g.layout]).toEqual([3, 2, mode]);
      const out = new Uint32Array(6);
      renderFrame(out, data, g, 0, 255, grey);
      for (let y = 0; y < 2; y++) for (let x = 0; x < 3; x++) expect(rgba(out[y * 3 + x]!)).toEqual([...px(x, y), 255]);
    }
  });
});

describe("images through the server", () => {
  let stack: Stack;
  let client: PvwireClient;
  let browser: BrowserContext;
  let page: Page;
  let profile: string;

  beforeAll(async () => {
    stack = await startStack();
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
    profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1400, height: 1400 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    page = browser.pages()[0] ?? (await browser.newPage());
  });
  afterAll(async () => {
    client?.close();
    await browser?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await stack?.stop();
  });

  it("the TypeScript client gets the RGB1 card, the lz4 frame decoded, and the moving image", async () => {
    const latest = new Map<string, ChannelState>();
    const ids = [`${P}IMAGE:RGB`, `${P}IMAGE:LZ4`, `${P}IMAGE`];
    const sub = client.subscribe(ids, (st) => latest.set(st.id, st));
    try {
      await until(() => ids.every((id) => latest.get(id)?.value instanceof NdArray), 15_000, "three images");
      const rgb = latest.get(`${P}IMAGE:RGB`)!;
      const v = rgb.value as NdArray;
      expect([v.dtype, [...v.dims], rgb.metadata.colorMode, rgb.metadata.type]).toEqual(["uint8", [H, W, 3], "RGB1", "uint8"]);
      let wrong = 0;
      for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) for (let c = 0; c < 3; c++) if (v.data[(y * W + x) * 3 + c] !== card(x, y)[c]) wrong++;
      expect(wrong).toBe(0);
      const lz4 = latest.get(`${P}IMAGE:LZ4`)!;
      const g = lz4.value as NdArray;
      expect([g.dtype, [...g.dims], lz4.metadata.colorMode, lz4.metadata.type]).toEqual(["uint16", [H, W], "mono", "uint16"]);
      for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) if (g.data[y * W + x] !== card(x, y)[0] * 257) wrong++;
      expect(wrong).toBe(0);
      const moving = latest.get(`${P}IMAGE`)!;
      expect([(moving.value as NdArray).dtype, [...(moving.value as NdArray).dims], moving.metadata.colorMode]).toEqual(["uint16", [512, 512], "mono"]);
    } finally {
      sub.unsubscribe();
    }
  });

  it("GraphQL reads name the colour mode as the stream does", async () => {
    const [rgb, lz4, sine] = await client.get([`${P}IMAGE:RGB`, `${P}IMAGE:LZ4`, "sim://sine"], 10);
    expect([rgb!.metadata.colorMode, lz4!.metadata.colorMode, sine!.metadata.colorMode]).toEqual(["RGB1", "mono", null]);
  });

  /** The page's image canvas pixels (RGBA) once it shows a w x h frame with the given range. */
  async function canvasPixels(image: string, low: number, high: number): Promise<number[]> {
    await page.goto(`${stack.url}/?pvs=${encodeURIComponent(image)}&image=${encodeURIComponent(image)}`);
    await page.locator('[data-testid="image-auto"]').uncheck();
    await page.locator('[data-testid="image-low"]').fill(String(low));
    await page.locator('[data-testid="image-high"]').fill(String(high));
    await page.locator('[data-testid="image-high"]').dispatchEvent("change");
    await page.waitForFunction(([w, h, lo, hi]) => {
      const s = (globalThis as unknown as { pvwireImage: { stats: { width: number; height: number; low: number; high: number } } }).pvwireImage.stats;
      return s.width === w && s.height === h && s.low === lo && s.high === hi;
    }, [W, H, low, high], { timeout: 15_000 });
    return page.evaluate(() => {
      const c = document.querySelector('[data-testid="image-canvas"]') as HTMLCanvasElement;
      return [...c.getContext("2d")!.getImageData(0, 0, c.width, c.height).data];
    });
  }

  it("the page draws the RGB1 card pixel for pixel", async () => {
    const px = await canvasPixels(`${P}IMAGE:RGB`, 0, 255);
    expect(px.length).toBe(W * H * 4);
    let wrong = 0;
    for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) for (let c = 0; c < 3; c++) if (px[(y * W + x) * 4 + c] !== card(x, y)[c]) wrong++;
    expect(wrong).toBe(0);
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.locator('[data-testid="image-canvas"]').screenshot({ path: join(ARTIFACTS, "image-rgb1-card.png") });
  });

  it("the page draws the lz4 frame in grey, pixel for pixel", async () => {
    const px = await canvasPixels(`${P}IMAGE:LZ4`, 0, 65535);
    let wrong = 0;
    for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) for (let c = 0; c < 3; c++) if (px[(y * W + x) * 4 + c] !== card(x, y)[0]) wrong++;
    expect(wrong).toBe(0);
  });

  it("plots a 1,000,000-point waveform (min/max per pixel column) with the whole sine's range", async () => {
    const id = "sim://waveform?length=1000000&rate=2";
    await page.goto(`${stack.url}/?pvs=${encodeURIComponent(id)}`);
    await page.waitForFunction(() => {
      const c = document.querySelector('[data-testid="waveform-canvas"]') as HTMLCanvasElement;
      const d = c.getContext("2d")!.getImageData(0, 0, c.width, c.height).data;
      // The blue trace reaches both the top and the bottom band of the plot (a sine of -1..1,
      // so every column's min and max span it somewhere), and is drawn across the width.
      let top = 0;
      let bottom = 0;
      const columns = new Set<number>();
      for (let i = 0; i < d.length; i += 4) {
        if (!(d[i + 2]! > 150 && d[i]! < 80)) continue;
        const y = Math.floor(i / 4 / c.width);
        columns.add((i / 4) % c.width);
        if (y < c.height * 0.15) top++;
        if (y > c.height * 0.85) bottom++;
      }
      return top > 0 && bottom > 0 && columns.size > c.width * 0.9;
    }, null, { timeout: 15_000 });
    expect(await page.locator('[data-testid="waveform-name"]').textContent()).toBe(id);
  });

  /** Whole and reduced states of `id` by serial, side by side on one client, until both saw `count` updates. */
  async function wholeAndReduced(id: string, options: { maxColumns?: number; maxPixels?: number }, count: number) {
    const whole = new Map<number, ChannelState>();
    const reduced = new Map<number, ChannelState>();
    const keep = (m: Map<number, ChannelState>) => (st: ChannelState) => {
      if (st.serial !== undefined && st.value !== undefined && st.value !== null && typeof st.value === "object") m.set(st.serial, st);
    };
    const a = client.subscribe([id], keep(whole));
    const b = client.subscribe([id], keep(reduced), options);
    try {
      await until(() => whole.size >= count && reduced.size >= count, 30_000, `${count} whole and reduced updates of ${id}`);
    } finally {
      a.unsubscribe();
      b.unsubscribe();
    }
    return { whole, reduced };
  }

  it("receives a waveform reduced by the server to the exact min/max of each column (maxColumns)", async () => {
    const n = 100_003;
    const { whole, reduced } = await wholeAndReduced(`sim://waveform?length=${n}&shape=noise&rate=10`, { maxColumns: 700 }, 4);
    const serial = [...reduced.keys()].filter((k) => whole.has(k)).at(-1);
    expect(serial).toBeDefined();
    const full = whole.get(serial!)!.value as Float64Array;
    const st = reduced.get(serial!)!;
    const r = st.value as Float64Array;
    expect(st.metadata.reduced).toEqual({ method: "minmax", from: [n] });
    expect([full.length, r.length, r instanceof Float64Array]).toEqual([n, 1400, true]);
    let wrong = 0;
    for (let c = 0; c < 700; c++) {
      const slice = full.subarray(Math.floor((c * n) / 700), Math.floor(((c + 1) * n) / 700));
      if (r[2 * c] !== Math.min(...slice) || r[2 * c + 1] !== Math.max(...slice)) wrong++;
    }
    expect(wrong).toBe(0);
  });

  it("plots the reduced waveform by default and the whole one with ?full=1", async () => {
    const id = "sim://waveform?length=1000000&rate=2";
    for (const [query, reduced] of [["", true], ["&full=1", false]] as const) {
      await page.goto(`${stack.url}/?pvs=${encodeURIComponent(id)}${query}`);
      await page.waitForFunction(() => (globalThis as unknown as { pvwireWaveform: { drawn: number } }).pvwireWaveform.drawn > 1, null, { timeout: 15_000 });
      const s = await page.evaluate(() => (globalThis as unknown as { pvwireWaveform: { columns: number; reduced: boolean } }).pvwireWaveform);
      // 640-pixel canvas less 2 x 6 of padding: one min/max pair per pixel column either way.
      expect(s).toMatchObject({ columns: 628, reduced });
      const text = await page.locator('[data-testid="row"] [data-testid="value"]').first().textContent();
      expect(text).toBe(reduced ? "[1000000 values, sent as min/max of 628 columns]" : "[1000000 values]");
    }
  });

  it("draws an image the server subsampled (maxPixels) pixel for pixel", async () => {
    // 1024 x 600 uint8 is more than the 512 x 512 screen pixels of the page's image canvas
    // (device pixel ratio 1): the server sends every 2nd row and column, 512 x 300, and the page
    // draws them as they came; a [0, 255] range maps each uint8 value to itself.
    const [W2, H2] = [1024, 600];
    const id = `sim://image?width=${W2}&height=${H2}&dtype=uint8&rate=1`;
    const wholeFrames: Uint8Array[] = [];
    const sub = client.subscribe([id], (st) => {
      if (st.value instanceof NdArray) wholeFrames.push(st.value.data as Uint8Array);
    });
    try {
      // This client sees the channel's current frame first: whatever the page draws, it has too.
      await until(() => wholeFrames.length > 0, 20_000, "a whole frame");
      await page.goto(`${stack.url}/?pvs=${encodeURIComponent(id)}&image=${encodeURIComponent(id)}`);
      await page.locator('[data-testid="image-auto"]').uncheck();
      await page.locator('[data-testid="image-low"]').fill("0");
      await page.locator('[data-testid="image-high"]').fill("255");
      await page.locator('[data-testid="image-high"]').dispatchEvent("change");
      await page.waitForFunction(() => {
        const s = (globalThis as unknown as { pvwireImage: { stats: { width: number; height: number; serverStep: number; step: number; high: number } } }).pvwireImage.stats;
        return s.width === 512 && s.height === 300 && s.serverStep === 2 && s.step === 1 && s.high === 255;
      }, null, { timeout: 20_000 });
      const red = Buffer.from(await page.evaluate(() => {
        const c = document.querySelector('[data-testid="image-canvas"]') as HTMLCanvasElement;
        const d = c.getContext("2d")!.getImageData(0, 0, c.width, c.height).data;
        let s = "";
        for (let i = 0; i < d.length; i += 4) s += String.fromCharCode(d[i]!);
        return btoa(s);
      }), "base64");
      expect(red.length).toBe(512 * 300);
      expect(await page.locator('[data-testid="image-stats"]').textContent()).toMatch(/^1024×600 \(sent 1:2\) mono/);
      // The canvas is one of the whole frames this test received, every 2nd row and column.
      const matches = wholeFrames.filter((f) => {
        for (let y = 0; y < 300; y++) for (let x = 0; x < 512; x++) if (f[2 * y * W2 + 2 * x] !== red[y * 512 + x]) return false;
        return true;
      });
      expect(wholeFrames.length).toBeGreaterThan(0);
      expect(matches.length).toBe(1);
    } finally {
      sub.unsubscribe();
    }
  });

  it("shows the demo's moving image by default, with frame rate and latency", async () => {
    await page.goto(`${stack.url}/`);
    await page.waitForFunction(() => {
      const d = (document.querySelector('[data-testid="image-stats"]') as HTMLElement).dataset;
      return Number(d.drawn) >= 5 && d.width === "512" && d.colorMode === "mono";
    }, null, { timeout: 15_000 });
    expect(await page.locator('[data-testid="image-name"]').textContent()).toBe(`${P}IMAGE`);
    expect(await page.locator('[data-testid="image-stats"]').textContent()).toMatch(/received \d+\/s · drawn \d+\/s · latency -?\d+ ms/);
    await page.screenshot({ path: join(ARTIFACTS, "page-with-image.png"), fullPage: true });
  });
});
