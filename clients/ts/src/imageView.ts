/**
 * ImageView: an image channel (PROTOCOL.md section 4.5) drawn on a canvas.
 *
 * `update` only keeps a reference to the latest frame (O(1), on the stream's path); drawing runs
 * on requestAnimationFrame with the latest frame only, so a tab that cannot draw every frame
 * skips frames instead of queueing them, and keeps reading the socket (the server then never
 * sees it as slow). A frame is copied once: the TypedArray is read in one pass into the
 * ImageData's pixels through a lookup table (no per-pixel objects), then `putImageData`.
 */
import type { Timestamp } from "./channel.js";
import type { NdArray, TypedArray } from "./ndarray.js";
import type { Metadata } from "./protocol.js";

export type ColorMapName = "grey" | "viridis" | "inferno";
/** `ImageViewOptions.maxPixels`' default; also what a page may ask the server for (`maxPixels`
 * subscription option), so that the server sends the pixels the view would draw, no more. */
export const DEFAULT_MAX_PIXELS = 2 * 1024 * 1024;
export const COLOR_MAPS: readonly ColorMapName[] = ["grey", "viridis", "inferno"];
/** `auto`: each frame's own minimum and maximum; a pair: a fixed display range. */
export type DisplayRange = "auto" | readonly [number, number];

export interface ImageViewOptions {
  colorMap?: ColorMapName;
  range?: DisplayRange;
  /** Called after each draw (e.g. to show the statistics). */
  onDraw?: (stats: ImageStats) => void;
  /**
   * Frames with more pixels are drawn subsampled by a whole factor (nearest neighbour) to at most
   * this many: default 2 megapixels, so a 2048 x 2048 frame is drawn at 1024 x 1024. `Infinity`
   * draws every pixel.
   */
  maxPixels?: number;
  /** Scheduler, for tests and workers; default requestAnimationFrame. */
  schedule?: (draw: () => void) => void;
}

export interface ImageStats {
  /** Frames given to `update` and frames drawn, in the last whole second. */
  receivedPerSecond: number;
  drawnPerSecond: number;
  received: number;
  drawn: number;
  /** Arrival time minus the frame's timestamp of the last frame, ms (clocks must agree). */
  latencyMs: number | undefined;
  /** Main-thread time of the last draw, ms, and of all draws. */
  drawMs: number;
  drawMsTotal: number;
  /** The frame received (after the server's reduction, if any). */
  width: number;
  height: number;
  /** Drawn every `step`-th pixel of every `step`-th row (see `maxPixels`). */
  step: number;
  /** The server sent every `serverStep`-th row and column (metadata `reduced`, PROTOCOL.md
   * section 4.6; subscription option `maxPixels`); 1 for a whole frame. */
  serverStep: number;
  /** The upstream image's size: `width` and `height` unless the server reduced it. */
  fullWidth: number;
  fullHeight: number;
  colorMode: string;
  /** The display range of the last draw. */
  low: number;
  high: number;
}

/** Control points of the colour maps (matplotlib's viridis and inferno, sampled), 0..1. */
const MAP_POINTS: Record<ColorMapName, readonly (readonly [number, number, number])[]> = {
  grey: [[0, 0, 0], [255, 255, 255]],
  viridis: [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]],
  inferno: [[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]],
};

/** 256 little-endian RGBA pixels (as Uint32: 0xAABBGGRR) of a colour map. */
export function colorMapTable(name: ColorMapName): Uint32Array {
  const points = MAP_POINTS[name];
  const out = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    const f = (i / 255) * (points.length - 1);
    const k = Math.min(points.length - 2, Math.floor(f));
    const t = f - k;
    const a = points[k]!;
    const b = points[k + 1]!;
    const c = (j: number) => Math.round(a[j]! + (b[j]! - a[j]!) * t);
    out[i] = (0xff000000 | (c(2) << 16) | (c(1) << 8) | c(0)) >>> 0;
  }
  return out;
}

/** Frame geometry from the dims and colorMode: [height, width, planes, layout]. */
export function imageGeometry(dims: readonly number[], colorMode: string | undefined): { width: number; height: number; layout: "mono" | "RGB1" | "RGB2" | "RGB3" } {
  if (dims.length === 3) {
    if (colorMode === "RGB1" && dims[2] === 3) return { height: dims[0]!, width: dims[1]!, layout: "RGB1" };
    if (colorMode === "RGB2" && dims[1] === 3) return { height: dims[0]!, width: dims[2]!, layout: "RGB2" };
    if (colorMode === "RGB3" && dims[0] === 3) return { height: dims[1]!, width: dims[2]!, layout: "RGB3" };
  }
  if (dims.length >= 2) {
    // Grey (also any mode this view does not know): the last two dims, the first plane.
    return { height: dims[dims.length - 2]!, width: dims[dims.length - 1]!, layout: "mono" };
  }
  return { height: 1, width: dims[0] ?? 0, layout: "mono" };
}

/** Minimum and maximum of the first `n` elements, one pass (NaN skipped). */
export function minMax(data: TypedArray, n = data.length): [number, number] {
  let lo = Infinity;
  let hi = -Infinity;
  const d = data as unknown as ArrayLike<number>;
  for (let i = 0; i < n; i++) {
    const v = d[i]!;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (!(lo <= hi)) return [0, 1];
  return [lo, hi];
}

/**
 * Fill `out` (width × height RGBA pixels as Uint32) from `frame`: one pass over the elements.
 * Grey frames go through the colour map; RGB frames through a grey ramp per component.
 * Integer frames of at most 16 bits use a table indexed by the value itself (no arithmetic per
 * pixel); other types scale each value.
 */
export function renderFrame(out: Uint32Array, data: TypedArray, geometry: ReturnType<typeof imageGeometry>, low: number, high: number, map: Uint32Array, step = 1): void {
  const { width, height, layout } = geometry;
  const n = width * height;
  const d = data as unknown as ArrayLike<number>;
  const span = high > low ? high - low : 1;
  // Binning, not rounding: 256 equal bins over [low, high], so a range of [0, 255] (or of
  // [0, 65535] for v × 257) maps every value to itself exactly.
  const scale = 256 / span;
  const small = data instanceof Uint8Array || data instanceof Uint16Array || data instanceof Int8Array || data instanceof Int16Array;
  const offset = data instanceof Int8Array ? 128 : data instanceof Int16Array ? 32768 : 0;
  let table: Uint32Array | undefined;
  if (layout === "mono" && small) {
    const size = data instanceof Uint8Array || data instanceof Int8Array ? 256 : 65536;
    table = new Uint32Array(size);
    for (let v = 0; v < size; v++) {
      const k = ((v - offset - low) * scale) | 0;
      table[v] = map[k < 0 ? 0 : k > 255 ? 255 : k]!;
    }
  }
  const c = (v: number) => {
    const k = ((v - low) * scale) | 0;
    return k < 0 ? 0 : k > 255 ? 255 : k;
  };
  if (step > 1) {
    // Every step-th pixel of every step-th row (nearest neighbour): the canvas is shown smaller
    // than the frame anyway, and converting, uploading and compositing shrink by step².
    let o = 0;
    for (let y = 0; y < height; y += step) {
      for (let x = 0; x < width; x += step) {
        const i = y * width + x;
        if (layout === "mono") {
          out[o++] = table ? table[d[i]! + offset]! : map[c(d[i]!)]!;
          continue;
        }
        let r: number, g: number, b: number;
        if (layout === "RGB1") { r = d[3 * i]!; g = d[3 * i + 1]!; b = d[3 * i + 2]!; }
        else if (layout === "RGB2") { const row = y * 3 * width; r = d[row + x]!; g = d[row + width + x]!; b = d[row + 2 * width + x]!; }
        else { r = d[i]!; g = d[n + i]!; b = d[2 * n + i]!; }
        out[o++] = (0xff000000 | (c(b) << 16) | (c(g) << 8) | c(r)) >>> 0;
      }
    }
    return;
  }
  if (layout === "mono") {
    if (table) {
      if (offset === 0) for (let i = 0; i < n; i++) out[i] = table[d[i]!]!;
      else for (let i = 0; i < n; i++) out[i] = table[d[i]! + offset]!;
      return;
    }
    for (let i = 0; i < n; i++) {
      const k = ((d[i]! - low) * scale) | 0;
      out[i] = map[k < 0 ? 0 : k > 255 ? 255 : k]!;
    }
    return;
  }
  if (layout === "RGB1") {
    for (let i = 0, j = 0; i < n; i++, j += 3) out[i] = (0xff000000 | (c(d[j + 2]!) << 16) | (c(d[j + 1]!) << 8) | c(d[j]!)) >>> 0;
  } else if (layout === "RGB2") {
    for (let y = 0; y < height; y++) {
      const row = y * 3 * width;
      for (let x = 0; x < width; x++) {
        out[y * width + x] = (0xff000000 | (c(d[row + 2 * width + x]!) << 16) | (c(d[row + width + x]!) << 8) | c(d[row + x]!)) >>> 0;
      }
    }
  } else {
    for (let i = 0; i < n; i++) out[i] = (0xff000000 | (c(d[2 * n + i]!) << 16) | (c(d[n + i]!) << 8) | c(d[i]!)) >>> 0;
  }
}

/** The stale marker's label colour: control rooms' "disconnected/invalid" magenta (Phoebus, EDM). */
export const STALE_COLOR = "#c800c8";

/**
 * Mark what a canvas shows as stale: dim it, and write `reason` (e.g. `DISCONNECTED`) in white on
 * a magenta label in its middle. Drawn over the last picture, so the next draw of a fresh picture
 * clears it. The label's size follows the canvas's own pixels (an image canvas is frame-sized).
 */
export function drawStaleMarker(ctx: CanvasRenderingContext2D, reason: string): void {
  const { width, height } = ctx.canvas;
  ctx.save();
  ctx.fillStyle = "rgba(128, 128, 128, 0.6)";
  ctx.fillRect(0, 0, width, height);
  const size = Math.max(10, Math.round(Math.min(width, height) / 10));
  ctx.font = `bold ${size}px sans-serif`;
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  const boxWidth = Math.min(width, ctx.measureText(reason).width + size);
  const boxHeight = Math.round(size * 1.8);
  ctx.fillStyle = STALE_COLOR;
  ctx.fillRect(Math.round((width - boxWidth) / 2), Math.round((height - boxHeight) / 2), Math.round(boxWidth), boxHeight);
  ctx.fillStyle = "#fff";
  ctx.fillText(reason, width / 2, height / 2, width);
  ctx.restore();
}

interface Pending {
  value: NdArray;
  colorMode: string;
  reduced: Metadata["reduced"];
}

export class ImageView {
  private readonly ctx: CanvasRenderingContext2D;
  private colorMapName: ColorMapName;
  private map: Uint32Array;
  private range: DisplayRange;
  private pending: Pending | undefined;
  private scheduled = false;
  private image: ImageData | undefined;
  private pixels: Uint32Array | undefined;
  private readonly schedule: (draw: () => void) => void;
  private readonly onDraw: ((stats: ImageStats) => void) | undefined;
  private readonly maxPixels: number;
  private closed = false;
  private staleReason: string | null = null;
  private second = 0;
  private receivedInSecond = 0;
  private drawnInSecond = 0;
  readonly stats: ImageStats = {
    receivedPerSecond: 0, drawnPerSecond: 0, received: 0, drawn: 0, latencyMs: undefined, drawMs: 0, drawMsTotal: 0,
    width: 0, height: 0, step: 1, serverStep: 1, fullWidth: 0, fullHeight: 0, colorMode: "", low: 0, high: 1,
  };

  constructor(readonly canvas: HTMLCanvasElement, options: ImageViewOptions = {}) {
    const ctx = canvas.getContext("2d");
    if (!ctx) throw new Error("ImageView: the canvas has no 2D context");
    this.ctx = ctx;
    this.colorMapName = options.colorMap ?? "grey";
    this.map = colorMapTable(this.colorMapName);
    this.range = options.range ?? "auto";
    this.onDraw = options.onDraw;
    this.maxPixels = options.maxPixels ?? DEFAULT_MAX_PIXELS;
    this.schedule = options.schedule ?? ((f) => requestAnimationFrame(f));
  }

  get colorMap(): ColorMapName {
    return this.colorMapName;
  }

  setColorMap(name: ColorMapName): void {
    this.colorMapName = name;
    this.map = colorMapTable(name);
    this.redraw();
  }

  get displayRange(): DisplayRange {
    return this.range;
  }

  setRange(range: DisplayRange): void {
    this.range = range;
    this.redraw();
  }

  /** Why the image shown is stale (e.g. `DISCONNECTED`), or null when it is live. */
  get stale(): string | null {
    return this.staleReason;
  }

  /**
   * Mark the image shown as stale (its channel is not connected: `reason`, e.g. the connection
   * state `DISCONNECTED`), or live again (`null`). While stale the last frame stays, dimmed under
   * a magenta label saying `reason`, and the canvas carries `data-stale="reason"` (for CSS).
   */
  setStale(reason: string | null): void {
    if (reason === this.staleReason) return;
    this.staleReason = reason;
    if (reason === null) delete this.canvas.dataset.stale;
    else this.canvas.dataset.stale = reason;
    this.redraw();
  }

  /**
   * Show `value` (an image NdArray) at the next animation frame. O(1): keeps the reference only,
   * replacing a frame not drawn yet. `time` (the IOC timestamp) gives the latency.
   */
  update(value: NdArray, metadata: Metadata = {}, time?: Timestamp): void {
    if (this.closed) return;
    const now = Date.now();
    this.count(now, "received");
    if (time) this.stats.latencyMs = now - (time.seconds * 1000 + time.nanoseconds / 1e6);
    this.pending = { value, colorMode: typeof metadata.colorMode === "string" ? metadata.colorMode : "mono", reduced: metadata.reduced };
    this.last = this.pending;
    this.request();
  }

  private last: Pending | undefined;

  private redraw(): void {
    if (this.last) {
      this.pending = this.last;
      this.request();
    }
  }

  private request(): void {
    if (this.scheduled || this.closed) return;
    this.scheduled = true;
    this.schedule(() => {
      this.scheduled = false;
      this.draw();
    });
  }

  private count(now: number, what: "received" | "drawn"): void {
    const second = Math.floor(now / 1000);
    if (second !== this.second) {
      const gap = second - this.second === 1;
      this.stats.receivedPerSecond = gap ? this.receivedInSecond : 0;
      this.stats.drawnPerSecond = gap ? this.drawnInSecond : 0;
      this.receivedInSecond = 0;
      this.drawnInSecond = 0;
      this.second = second;
    }
    if (what === "received") {
      this.stats.received++;
      this.receivedInSecond++;
    } else {
      this.stats.drawn++;
      this.drawnInSecond++;
    }
  }

  /** Draw the latest frame now (normally called from the animation frame). */
  draw(): void {
    const p = this.pending;
    this.pending = undefined;
    if (!p || this.closed) return;
    const t0 = performance.now();
    const { value, colorMode, reduced } = p;
    const geometry = imageGeometry(value.dims, colorMode);
    const { width, height } = geometry;
    if (width === 0 || height === 0 || value.data instanceof BigInt64Array || value.data instanceof BigUint64Array) return;
    const step = Math.max(1, Math.ceil(Math.sqrt((width * height) / this.maxPixels)));
    const drawnWidth = Math.ceil(width / step);
    const drawnHeight = Math.ceil(height / step);
    if (!this.image || this.image.width !== drawnWidth || this.image.height !== drawnHeight) {
      this.canvas.width = drawnWidth;
      this.canvas.height = drawnHeight;
      this.image = this.ctx.createImageData(drawnWidth, drawnHeight);
      this.pixels = new Uint32Array(this.image.data.buffer);
    }
    const planes = geometry.layout === "mono" ? 1 : 3;
    const [low, high] = this.range === "auto" ? minMax(value.data, width * height * planes) : this.range;
    renderFrame(this.pixels!, value.data, geometry, low, high, this.map, step);
    this.ctx.putImageData(this.image, 0, 0);
    if (this.staleReason !== null) drawStaleMarker(this.ctx, this.staleReason);
    const s = this.stats;
    s.width = width;
    s.height = height;
    s.step = step;
    const whole = reduced?.method === "subsample" ? imageGeometry(reduced.from, colorMode) : geometry;
    s.serverStep = reduced?.method === "subsample" ? (reduced.step ?? 1) : 1;
    s.fullWidth = whole.width;
    s.fullHeight = whole.height;
    s.colorMode = geometry.layout;
    s.low = low;
    s.high = high;
    this.count(Date.now(), "drawn");
    s.drawMs = performance.now() - t0;
    s.drawMsTotal += s.drawMs;
    this.onDraw?.(s);
  }

  close(): void {
    this.closed = true;
    this.pending = undefined;
    this.last = undefined;
  }
}
