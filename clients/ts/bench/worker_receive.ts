// The page_images bench's "worker" cases: the alternative to server-side reduction measured in
// the same run. A dedicated Web Worker runs the PvwireClient (WebSocket receive and MessagePack
// decode); arrays reach the main thread by transfer (no copy) and the main thread only draws,
// with the page's own ImageView, or min/max per column for a waveform as the demo page does.
import { ImageView, NdArray, PvwireClient, type DType, type TypedArray } from "../src/index.js";

interface Frame { dtype: DType; dims: number[]; data: TypedArray; colorMode: string | undefined }

declare const WORKER_SOURCE: string; // set by the bench: this file bundled, run as the worker

if (typeof document === "undefined") {
  // Worker: receive and decode, hand each array over by transfer.
  const post = globalThis.postMessage.bind(globalThis) as (m: unknown, transfer: Transferable[]) => void;
  globalThis.onmessage = (ev: MessageEvent<{ url: string; id: string }>) => {
    const client = new PvwireClient(ev.data.url);
    client.subscribe([ev.data.id], (st) => {
      const v = st.value;
      const data = v instanceof NdArray ? v.data : ArrayBuffer.isView(v) ? (v as TypedArray) : undefined;
      if (!data) return;
      const frame: Frame = { dtype: v instanceof NdArray ? v.dtype : "float64", dims: v instanceof NdArray ? [...v.dims] : [data.length], data, colorMode: st.metadata.colorMode };
      // The TypedArray views the received message: transferring its buffer moves it, no copy.
      post(frame, [data.buffer]);
    });
  };
} else {
  const stats = { received: 0, drawn: 0, drawMsTotal: 0 };
  (globalThis as { pvwireWorkerStats?: typeof stats }).pvwireWorkerStats = stats;
  const canvas = document.createElement("canvas");
  document.body.appendChild(canvas);
  canvas.style.width = "512px";
  const view = new ImageView(canvas, { onDraw: (s) => { stats.drawn = s.drawn; stats.drawMsTotal = s.drawMsTotal; } });
  const plot = document.createElement("canvas");
  plot.width = 640;
  plot.height = 240;
  document.body.appendChild(plot);
  const ctx = plot.getContext("2d")!;
  let latest: Frame | undefined;
  const drawWaveform = () => {
    const f = latest;
    latest = undefined;
    if (f) {
      const t0 = performance.now();
      const d = f.data as unknown as ArrayLike<number>;
      const n = d.length;
      const columns = plot.width - 12;
      const lo = new Float64Array(columns).fill(Infinity);
      const hi = new Float64Array(columns).fill(-Infinity);
      let min = Infinity;
      let max = -Infinity;
      for (let c = 0; c < columns; c++) {
        const to = Math.floor(((c + 1) * n) / columns);
        for (let i = Math.floor((c * n) / columns); i < to; i++) {
          const v = d[i]!;
          if (v < lo[c]!) lo[c] = v;
          if (v > hi[c]!) hi[c] = v;
        }
        if (lo[c]! < min) min = lo[c]!;
        if (hi[c]! > max) max = hi[c]!;
      }
      const y = (v: number) => 10 + (plot.height - 20) * (1 - (v - min) / (max - min || 1));
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, plot.width, plot.height);
      ctx.strokeStyle = "#1565c0";
      ctx.beginPath();
      for (let c = 0; c < columns; c++) {
        ctx.moveTo(6.5 + c, y(lo[c]!));
        ctx.lineTo(6.5 + c, y(hi[c]!));
      }
      ctx.stroke();
      stats.drawn++;
      stats.drawMsTotal += performance.now() - t0;
    }
    requestAnimationFrame(drawWaveform);
  };
  requestAnimationFrame(drawWaveform);
  const worker = new Worker(URL.createObjectURL(new Blob([WORKER_SOURCE], { type: "text/javascript" })));
  worker.onmessage = (ev: MessageEvent<Frame>) => {
    stats.received++;
    const f = ev.data;
    if (f.dims.length >= 2) view.update(new NdArray(f.dtype, f.dims, f.data), { colorMode: f.colorMode });
    else latest = f;
  };
  (globalThis as { pvwireWorkerStart?: (url: string, id: string) => void }).pvwireWorkerStart = (url, id) => worker.postMessage({ url, id });
}
