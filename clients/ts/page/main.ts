// The pvwire demo page: one PvwireClient, one subscription per added channel (all on one
// WebSocket), a live table, puts, a waveform plot and a one-minute strip chart on canvases.
import { NdArray, PvwireClient, toDate, type ChannelState, type Subscription, type TypedArray } from "../src/index.js";

const DEMO_PREFIX = "PVWIRE:DEMO:";
const DEMO_PVS = ["COUNTER", "COUNTER_1HZ", "SINE", "NOISE", "MODE", "MESSAGE", "SP", "RBV", "WAVEFORM"].map((n) => DEMO_PREFIX + n);
const STRIP_SECONDS = 60;

const params = new URLSearchParams(location.search);
const client = new PvwireClient(params.get("server") ?? location.origin);
(globalThis as { pvwire?: PvwireClient }).pvwire = client; // for the browser tests and the console

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const rowsEl = $("rows");
const errorEl = $("error");

interface Row { name: string; tr: HTMLTableRowElement; cells: Record<string, HTMLElement>; sub: Subscription; state?: ChannelState }
const rows = new Map<string, Row>();
let stripName = "";
const strip: [number, number][] = []; // [ms, value]
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
  if (v instanceof NdArray) return `${v.dtype} image ${v.dims.join("×")}`;
  if (ArrayBuffer.isView(v)) return `[${(v as TypedArray).length} values]${m.units ? ` ${m.units}` : ""}`;
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
  cells.name!.addEventListener("click", () => selectStrip(name));
  cells.conn!.textContent = "CONNECTING";
  rowsEl.appendChild(tr);
  const sub = client.subscribe([name], (st) => onUpdate(name, st), { onError: (e) => { cells.conn!.textContent = `ERROR: ${e.message}`; cells.conn!.className = "conn conn-FAILED"; } });
  rows.set(name, { name, tr, cells, sub });
  $("channel-count").textContent = String(rows.size);
}

function renderPut(row: Row, st: ChannelState): void {
  const cell = row.cells.put!;
  const writable = st.metadata.writable === true;
  if (!writable) {
    cell.textContent = "";
    return;
  }
  if (cell.querySelector("form")) return;
  const form = document.createElement("form");
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
  form.append(input, button);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = row.state?.metadata.type ?? "";
    const raw = input.value;
    const value = t === "string" ? raw : Number(raw);
    if (typeof value === "number" && Number.isNaN(value)) return showError(`not a number: ${raw}`);
    client.put(row.name, value, { wait: true }).then(() => showError(""), (e: Error) => showError(`put ${row.name}: ${e.message}`));
  });
  cell.appendChild(form);
}

function onUpdate(name: string, st: ChannelState): void {
  updates++;
  const row = rows.get(name);
  if (!row) return;
  row.state = st;
  row.cells.value!.textContent = formatValue(st);
  const sev = st.alarm?.severity ?? "UNKNOWN";
  row.cells.severity!.innerHTML = `<span class="sev sev-${sev}">${sev}</span>`;
  row.cells.time!.textContent = formatTime(st);
  row.cells.conn!.textContent = st.connection + (st.reason ? ` (${st.reason})` : "");
  row.cells.conn!.className = `conn conn-${st.connection}`;
  row.tr.classList.toggle("disconnected", st.connection !== "CONNECTED");
  renderPut(row, st);
  const v = st.value;
  if (ArrayBuffer.isView(v) && !waveformName) {
    waveformName = name;
    $("waveform-name").textContent = name;
  }
  if (typeof v === "number" && st.metadata.type !== "enum" && !stripName) selectStrip(name);
  if (name === stripName && typeof v === "number") strip.push([Date.now(), v]);
}

function selectStrip(name: string): void {
  stripName = name;
  strip.length = 0;
  $("strip-name").textContent = name;
  for (const r of rows.values()) r.cells.name!.classList.toggle("selected", r.name === name);
  const v = rows.get(name)?.state?.value;
  if (typeof v === "number") strip.push([Date.now(), v]);
}

// ---- plots
function axes(ctx: CanvasRenderingContext2D, w: number, h: number, lo: number, hi: number): void {
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, w, h);
  ctx.strokeStyle = "#e2e4e9";
  ctx.fillStyle = "#666";
  ctx.font = "11px sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = 10 + ((h - 20) * i) / 4;
    ctx.beginPath();
    ctx.moveTo(50, y);
    ctx.lineTo(w, y);
    ctx.stroke();
    ctx.fillText((hi - ((hi - lo) * i) / 4).toPrecision(4), 2, y + 4);
  }
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

function drawWaveform(): void {
  const canvas = $<HTMLCanvasElement>("waveform");
  const ctx = canvas.getContext("2d")!;
  const v = rows.get(waveformName)?.state?.value;
  const data = v instanceof NdArray ? v.data : ArrayBuffer.isView(v) ? (v as TypedArray) : undefined;
  const w = canvas.width;
  const h = canvas.height;
  if (!data || data instanceof BigInt64Array || data instanceof BigUint64Array) {
    axes(ctx, w, h, 0, 1);
    return;
  }
  const [lo, hi] = range(data);
  axes(ctx, w, h, lo, hi);
  ctx.strokeStyle = "#1565c0";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  const n = data.length;
  for (let i = 0; i < n; i++) {
    const x = 50 + ((w - 55) * i) / Math.max(1, n - 1);
    const y = 10 + (h - 20) * (1 - (data[i]! - lo) / (hi - lo));
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  }
  ctx.stroke();
}

function drawStrip(): void {
  const canvas = $<HTMLCanvasElement>("strip");
  const ctx = canvas.getContext("2d")!;
  const now = Date.now();
  while (strip.length > 0 && strip[0]![0] < now - STRIP_SECONDS * 1000) strip.shift();
  const w = canvas.width;
  const h = canvas.height;
  const [lo, hi] = range(strip.map((p) => p[1]));
  axes(ctx, w, h, lo, hi);
  ctx.strokeStyle = "#c62828";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  strip.forEach(([t, v], i) => {
    const x = 50 + (w - 55) * (1 - (now - t) / (STRIP_SECONDS * 1000));
    const y = 10 + (h - 20) * (1 - (v - lo) / (hi - lo));
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

function frame(): void {
  drawWaveform();
  drawStrip();
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
  list.forEach(addChannel);
  const sine = list.find((n) => n.endsWith(":SINE"));
  if (sine) selectStrip(sine);
}
void preload();
