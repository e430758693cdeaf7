// Follows one channel with the TypeScript client and prints a JSON line per event, for
// bench/resume.py: {"ev": "value", "t": ms since epoch} for each connected value,
// {"ev": "state", "state": ..., "t": ...} for each connection state.
// Usage: node bench/resume_follow.mjs URL CHANNEL [DIST_DIR]   (DIST_DIR default ../dist)
import { pathToFileURL } from "node:url";
import { resolve } from "node:path";
import WebSocket from "ws";

const [url, channel, dist = resolve(import.meta.dirname, "../dist")] = process.argv.slice(2);
const { PvwireClient } = await import(pathToFileURL(resolve(dist, "index.js")).href);
const out = (o) => process.stdout.write(JSON.stringify({ ...o, t: Date.now() }) + "\n");
const client = new PvwireClient(url, { WebSocket });
client.on("state", (state) => out({ ev: "state", state }));
client.on("error", (e) => out({ ev: "error", message: String(e.message) }));
client.subscribe([channel], (st) => {
  if (st.connection === "CONNECTED" && st.value != null) out({ ev: "value" });
});
process.stdin.on("end", () => { client.close(); process.exit(0); });
process.stdin.resume();
