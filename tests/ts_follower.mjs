// The TypeScript client following a counter through a load balancer, for
// tests/test_container.py: one JSON line per counter value ({"value"}) and per change of the
// channel's connection ({"connection", "reason"}), plus how many updates of every channel came.
// Nothing is done on a disconnect: the client reconnects and re-attaches by itself.
//   node tests/ts_follower.mjs URL COUNTER_ID [LOAD_ID...]
import { createRequire } from "node:module";
import { PvwireClient } from "../clients/ts/dist/index.js";

const require = createRequire(new URL("../clients/ts/package.json", import.meta.url));
const WebSocket = require("ws");

const [url, counter, ...load] = process.argv.slice(2);
const client = new PvwireClient(url, { WebSocket });
let connection = "";
let updates = 0;
const emit = (doc) => process.stdout.write(`${JSON.stringify({ ...doc, updates })}\n`);
client.subscribe([counter, ...load], (ch, changed) => {
  updates += 1;
  if (ch.id !== counter) return;
  if (ch.connection !== connection) {
    connection = ch.connection;
    emit({ connection, reason: ch.reason });
  }
  if (changed.includes("value") && ch.connection === "CONNECTED" && typeof ch.value === "number") {
    emit({ value: ch.value });
  }
});
process.on("SIGTERM", () => {
  client.close();
  process.exit(0);
});
