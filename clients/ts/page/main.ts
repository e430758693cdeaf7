// The pvwire demo page: one PvwireClient, one subscription per added channel (all on one
// WebSocket), a live table, puts, a waveform plot and a one-minute strip chart on canvases.
import { COLOR_MAPS, DEFAULT_MAX_PIXELS, drawStaleMarker, ImageView, NdArray, PvwireClient, toDate, type ChannelState, type ColorMapName, type History, type PvwireError, type SubscribeOptions, type Subscription, type TypedArray } from "../src/index.js";
import { niceTicks, placeTicks, timeTicks } from "./axes.js";
import { setUpSignIn, takeProviderAnswer, type SignIn } from "./signin.js";

const DEMO_PREFIX = "PVWIRE:DEMO:";
const DEMO_PVS = [...["COUNTER", "COUNTER_1HZ", "SINE", "NOISE", "MODE", "MESSAGE", "SP", "RBV", "WAVEFORM"].map((n) => DEMO_PREFIX + n), `pva://${DEMO_PREFIX}IMAGE`];
const STRIP_SECONDS = 60;

// Back from the identity provider, the page's own query is put back before it is read here.
const providerAnswer = takeProviderAnswer();
const params = new URLSearchParams(location.search);
// The bearer token: the signed-in user's access token (signin.ts), else one given in the token
// field, which is hidden unless the address asks for it (`?token-field`, for tests and tools).
// Both live in sessionStorage (this tab only, gone when it closes), never in the URL where they
// would end up in history, logs and Referer headers. Asked for before every request and
// re-registration, so a token refreshed or given later applies from the next request on.
const TOKEN_KEY = "pvwire.token";
const SERVER = params.get("server") ?? location.origin;
let signIn: SignIn | undefined;
const currentToken = (): string | undefined => signIn?.token() ?? (sessionStorage.getItem(TOKEN_KEY) || undefined);
const client = new PvwireClient(SERVER, { getToken: currentToken });
(globalThis as { pvwire?: PvwireClient }).pvwire = client; // for the browser tests and the console

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const rowsEl = $("rows");
const errorEl = $("error");

interface Row {
  name: string; tr: HTMLTableRowElement; cells: Record<string, HTMLElement>; sub?: Subscription; state?: ChannelState;
  /** The last put's error, shown beside this row's put box (not in the toolbar, far away). */
  putError: HTMLElement;
  /** The strip chart's trace of this channel, [ms, value], IOC time; NaN marks a gap. It opens
   * with the server's recorded past (`backfill`), so a chart is full from the start. */
  trace: [number, number][];
  /** Why the past older than the server's own is missing (its archive could not be read). */
  archiveMissing?: string;
}
const rows = new Map<string, Row>();
let stripName = "";
let strip: [number, number][] = []; // the selected row's trace
// For the tests: the live trace's points, its oldest (ms) and the past points it opened with;
// past the live minute, the span (s) and the recorded rows drawn (their bucket width in s, 0
// for points as they came, and the gaps among them).
// With an archive behind the server: the span's archive part (its state, the rows from it) and
// why the archive's past is missing, when it is.
const stripStats = { points: 0, oldestMs: 0, past: 0, span: STRIP_SECONDS, rows: 0, resolution: 0, gaps: 0, asked: 0, archive: "", archiveRows: 0, archiveMissing: "" };
(globalThis as { pvwireStrip?: typeof stripStats }).pvwireStrip = stripStats;
let waveformName = "";
let updates = 0;

function showError(msg: string): void {
  errorEl.textContent = msg;
}

// ---- connection state and update rate
const connEl = $("conn-state");
client.on("state", (s) => {
  connEl.textContent = s;
  connEl.className = `conn-${s}`;
});
client.on("error", (e) => showError(e.message));
let lastCount = 0;
setInterval(() => {
  $("update-rate").textContent = String(updates - lastCount);
  lastCount = updates;
}, 1000);

// ---- formatting
function formatValue(st: ChannelState): string {
  const v = st.value;
  const m = st.metadata;
  if (v === undefined || v === null) return "–";
  if (typeof v === "number") {
    if (m.type === "enum" && m.choices) return m.choices[v] ?? String(v);
    const text = m.precision !== undefined && m.type !== undefined && m.type.startsWith("float") ? v.toFixed(Math.max(0, Math.min(m.precision, 15))) : String(v);
    return m.units ? `${text} ${m.units}` : text;
  }
  if (typeof v === "string" || typeof v === "bigint") return String(v);
  const r = m.reduced;
  if (v instanceof NdArray) {
    const sent = r?.method === "subsample" ? ` (sent 1:${r.step ?? 1})` : "";
    return `${v.dtype} image ${(r?.from ?? v.dims).join("×")}${typeof m.colorMode === "string" ? ` ${m.colorMode}` : ""}${sent}`;
  }
  if (ArrayBuffer.isView(v)) {
    const n = r?.method === "minmax" ? `${r.from[0]} values, sent as min/max of ${(v as TypedArray).length / 2} columns` : `${(v as TypedArray).length} values`;
    return `[${n}]${m.units ? ` ${m.units}` : ""}`;
  }
  return JSON.stringify(v).slice(0, 60);
}

function formatTime(st: ChannelState): string {
  return st.time ? toDate(st.time).toISOString().replace("T", " ").replace("Z", "") : "–";
}

// ---- table
function addChannel(name: string): void {
  name = name.trim();
  if (!name || rows.has(name)) return;
  const tr = document.createElement("tr");
  tr.dataset.testid = "row";
  tr.dataset.pv = name;
  const cells: Record<string, HTMLElement> = {};
  for (const key of ["name", "value", "severity", "time", "conn", "put"]) {
    const td = document.createElement("td");
    td.className = key;
    td.dataset.testid = key;
    tr.appendChild(td);
    cells[key] = td;
  }
  cells.name!.textContent = name;
  cells.name!.addEventListener("click", () => (rows.get(name)?.state?.value instanceof NdArray ? selectImage(name) : selectStrip(name)));
  cells.conn!.textContent = "CONNECTING";
  cells.severity!.replaceChildren(unknownSeverity());
  const putError = document.createElement("span");
  putError.className = "put-error";
  putError.dataset.testid = "put-error";
  cells.put!.appendChild(putError);
  rowsEl.appendChild(tr);
  const row: Row = { name, tr, cells, putError, trace: [] };
  rows.set(name, row);
  subscribeRow(row);
  $("channel-count").textContent = String(rows.size);
}

// Big arrays arrive reduced for display (PROTOCOL.md section 4.6): a waveform as the min/max of
// each of the plot's pixel columns, an image subsampled to about the screen pixels its canvas
// covers (512 CSS pixels wide: 512 x 512 at a device pixel ratio of 1). Receiving a whole 8 MB
// frame cost this tab ~150 ms of main thread (headless Chromium, before any script ran): 4.6
// frames/s of a 1,000,000-point waveform, 3.4 of a 2048 x 2048 image (bench/README.md).
// ?full=1 subscribes to whole arrays (the waveform then is decimated here, the image by the view).
const FULL = params.get("full") === "1";
const PAD_X = 6;
const PAD_Y = 10;
const plotColumns = (canvas: HTMLCanvasElement) => Math.max(1, Math.floor(canvas.width - 2 * PAD_X));
function imagePixels(): number {
  const side = $("image").getBoundingClientRect().width * (globalThis.devicePixelRatio || 1);
  return Math.min(DEFAULT_MAX_PIXELS, Math.max(256 * 256, Math.round(side * side)));
}
function rowOptions(): SubscribeOptions {
  return FULL ? {} : { maxColumns: plotColumns($<HTMLCanvasElement>("waveform")), maxPixels: imagePixels() };
}

/** (Re-)subscribe a row: after a token change, so the access shown is the new identity's. */
function subscribeRow(row: Row): void {
  row.sub?.unsubscribe();
  const { cells } = row;
  row.sub = client.subscribe([row.name], (st) => onUpdate(row.name, st), {
    ...rowOptions(),
    backfill: STRIP_SECONDS,
    onHistory: (_sid, h) => addPast(row, h),
    onError: (e) => {
      cells.conn!.textContent = `ERROR: ${e.message}`;
      cells.conn!.className = "conn conn-FAILED";
      cells.put!.querySelector("form")?.remove();
    },
  });
}

/** The recorded past of a row's channel into its trace: before its first live value, or after
 * a reconnect rows a slow backfill had left out, older than live ones: put in time order. */
function addPast(row: Row, h: History): void {
  const value = h.value;
  if (value instanceof NdArray) return; // an array channel's frames: the strip chart draws scalars
  const trace = row.trace;
  const last = trace.length > 0 ? trace[trace.length - 1]![0] : -Infinity;
  for (let i = 0; i < h.t.length; i++) {
    trace.push([Number(h.t[i]! / 1_000_000n), h.gap[i] ? NaN : value[i]!]);
  }
  if (h.t.length > 0 && Number(h.t[0]! / 1_000_000n) < last) trace.sort((a, b) => a[0] - b[0]);
  if (h.reason !== undefined) row.archiveMissing = h.reason; // the gap row at its start says why
  if (row.name === stripName) {
    stripStats.past += h.t.length;
    showArchive();
  }
}

/** Beside the strip chart's name: what became of the archive's past, when it is missing. */
function showArchive(): void {
  const span = stripSpan > STRIP_SECONDS ? spanRows?.archive : undefined;
  const missing = span ? (span.state === "MISSING" ? span.reason ?? "" : undefined) : rows.get(stripName)?.archiveMissing;
  stripStats.archiveMissing = missing ?? "";
  const note = $("strip-archive");
  if (missing !== undefined) {
    note.textContent = `(archive part missing: ${missing})`;
    note.className = "archive-note missing";
  } else {
    note.textContent = span?.state === "JOINED" ? `(the first ${span.rows} rows from the archive)` : "";
    note.className = "archive-note";
  }
}

function traceTime(st: ChannelState): number {
  return st.time ? st.time.seconds * 1000 + st.time.nanoseconds / 1e6 : Date.now();
}

/** Why a channel is read-only for this identity, for the put box's title. */
function readOnlyReason(st: ChannelState): string {
  // The rules first: `writable` is false for a READ identity too (PROTOCOL.md section 5), so it
  // names the IOC only when the rules would let this identity write.
  if (st.access === "READ") return currentToken() ? "read-only for this identity" : "read-only for anonymous users: give a token";
  if (st.metadata.writable === false) return "the IOC refuses writes to this channel";
  return "not writable";
}

/** The put box once the channel's metadata is known, enabled exactly when this identity may
 * write it (granted WRITE and not refused by the IOC) and the channel is connected (a put then
 * could only fail); greyed with the reason otherwise. What was typed stays for the reconnect. */
function renderPut(row: Row, st: ChannelState): void {
  const cell = row.cells.put!;
  let form = cell.querySelector("form");
  if (st.metadata.type === undefined) {
    form?.remove();
    return;
  }
  form ??= createPutForm(row, st);
  const connected = st.connection === "CONNECTED";
  const enabled = st.writable && connected;
  for (const el of form.querySelectorAll<HTMLInputElement | HTMLSelectElement | HTMLButtonElement>("input, select, button")) el.disabled = !enabled;
  form.classList.toggle("read-only", !enabled);
  form.title = enabled ? "" : connected ? readOnlyReason(st) : `${st.connection}: no put until the channel is connected`;
}

function createPutForm(row: Row, st: ChannelState): HTMLFormElement {
  const cell = row.cells.put!;
  const f = document.createElement("form");
  let input: HTMLInputElement | HTMLSelectElement;
  if (st.metadata.type === "enum" && st.metadata.choices) {
    const sel = document.createElement("select");
    st.metadata.choices.forEach((c, i) => sel.add(new Option(c, String(i))));
    if (typeof st.value === "number") sel.value = String(st.value);
    input = sel;
  } else {
    input = document.createElement("input");
    input.size = 10;
  }
  input.dataset.testid = "put-input";
  const button = document.createElement("button");
  button.textContent = "Put";
  button.dataset.testid = "put-button";
  f.append(input, button);
  f.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = row.state?.metadata.type ?? "";
    const raw = input.value;
    const value = t === "string" ? raw : Number(raw);
    const showPutError = (msg: string, code?: string | number) => {
      row.putError.textContent = msg;
      row.putError.dataset.code = code === undefined ? "" : String(code);
    };
    if (typeof value === "number" && (raw.trim() === "" || Number.isNaN(value))) return showPutError(`not a number: ${JSON.stringify(raw)}`);
    showPutError("");
    client.put(row.name, value, { wait: true }).then(
      () => showPutError(""),
      (e: PvwireError) => showPutError(e.code === "WRITE_DENIED" ? `write denied: ${e.message}` : e.message, e.code),
    );
  });
  cell.insertBefore(f, row.putError);
  return f;
}

/** Severity not reported yet: a neutral dash, never a badge (a grey "UNKNOWN" reads as an alarm). */
function unknownSeverity(): HTMLElement {
  const span = document.createElement("span");
  span.className = "sev-none";
  span.dataset.key = "";
  span.textContent = "–";
  span.title = "no alarm state received yet";
  return span;
}

/** Why what a channel's row and widgets show is stale (its connection state), or null when live.
 * A channel still connecting for the first time shows nothing yet, so nothing is stale. */
function staleReason(st: ChannelState | undefined): string | null {
  if (!st || st.connection === "CONNECTED") return null;
  if (st.connection === "CONNECTING" && st.alarm === undefined && st.value === undefined) return null;
  return st.connection;
}

function renderSeverity(cell: HTMLElement, st: ChannelState): void {
  const sev = st.alarm?.severity;
  // Not connected: the last alarm says nothing about now. Control-room convention (Phoebus, EDM):
  // the connection state in the invalid/disconnected style, never the last (green) severity.
  const stale = staleReason(st);
  // Rebuild only when the alarm changed: most updates carry a new value, not a new alarm.
  const key = stale !== null ? `conn|${stale}` : sev === undefined ? "" : `${sev}|${st.alarm!.message}`;
  const shown = cell.firstElementChild as HTMLElement | null;
  if (shown?.dataset.key === key) return;
  if (stale === null && sev === undefined) {
    cell.replaceChildren(unknownSeverity());
    return;
  }
  const span = document.createElement("span");
  span.className = stale !== null ? "sev sev-disconnected" : `sev sev-${sev}`;
  span.dataset.key = key;
  span.textContent = stale ?? sev!;
  if (stale !== null) span.title = sev === undefined ? connectionText(st) : `${connectionText(st)}; last alarm ${sev}`;
  else if (st.alarm?.message && st.alarm.message !== sev) span.title = st.alarm.message;
  cell.replaceChildren(span);
}

function connectionText(st: ChannelState): string {
  // NOT_FOUND's reason says it all ("not found (no IOC answered for 5 s)").
  if (st.connection === "NOT_FOUND") return st.reason || "not found";
  return st.connection + (st.reason ? ` (${st.reason})` : "");
}

function onUpdate(name: string, st: ChannelState): void {
  updates++;
  const row = rows.get(name);
  if (!row) return;
  row.state = st;
  row.cells.value!.textContent = formatValue(st);
  renderSeverity(row.cells.severity!, st);
  row.cells.time!.textContent = formatTime(st);
  row.cells.conn!.textContent = connectionText(st);
  row.cells.conn!.className = `conn conn-${st.connection}`;
  row.tr.classList.toggle("disconnected", st.connection !== "CONNECTED");
  row.tr.classList.toggle("not-found", st.connection === "NOT_FOUND");
  row.tr.dataset.connection = st.connection; // set once the server's state arrived (tests wait on it)
  renderPut(row, st);
  const v = st.value;
  if (ArrayBuffer.isView(v) && !waveformName) {
    waveformName = name;
    $("waveform-name").textContent = name;
  }
  if (v instanceof NdArray && v.dims.length >= 2) {
    // The demo's moving image by default (or ?image=ID), else the first image seen.
    if (!imageName && (wantedImage === undefined ? true : name === wantedImage)) selectImage(name);
    if (name === imageName) imageView.update(v, st.metadata, st.time);
  }
  if (name === imageName) imageView.setStale(staleReason(st));
  if (typeof v === "number") {
    const trace = row.trace;
    trace.push([traceTime(st), v]);
    // Trimmed here too, not only when drawn: every row keeps a trace, shown or not.
    const from = Date.now() - STRIP_SECONDS * 1000;
    while (trace.length > 1 && trace[0]![0] < from) trace.shift();
  }
  if (typeof v === "number" && st.metadata.type !== "enum" && !stripName) selectStrip(name);
}

// ---- image: drawn on animation frames, the latest frame only (ImageView)
// ?image=ID, else the demo IOC's moving image when the page shows it (set by preload).
let wantedImage = params.get("image") ?? undefined;
let imageName = "";
const imageStats = $("image-stats");
const imageView = new ImageView($<HTMLCanvasElement>("image"), {
  onDraw: (s) => {
    const sent = s.serverStep > 1 ? ` (sent 1:${s.serverStep})` : "";
    imageStats.textContent = `${s.fullWidth}×${s.fullHeight}${sent}${s.step > 1 ? ` (drawn 1:${s.step})` : ""} ${s.colorMode} · received ${s.receivedPerSecond}/s · drawn ${s.drawnPerSecond}/s · ` +
      `latency ${s.latencyMs === undefined ? "–" : `${Math.round(s.latencyMs)} ms`} · draw ${s.drawMs.toFixed(1)} ms · range ${s.low}…${s.high}`;
    Object.assign(imageStats.dataset, { received: String(s.received), drawn: String(s.drawn), drawMs: s.drawMs.toFixed(2), width: String(s.width), height: String(s.height), serverStep: String(s.serverStep), colorMode: s.colorMode });
  },
});
(globalThis as { pvwireImage?: ImageView }).pvwireImage = imageView; // for the browser tests
const mapSelect = $<HTMLSelectElement>("image-map");
for (const m of COLOR_MAPS) mapSelect.add(new Option(m, m));
mapSelect.addEventListener("change", () => imageView.setColorMap(mapSelect.value as ColorMapName));
const autoBox = $<HTMLInputElement>("image-auto");
const lowInput = $<HTMLInputElement>("image-low");
const highInput = $<HTMLInputElement>("image-high");
function applyRange(): void {
  lowInput.disabled = highInput.disabled = autoBox.checked;
  if (autoBox.checked) return imageView.setRange("auto");
  if (lowInput.value === "" && highInput.value === "") {
    // Start from the range just shown, so unticking "auto" changes nothing until edited.
    lowInput.value = String(imageView.stats.low);
    highInput.value = String(imageView.stats.high);
  }
  const lo = Number(lowInput.value);
  const hi = Number(highInput.value);
  if (Number.isFinite(lo) && Number.isFinite(hi) && hi > lo) imageView.setRange([lo, hi]);
}
for (const el of [autoBox, lowInput, highInput]) el.addEventListener("change", applyRange);

function selectImage(name: string): void {
  imageName = name;
  $("image-name").textContent = name;
  const st = rows.get(name)?.state;
  if (st?.value instanceof NdArray) imageView.update(st.value, st.metadata, st.time);
  imageView.setStale(staleReason(st));
}

function selectStrip(name: string): void {
  stripName = name;
  spanRows = undefined;
  void askSpan();
  strip = rows.get(name)?.trace ?? [];
  $("strip-name").textContent = name;
  showArchive();
  for (const r of rows.values()) r.cells.name!.classList.toggle("selected", r.name === name);
}

// ---- plots: the trace and grid on the canvas, tick labels and units as text beside it

interface Plot { canvas: HTMLCanvasElement; ctx: CanvasRenderingContext2D; xTicks: HTMLElement; yTicks: HTMLElement; yTitle: HTMLElement }

function plot(id: string): Plot {
  const canvas = $<HTMLCanvasElement>(id);
  return { canvas, ctx: canvas.getContext("2d")!, xTicks: $(`${id}-x-ticks`), yTicks: $(`${id}-y-ticks`), yTitle: $(`${id}-y-title`) };
}
const waveformPlot = plot("waveform");
const stripPlot = plot("strip");

/** Canvas x of fraction f (0..1) of the x range, and y of a value in [lo, hi]. */
const xAt = (p: Plot, f: number) => PAD_X + (p.canvas.width - 2 * PAD_X) * f;
const yAt = (p: Plot, v: number, lo: number, hi: number) => PAD_Y + (p.canvas.height - 2 * PAD_Y) * (1 - (v - lo) / (hi - lo));

/** Clear, draw the grid at the ticks, and label the axes. xTicks: fractions of the x range. */
function axes(p: Plot, lo: number, hi: number, xTicks: readonly { f: number; label: string }[], units: string): void {
  const { ctx, canvas } = p;
  const w = canvas.width;
  const h = canvas.height;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, w, h);
  ctx.strokeStyle = "#e2e4e9";
  ctx.lineWidth = 1;
  const yTicks = niceTicks(lo, hi, 4);
  ctx.beginPath();
  for (const t of yTicks) {
    const y = Math.round(yAt(p, t.value, lo, hi)) + 0.5;
    ctx.moveTo(PAD_X, y);
    ctx.lineTo(w - PAD_X, y);
  }
  for (const t of xTicks) {
    const x = Math.round(xAt(p, t.f)) + 0.5;
    ctx.moveTo(x, PAD_Y);
    ctx.lineTo(x, h - PAD_Y);
  }
  ctx.stroke();
  ctx.strokeStyle = "#9aa0ab";
  ctx.strokeRect(PAD_X + 0.5, PAD_Y + 0.5, w - 2 * PAD_X - 1, h - 2 * PAD_Y - 1);
  placeTicks(p.yTicks, yTicks.map((t) => ({ at: yAt(p, t.value, lo, hi) / h, label: t.label })), "y");
  placeTicks(p.xTicks, xTicks.map((t) => ({ at: xAt(p, t.f) / w, label: t.label })), "x");
  if (p.yTitle.textContent !== units) p.yTitle.textContent = units;
}

function range(values: ArrayLike<number>): [number, number] {
  let lo = Infinity;
  let hi = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const v = values[i]!;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (!Number.isFinite(lo)) return [0, 1];
  if (lo === hi) return [lo - 1, hi + 1];
  return [lo, hi];
}

/** Mark a plot stale while its channel is not connected (drawn over the plot just drawn), and say
 * so on the canvas's data-stale (for the tests). */
function markStale(p: Plot, reason: string | null): void {
  if (reason !== null) drawStaleMarker(p.ctx, reason);
  if (p.canvas.dataset.stale === (reason ?? undefined)) return;
  if (reason === null) delete p.canvas.dataset.stale;
  else p.canvas.dataset.stale = reason;
}

let waveformShown: unknown = null; // the value last drawn: a full pass only for a new value
let waveformStale: string | null = null;

function drawWaveform(): void {
  const st = rows.get(waveformName)?.state;
  const stale = staleReason(st);
  if (st?.value === waveformShown && stale === waveformStale) return;
  waveformShown = st?.value;
  waveformStale = stale;
  traceWaveform(st);
  markStale(waveformPlot, stale);
}

function traceWaveform(st: ChannelState | undefined): void {
  const p = waveformPlot;
  const v = st?.value;
  const data = v instanceof NdArray ? v.data : ArrayBuffer.isView(v) ? (v as TypedArray) : undefined;
  const units = st?.metadata.units ?? "";
  if (!data || data instanceof BigInt64Array || data instanceof BigUint64Array) {
    axes(p, 0, 1, [], units);
    return;
  }
  // A reduced waveform is already the min/max of each column, interleaved (PROTOCOL.md 4.6).
  const reduced = st?.metadata.reduced?.method === "minmax" ? st.metadata.reduced : undefined;
  const n = reduced ? reduced.from[0]! : data.length;
  const last = Math.max(1, n - 1);
  const d = data as unknown as ArrayLike<number>;
  // Above two points per pixel column: min/max per column, computed in one pass that also gives
  // the y range, then one vertical stroke per column (~630 path segments for 1,000,000 points,
  // where a path through every point took longer than a frame).
  const columns = reduced ? data.length >> 1 : plotColumns(p.canvas);
  const decimate = reduced !== undefined || n > 2 * columns;
  const colLo = decimate ? new Float64Array(columns) : undefined;
  const colHi = decimate ? new Float64Array(columns) : undefined;
  let lo: number;
  let hi: number;
  if (colLo && colHi) {
    lo = Infinity;
    hi = -Infinity;
    for (let c = 0; c < columns; c++) {
      let cLo = Infinity;
      let cHi = -Infinity;
      if (reduced) {
        cLo = d[2 * c]!;
        cHi = d[2 * c + 1]!;
      } else {
        const to = Math.floor(((c + 1) * n) / columns);
        for (let i = Math.floor((c * n) / columns); i < to; i++) {
          const v = d[i]!;
          if (v < cLo) cLo = v;
          if (v > cHi) cHi = v;
        }
      }
      colLo[c] = cLo;
      colHi[c] = cHi;
      if (cLo < lo) lo = cLo;
      if (cHi > hi) hi = cHi;
    }
    if (!Number.isFinite(lo) || !Number.isFinite(hi)) [lo, hi] = [0, 1];
    else if (lo === hi) [lo, hi] = [lo - 1, hi + 1];
  } else {
    [lo, hi] = range(data);
  }
  axes(p, lo, hi, niceTicks(0, last, 5).map((t) => ({ f: t.value / last, label: t.label })), units);
  const { ctx } = p;
  ctx.strokeStyle = "#1565c0";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  if (colLo && colHi) {
    const width = p.canvas.width - 2 * PAD_X;
    for (let c = 0; c < columns; c++) {
      const x = PAD_X + ((c + 0.5) * width) / columns;
      const yLo = yAt(p, colLo[c]!, lo, hi);
      if (c === 0) ctx.moveTo(x, yLo); else ctx.lineTo(x, yLo);
      ctx.lineTo(x, yAt(p, colHi[c]!, lo, hi));
    }
  } else {
    for (let i = 0; i < n; i++) {
      const x = xAt(p, i / last);
      const y = yAt(p, data[i]!, lo, hi);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    }
  }
  ctx.stroke();
  waveformStats.columns = columns;
  waveformStats.reduced = reduced !== undefined;
  waveformStats.drawn++;
}

/** For the bench and the browser tests: waveforms drawn, and how the last was drawn. */
const waveformStats = { drawn: 0, columns: 0, reduced: false };
(globalThis as { pvwireWaveform?: typeof waveformStats }).pvwireWaveform = waveformStats;

function drawStrip(): void {
  const p = stripPlot;
  const now = Date.now();
  const from = now - STRIP_SECONDS * 1000;
  while (strip.length > 0 && strip[0]![0] < from) strip.shift();
  const [lo, hi] = range(strip.map((q) => q[1]).filter((v) => !Number.isNaN(v)));
  stripStats.points = strip.length;
  stripStats.oldestMs = strip[0]?.[0] ?? 0;
  const f = (t: number) => (t - from) / (STRIP_SECONDS * 1000);
  const units = rows.get(stripName)?.state?.metadata.units ?? "";
  axes(p, lo, hi, timeTicks(from, now, 15).map((t) => ({ f: f(t.value), label: t.label })), units);
  const { ctx } = p;
  ctx.strokeStyle = "#c62828";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  let penUp = true; // at the start and after a gap (NaN): a gap is shown as one, not a line
  for (const [t, v] of strip) {
    if (Number.isNaN(v)) { penUp = true; continue; }
    const x = xAt(p, f(t));
    const y = yAt(p, v, lo, hi);
    if (penUp) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    penUp = false;
  }
  ctx.stroke();
}

// ---- wider spans: the server's recorded buckets (GraphQL `history`) instead of the live trace

/** A `history` answer as the strip chart draws it: times in ms, NaN where a row has no value. */
/** What became of a span's part older than the server's own history (GraphQL `archive`). */
interface ArchivePart { state: "JOINED" | "EMPTY" | "MISSING" | "NOT_NEEDED"; reason: string | null; rows: number }
interface SpanRows { resolution: number; t: number[]; min: number[]; max: number[]; mean: number[]; gap: boolean[]; archive: ArchivePart | null }
interface HistoryAnswer {
  resolution: number; seconds: number[]; nanoseconds: number[]; gap: boolean[];
  value: (number | null)[]; min: (number | null)[] | null; max: (number | null)[] | null; mean: (number | null)[] | null;
  archive: ArchivePart | null;
}
const SPAN_QUERY = `query($id: String!, $since: Float!, $max: Int!) {
  history(id: $id, since: $since, maxPoints: $max) { resolution seconds nanoseconds gap value min max mean archive { state reason rows } }
}`;
// Recorded buckets only change when one closes (10 s at the finest tier): asked again this often.
const SPAN_REFRESH_MS = 10_000;
let stripSpan = STRIP_SECONDS;
let spanRows: SpanRows | undefined;
let spanAskedAt = 0;

const num = (v: number | null | undefined): number => (typeof v === "number" ? v : NaN);

/** Ask for the chart's span, about one row per two pixel columns (a min/max band a bucket wide
 * stays readable); the server picks points or the finest buckets that fit. */
async function askSpan(): Promise<void> {
  const name = stripName;
  const span = stripSpan;
  if (!name || span <= STRIP_SECONDS) return;
  spanAskedAt = Date.now();
  const maxPoints = Math.max(1, Math.floor((stripPlot.canvas.width - 2 * PAD_X) / 2));
  try {
    const d = await client.graphql<{ history: HistoryAnswer }>(SPAN_QUERY, { id: name, since: Date.now() / 1000 - span, max: maxPoints });
    if (name !== stripName || span !== stripSpan) return; // the user moved on meanwhile
    const h = d.history;
    const t = h.seconds.map((s, i) => s * 1000 + (h.nanoseconds[i] ?? 0) / 1e6);
    const values = h.value.map(num);
    spanRows = {
      resolution: h.resolution, t, gap: h.gap,
      min: h.min ? h.min.map(num) : values, max: h.max ? h.max.map(num) : values, mean: h.mean ? h.mean.map(num) : values,
      archive: h.archive,
    };
    stripStats.asked = maxPoints;
    stripStats.archive = h.archive?.state ?? "";
    stripStats.archiveRows = h.archive?.rows ?? 0;
    showArchive();
  } catch (e) {
    spanRows = undefined;
    showError(`history of ${name}: ${(e as Error).message}`);
  }
}

$<HTMLSelectElement>("strip-span").addEventListener("change", (ev) => {
  stripSpan = Number((ev.target as HTMLSelectElement).value);
  stripStats.span = stripSpan;
  spanRows = undefined;
  showArchive();
  void askSpan();
});

/** The recorded rows over the span: a min/max band per bucket and the mean as a line, broken at
 * every gap (a gap row, or a row with no value). */
function drawSpan(): void {
  const p = stripPlot;
  const now = Date.now();
  const from = now - stripSpan * 1000;
  const rowsNow = spanRows;
  const f = (t: number) => (t - from) / (stripSpan * 1000);
  const all = rowsNow ? [...rowsNow.min, ...rowsNow.max].filter((v) => !Number.isNaN(v)) : [];
  const [lo, hi] = range(all);
  const step = stripSpan <= 600 ? 120 : stripSpan <= 3600 ? 900 : 4 * 3600;
  axes(p, lo, hi, timeTicks(from, now, step).map((t) => ({ f: f(t.value), label: t.label })), rows.get(stripName)?.state?.metadata.units ?? "");
  stripStats.rows = rowsNow?.t.length ?? 0;
  stripStats.resolution = rowsNow?.resolution ?? 0;
  stripStats.gaps = rowsNow ? rowsNow.gap.filter(Boolean).length : 0;
  if (!rowsNow) return;
  const { ctx } = p;
  const widthMs = rowsNow.resolution * 1000;
  if (widthMs > 0) {
    ctx.fillStyle = "rgba(198, 40, 40, 0.25)";
    for (let i = 0; i < rowsNow.t.length; i++) {
      const mn = rowsNow.min[i]!;
      const mx = rowsNow.max[i]!;
      if (rowsNow.gap[i] || Number.isNaN(mn) || Number.isNaN(mx)) continue;
      const x0 = xAt(p, f(rowsNow.t[i]!));
      const x1 = xAt(p, f(rowsNow.t[i]! + widthMs));
      const y0 = yAt(p, mx, lo, hi);
      ctx.fillRect(x0, y0, Math.max(1, x1 - x0), Math.max(1, yAt(p, mn, lo, hi) - y0));
    }
  }
  ctx.strokeStyle = "#c62828";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  let penUp = true;
  for (let i = 0; i < rowsNow.t.length; i++) {
    const v = rowsNow.mean[i]!;
    if (rowsNow.gap[i] || Number.isNaN(v)) { penUp = true; continue; }
    const x = xAt(p, f(rowsNow.t[i]! + widthMs / 2)); // a bucket's mean at its middle
    const y = yAt(p, v, lo, hi);
    if (penUp) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    penUp = false;
  }
  ctx.stroke();
}

// The strip chart scrolls with time, but 60 redraws a second of it cost half a core of the
// renderer with software rendering (headless Chromium, measured with an otherwise empty page):
// 10 a second move it by about one pixel each and leave the main thread to the data.
const STRIP_REDRAW_MS = 100;
let stripDrawnAt = 0;

function frame(now: number): void {
  drawWaveform();
  if (now - stripDrawnAt >= STRIP_REDRAW_MS) {
    stripDrawnAt = now;
    if (stripSpan > STRIP_SECONDS) {
      if (Date.now() - spanAskedAt >= SPAN_REFRESH_MS) void askSpan();
      drawSpan();
    } else drawStrip();
    markStale(stripPlot, staleReason(rows.get(stripName)?.state));
  }
  requestAnimationFrame(frame);
}
requestAnimationFrame(frame);

// ---- forms
$("add-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = $<HTMLInputElement>("pv-input");
  for (const name of input.value.split(/[\s,]+/)) addChannel(name);
  input.value = "";
});

$("search-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const pattern = $<HTMLInputElement>("search-input").value.trim() || `${DEMO_PREFIX}*`;
  const out = $("search-results");
  client.search(pattern).then((ids) => {
    out.replaceChildren(...ids.map((id) => {
      const b = document.createElement("button");
      b.textContent = id;
      b.dataset.testid = "search-result";
      b.addEventListener("click", () => addChannel(id));
      return b;
    }));
    if (ids.length === 0) out.textContent = "no match";
  }, (e: Error) => showError(`search: ${e.message}`));
});

// ---- identity: sign-in with the site's provider, or the token field
/** Who the token says the user is, for display only: the server verifies it, the page cannot. */
function describeToken(token: string | undefined): string {
  if (!token) return "anonymous";
  try {
    const b64 = token.split(".")[1]!.replace(/-/g, "+").replace(/_/g, "/");
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)); // claims are UTF-8
    const claims = JSON.parse(new TextDecoder().decode(bytes)) as { preferred_username?: unknown; sub?: unknown; groups?: unknown };
    const user = String(claims.preferred_username ?? claims.sub ?? "?");
    return Array.isArray(claims.groups) && claims.groups.length > 0 ? `${user} (${claims.groups.join(", ")})` : user;
  } catch {
    return "token (not a JWT)";
  }
}

let shownIdentity = "";
function showIdentity(): void {
  const who = describeToken(currentToken());
  $("identity").textContent = who;
  $("sign-in").hidden = signIn === undefined || signIn.token() !== undefined;
  $("sign-out").hidden = signIn?.token() === undefined;
  if (who === shownIdentity) return; // a refreshed token of the same user: nothing to redo
  shownIdentity = who;
  showError("");
  // Every subscription registers again under the new identity: its access may differ.
  for (const row of rows.values()) {
    row.putError.textContent = "";
    subscribeRow(row);
  }
}

$("token-form").hidden = !params.has("token-field");
$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = $<HTMLInputElement>("token-input");
  const token = input.value.trim();
  input.value = "";
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  showIdentity();
});
$("sign-in").addEventListener("click", () => {
  signIn?.signIn().catch((e: Error) => showError(`sign in: ${e.message}`));
});
$("sign-out").addEventListener("click", () => {
  signIn?.signOut().catch((e: Error) => showError(`sign out: ${e.message}`));
});

// ---- preload the demo IOC's channels (search first; the fixed list if search finds none)
async function preload(): Promise<void> {
  const pre = params.get("pvs");
  if (pre !== null) {
    pre.split(",").forEach(addChannel);
    return;
  }
  let ids: string[] = [];
  try {
    ids = (await client.search(`*${DEMO_PREFIX}*`)).filter((id) => !/\.[A-Z]+$/.test(id));
  } catch {
    /* fall back to the list */
  }
  const list = ids.length > 0 ? ids : DEMO_PVS;
  wantedImage ??= list.find((n) => n.endsWith(`${DEMO_PREFIX}IMAGE`));
  list.forEach(addChannel);
  const sine = list.find((n) => n.endsWith(":SINE"));
  if (sine) selectStrip(sine);
}
// Sign-in first: a page the provider just sent back must subscribe as the signed-in user.
void setUpSignIn(SERVER, showIdentity, providerAnswer)
  .then((s) => {
    signIn = s;
    showIdentity();
    if (s?.failure) showError(`sign in: ${s.failure}`);
  }, (e: Error) => {
    showIdentity();
    showError(`sign in: ${e.message}`);
  })
  .finally(() => void preload());
