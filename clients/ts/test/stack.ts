// Spawns test/launch_stack.py (demo IOC + pvwire server) and talks to it over stdin/stdout.
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

export const PYTHON = process.env.PVWIRE_PYTHON ?? join(import.meta.dirname, "../../../.venv/bin/python");
const ROOT = join(import.meta.dirname, "../../..");

export type StackCommand =
  | "kill-ioc" | "start-ioc" | "restart-server" | "stop-server" | "start-server"
  | "kill-server" | "freeze-ioc" | "resume-ioc" | `dbpf ${string}`;

export interface Stack {
  url: string;
  prefix: string;
  log: string;
  /** With `--tls`: the test CA's PEM file, and the certificate's SPKI hash (for Chromium). */
  ca?: string;
  spki?: string;
  /** With `--tls`: the server's certificate chain and key (PEM files), for a page served over https. */
  cert?: string;
  key?: string;
  command(cmd: StackCommand): Promise<void>;
  stop(): Promise<void>;
}

/** Why the stack cannot run here (no Python env, no server CLI yet), or undefined when it can. */
export function stackUnavailable(): string | undefined {
  if (!existsSync(PYTHON)) return `no Python at ${PYTHON} (set PVWIRE_PYTHON)`;
  if (!existsSync(join(ROOT, "server/pvwire/cli.py"))) return "server/pvwire/cli.py does not exist yet";
  return undefined;
}

/** `env` is added to the launcher's environment, which the IOC and the server inherit. */
export async function startStack(extraServerArgs: string[] = [], env: Record<string, string> = {}): Promise<Stack> {
  const proc: ChildProcessWithoutNullStreams = spawn(PYTHON, [join(import.meta.dirname, "launch_stack.py"), ...extraServerArgs], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stderr = "";
  proc.stderr.on("data", (d: Buffer) => { stderr += d.toString(); });
  const lines = createInterface({ input: proc.stdout });
  const queue: string[] = [];
  const waiters: ((line: string) => void)[] = [];
  lines.on("line", (l) => { const w = waiters.shift(); if (w) w(l); else queue.push(l); });
  const exited = new Promise<string>((resolve) => proc.on("exit", (code) => resolve(`launcher exited (${code}): ${stderr.slice(-2000)}`)));
  const next = (): Promise<string> => {
    const q = queue.shift();
    if (q !== undefined) return Promise.resolve(q);
    return Promise.race([new Promise<string>((r) => waiters.push(r)), exited.then((m) => { throw new Error(m); })]);
  };
  const first = JSON.parse(await next()) as { url?: string; prefix: string; log: string; ca?: string; spki?: string; cert?: string; key?: string; error?: string };
  if (!first.url) {
    proc.stdin.end();
    throw new Error(`stack did not start: ${first.error}\n${first.log}`);
  }
  return {
    url: first.url,
    prefix: first.prefix,
    log: first.log,
    ca: first.ca,
    spki: first.spki,
    cert: first.cert,
    key: first.key,
    async command(cmd) {
      proc.stdin.write(cmd + "\n");
      const r = JSON.parse(await next()) as { ok: boolean; error?: string };
      if (!r.ok) throw new Error(`${cmd} failed: ${r.error}`);
    },
    async stop() {
      proc.stdin.end();
      await Promise.race([exited, new Promise((r) => setTimeout(r, 15_000))]);
      if (proc.exitCode === null) proc.kill("SIGKILL");
    },
  };
}

export const until = async (cond: () => boolean, ms = 30_000, what = "condition"): Promise<void> => {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};
