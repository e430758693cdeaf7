// The demo page in headless Chromium with big frames at 10 Hz: frames received and drawn per
// second, the page's main-thread time per frame (Chrome's TaskDuration over the window, so
// WebSocket receive, MessagePack decode, table update and drawing all count), screenshots.
//
//   npm run build && node bench/page_images.mjs [seconds]
//
// Cases: sim://image 1024x1024 and 2048x2048 uint16, and a 1,000,000-point float64 waveform on
// the plot, each at 10 Hz, one at a time, each twice in the same run: as the page shows it by
// default (arrays reduced by the server for display: min/max per plot column, images at most 2
// megapixels; PROTOCOL.md section 4.6) and whole (`?full=1`). Prints one JSON line per case;
// screenshots go to bench/results/ at the repository root. Uses Debian's /usr/bin/chromium
// (PVWIRE_CHROMIUM). The `-worker` cases measure the other remedy in the same run: whole arrays
// received and decoded by the client in a Web Worker, handed to the main thread by transfer, the
// main thread only drawing (bench/worker_receive.ts). PVWIRE_BENCH_CASES=a,b runs only those.
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { loadavg } from "node:os";
import { join } from "node:path";
import { build } from "esbuild";
import { launchChromium, ROOT, sleep, startServer } from "./stack.mjs";

const OUT = join(ROOT, "bench/results");
const WINDOW_S = Number(process.argv[2] ?? 10);
const WARMUP_S = 4;

// Our browser's command line carries this switch (Chromium ignores unknown ones), so its
// renderers are told apart from other Chromium processes on the machine.
const MARKER = `--pvwire-bench=${process.pid}`;

function procStat(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
  return stat.slice(stat.lastIndexOf(")") + 2).split(" "); // [state, ppid, ...]
}

/** CPU seconds (user + system) of this browser's renderer processes: robust to a loaded
 * machine, where wall-clock task durations include the time the renderer waited for a core. */
function rendererCpuSeconds() {
  const pids = readdirSync("/proc").filter((d) => /^\d+$/.test(d));
  const browserPid = pids.find((pid) => { try { return readFileSync(`/proc/${pid}/cmdline`, "latin1").includes(MARKER); } catch { return false; } });
  let ticks = 0;
  for (const pid of pids) {
    try {
      if (!readFileSync(`/proc/${pid}/cmdline`, "latin1").includes("--type=renderer")) continue;
      let up = pid;
      for (let i = 0; i < 5 && up !== browserPid && up !== "1"; i++) up = procStat(up)[1];
      if (up !== browserPid) continue;
      const f = procStat(pid);
      ticks += Number(f[11]) + Number(f[12]); // utime, stime
    } catch { /* exited */ }
  }
  return ticks / 100; // USER_HZ
}

// The worker cases' script: bundled twice, the second carrying the first as the worker's source.
const bundle = async (workerSource) => (await build({
  entryPoints: [join(import.meta.dirname, "worker_receive.ts")], bundle: true, format: "iife", target: "es2022",
  write: false, define: { WORKER_SOURCE: JSON.stringify(workerSource) }, logLevel: "warning",
})).outputFiles[0].text;
const workerPage = await bundle(await bundle(""));

const { server, url } = await startServer();
const browser = await launchChromium([MARKER]);
mkdirSync(OUT, { recursive: true });
const results = [];
const sizes = [
  { name: "image-1024-uint16", id: "sim://image?width=1024&height=1024&dtype=uint16&rate=10", image: true },
  { name: "image-2048-uint16", id: "sim://image?width=2048&height=2048&dtype=uint16&rate=10", image: true },
  { name: "waveform-1M-float64", id: "sim://waveform?length=1000000&rate=10", image: false },
];
const ONLY = process.env.PVWIRE_BENCH_CASES?.split(",");
const cases = sizes.flatMap((c) => [
  { ...c, full: false }, { ...c, name: `${c.name}-full`, full: true },
  ...(c.name === "image-1024-uint16" ? [] : [{ ...c, name: `${c.name}-worker`, worker: true }]),
])
  .filter((c) => !ONLY || ONLY.includes(c.name));
try {
  for (const c of cases) {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1400 } });
    const cdp = await page.context().newCDPSession(page);
    await cdp.send("Performance.enable");
    const q = `pvs=${encodeURIComponent(c.id)}${c.image ? `&image=${encodeURIComponent(c.id)}` : ""}${c.full ? "&full=1" : ""}`;
    if (c.worker) {
      await page.goto(`${url}/healthz`); // any page of the server's origin
      await page.setContent("<!doctype html><html><body></body></html>");
      await page.addScriptTag({ content: workerPage });
      await page.evaluate(([u, id]) => globalThis.pvwireWorkerStart(u, id), [url, c.id]);
    } else {
      await page.goto(`${url}/?${q}`);
    }
    await sleep(WARMUP_S * 1000);
    const sample = async () => {
      const m = Object.fromEntries((await cdp.send("Performance.getMetrics")).metrics.map((x) => [x.name, x.value]));
      const s = await page.evaluate(() => {
        const w = globalThis.pvwireWorkerStats;
        if (w) return { received: w.received, drawn: w.drawn, drawMsTotal: w.drawMsTotal, waveformsDrawn: w.drawn, client: { entries: w.received, bytes: NaN } };
        const st = globalThis.pvwireImage.stats;
        const c = { ...globalThis.pvwire.stats };
        return { received: st.received, drawn: st.drawn, drawMsTotal: st.drawMsTotal, waveformsDrawn: globalThis.pvwireWaveform.drawn, client: c };
      });
      return { task: m.TaskDuration, script: m.ScriptDuration, cpu: rendererCpuSeconds(), t: performance.now(), ...s };
    };
    // Waveform frames are counted from the page's own per-second update counter.
    const draws = [];
    const a = await sample();
    const until = Date.now() + WINDOW_S * 1000;
    while (Date.now() < until) {
      await sleep(200);
      if (c.image && !c.worker) draws.push(await page.evaluate(() => globalThis.pvwireImage.stats.drawMs));
    }
    draws.sort((x, y) => x - y);
    const b = await sample();
    const wall = (b.t - a.t) / 1000;
    // Frames: entries the client applied (one per frame: one channel on the page).
    const received = c.image || c.worker ? b.received - a.received : b.client.entries - a.client.entries;
    const row = {
      case: c.name,
      window_s: +wall.toFixed(2),
      mb_per_frame: c.worker ? undefined : +((b.client.bytes - a.client.bytes) / Math.max(1, received) / 1e6).toFixed(3),
      received_per_s: +(received / wall).toFixed(2),
      drawn_per_s: +(((c.image ? b.drawn - a.drawn : b.waveformsDrawn - a.waveformsDrawn)) / wall).toFixed(2),
      draw_ms_per_frame: (c.image || c.worker) && b.drawn > a.drawn ? +((b.drawMsTotal - a.drawMsTotal) / (b.drawn - a.drawn)).toFixed(2) : undefined,
      main_thread_ms_per_frame: +(((b.task - a.task) * 1000) / Math.max(1, received)).toFixed(2),
      main_thread_busy_pct: +((100 * (b.task - a.task)) / wall).toFixed(1),
      script_ms_per_frame: +(((b.script - a.script) * 1000) / Math.max(1, received)).toFixed(2),
      renderer_cpu_ms_per_frame: +(((b.cpu - a.cpu) * 1000) / Math.max(1, received)).toFixed(2),
      renderer_cpu_pct: +((100 * (b.cpu - a.cpu)) / wall).toFixed(1),
      draw_ms_min: c.image && draws.length ? +draws[0].toFixed(2) : undefined,
      loadavg_1m: +loadavg()[0].toFixed(2),
    };
    results.push(row);
    console.log(JSON.stringify(row));
    await page.screenshot({ path: join(OUT, `page-${c.name}.png`), fullPage: true });
    await page.close();
  }
} finally {
  await browser.close();
  server.kill();
}
writeFileSync(join(OUT, "page_images.json"), JSON.stringify(results, null, 1));
