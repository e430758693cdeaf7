// What the page benchmarks share: a pvwire server on a free loopback port, and Debian's headless
// Chromium (PVWIRE_CHROMIUM) with the switches that keep it off the network.
import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { join } from "node:path";
import { chromium } from "playwright-core";

export const ROOT = join(import.meta.dirname, "../../..");
const PYTHON = process.env.PVWIRE_PYTHON ?? join(ROOT, ".venv/bin/python");
const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const freePort = () => new Promise((resolve) => {
  const s = createServer();
  s.listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => resolve(port)); });
});

/** `pvwire serve` with a 64 MiB send budget (whole 8 MB frames at 10 Hz must not close the
 * page as slow); resolves once it answers. */
export async function startServer() {
  const port = await freePort();
  const server = spawn(PYTHON, ["-m", "pvwire.cli", "serve", "--loopback", "--port", String(port), "--send-budget", String(64 << 20), "--log-level", "warning"], { stdio: "inherit" });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try { if ((await fetch(`${url}/`)).ok) break; } catch { /* not up yet */ }
    if (i > 300) { server.kill(); throw new Error("server did not start"); }
    await sleep(100);
  }
  return { server, url };
}

export const launchChromium = (extraArgs = []) => chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: [...extraArgs, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
