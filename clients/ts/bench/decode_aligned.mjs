// What the padding of PROTOCOL.md section 3 saves the browser: decodeServerMessage in headless
// Chromium on the same DATA message laid out as the server sends it (every ndarray's data on a
// multiple of 8 from the message's start: the TypedArray views the message) and as it was sent
// before the padding (the same bytes without the nil items: misaligned data, copied once by
// decodeNdArray). Messages of one channel, att 1: a 1,000,000-point float64 waveform at seq 100
// and a 2048 x 2048 uint16 image at seq 200. Before the padding such data started at byte 22, 23,
// 24 or 26 of a DATA message as seq took 1, 2, 3 or 5 bytes (float64 aligned only while seq was
// 256-65,535, uint16 except while it was 128-255), and anywhere behind other entries or groups.
// Best and median of 30 decodes each, ms (Chromium's clock has a 0.1 ms grain).
//
//   node bench/decode_aligned.mjs
import { execFileSync } from "node:child_process";
import { loadavg } from "node:os";
import { join } from "node:path";
import { build } from "esbuild";
import { chromium } from "playwright-core";

const ROOT = join(import.meta.dirname, "../../..");
const PYTHON = process.env.PVWIRE_PYTHON ?? join(ROOT, ".venv/bin/python");
const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const REPEAT = 30;

// The server's own encoder makes both layouts: `Entries` without `arrays` is the previous one.
const frames = JSON.parse(execFileSync(PYTHON, ["-c", `
import base64, json
import numpy as np
from pvwire.wire import codec as wire
cases = {
    "waveform-1M-float64": (100, np.sin(np.arange(1_000_000) / 100.0)),
    "image-2048-uint16": (200, (np.arange(2048 * 2048) % 65536).astype("<u2").reshape(2048, 2048)),
}
out = {}
for name, (seq, value) in cases.items():
    body = wire.encode_entry_body(3, value=value, serial=7, seconds=1_700_000_000, nanoseconds=5)
    padded = wire.encode_entries([0], [body])
    unpadded = wire.Entries(padded.length, padded.head, padded.data)
    for layout, entries in (("aligned", padded), ("unaligned", unpadded)):
        out[f"{name} {layout}"] = base64.b64encode(wire.encode_data(seq, [(1, entries)])).decode()
print(json.dumps(out))
`], { maxBuffer: 1 << 28, env: { ...process.env, PYTHONPATH: `${join(ROOT, "server")}:${process.env.PYTHONPATH ?? ""}` } }).toString());

const script = (await build({
  stdin: { contents: `import { decodeServerMessage } from "./src/index.js"; globalThis.decodeServerMessage = decodeServerMessage;`, resolveDir: join(import.meta.dirname, ".."), loader: "ts" },
  bundle: true, format: "iife", target: "es2022", write: false, logLevel: "warning",
})).outputFiles[0].text;

const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--headless", "--no-sandbox", "--disable-gpu"] });
try {
  const page = await browser.newPage();
  await page.setContent("<!doctype html><html><body></body></html>");
  await page.addScriptTag({ content: script });
  for (const [name, b64] of Object.entries(frames)) {
    const r = await page.evaluate(([b64, repeat]) => {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const times = [];
      let copied = 0;
      for (let i = 0; i < repeat; i++) {
        // A fresh ArrayBuffer per decode, as each WebSocket message is.
        const msg = bytes.slice();
        const t = performance.now();
        const m = globalThis.decodeServerMessage(msg);
        times.push(performance.now() - t);
        const v = m.groups[0].entries[0].value;
        const data = v.data ?? v;
        if (data.buffer !== msg.buffer) copied++;
      }
      times.sort((a, b) => a - b);
      return { best_ms: +times[0].toFixed(3), median_ms: +times[times.length >> 1].toFixed(3), copied_per_decode: copied / repeat, mb: +(bytes.length / 1e6).toFixed(2) };
    }, [b64, REPEAT]);
    console.log(JSON.stringify({ case: name, ...r, loadavg_1m: +loadavg()[0].toFixed(2) }));
  }
} finally {
  await browser.close();
}
