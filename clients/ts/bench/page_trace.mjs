// Where the demo page's renderer spends its time per frame: a Chrome trace (CDP Tracing) of the
// page showing one channel, summarised as self time per event name on each busy thread of the
// page's renderer process, per frame received. Used to find that a whole 8 MB frame costs the
// main thread ~150 ms in WebSocket receive (Mojo messages of network.mojom.WebSocketClient and
// its data pipe) before any script runs (bench/README.md, "The page in headless Chromium").
//
//   npm run build && node bench/page_trace.mjs [channel] [query] [seconds]
//   e.g. node bench/page_trace.mjs 'sim://waveform?length=1000000&rate=10' full=1
import { launchChromium, sleep, startServer } from "./stack.mjs";

const [id = "sim://waveform?length=1000000&rate=10", query = "", seconds = "5"] = process.argv.slice(2);
const { server, url } = await startServer();
const browser = await launchChromium();
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1400 } });
  const cdp = await page.context().newCDPSession(page);
  const image = id.includes("image") ? `&image=${encodeURIComponent(id)}` : "";
  await page.goto(`${url}/?pvs=${encodeURIComponent(id)}${image}${query ? `&${query}` : ""}`);
  await sleep(3000);
  const events = [];
  cdp.on("Tracing.dataCollected", (e) => events.push(...e.value));
  const complete = new Promise((r) => cdp.once("Tracing.tracingComplete", r));
  const entries = () => page.evaluate(() => globalThis.pvwire.stats.entries);
  const e0 = await entries();
  await cdp.send("Tracing.start", { categories: "devtools.timeline,v8,v8.execute,blink,toplevel,mojom,ipc,net,disabled-by-default-devtools.timeline", transferMode: "ReportEvents" });
  await sleep(Number(seconds) * 1000);
  await cdp.send("Tracing.end");
  await complete;
  const frames = Math.max(1, (await entries()) - e0);
  // The renderer: the process whose main thread is CrRendererMain.
  const names = new Map();
  for (const e of events) if (e.ph === "M" && e.name === "thread_name") names.set(`${e.pid}/${e.tid}`, e.args.name);
  const rendererPid = [...names].find(([, n]) => n === "CrRendererMain")?.[0].split("/")[0];
  const byThread = new Map();
  for (const e of events) {
    if (e.ph !== "X" || e.dur === undefined || String(e.pid) !== rendererPid) continue;
    const key = `${e.pid}/${e.tid}`;
    if (!byThread.has(key)) byThread.set(key, []);
    byThread.get(key).push(e);
  }
  const out = { channel: id, query, frames, seconds: Number(seconds), threads: {} };
  for (const [key, list] of byThread) {
    // Self time: an event's duration less that of the events nested in it.
    list.sort((a, b) => a.ts - b.ts || b.dur - a.dur);
    const self = new Map();
    const stack = [];
    let busy = 0;
    for (const e of list) {
      while (stack.length && stack.at(-1).ts + stack.at(-1).dur <= e.ts) stack.pop();
      if (stack.length) self.set(stack.at(-1).name, (self.get(stack.at(-1).name) ?? 0) - e.dur);
      else busy += e.dur;
      const label = e.args?.chrome_mojo_event_info?.watcher_notify_interface_tag ? `${e.name} (${e.args.chrome_mojo_event_info.watcher_notify_interface_tag})` : e.name;
      e.name = label;
      self.set(label, (self.get(label) ?? 0) + e.dur);
      stack.push(e);
    }
    if (busy / 1000 / frames < 1) continue;
    const top = [...self].sort((a, b) => b[1] - a[1]).slice(0, 8).map(([n, us]) => [n, +(us / 1000 / frames).toFixed(2)]);
    out.threads[`${names.get(key) ?? "?"} ${key}`] = { busy_ms_per_frame: +(busy / 1000 / frames).toFixed(1), self_ms_per_frame: Object.fromEntries(top) };
  }
  console.log(JSON.stringify(out, null, 1));
} finally {
  await browser.close();
  server.kill();
}
