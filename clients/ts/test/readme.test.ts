// Every code block of README.md runs as written, against the real server and demo IOC:
// `ts` blocks are type-checked with the library's strict settings and run in Node, `ts browser`
// blocks are type-checked and run in Chromium at the server's origin. The only change made to a
// block is the server address: `http://localhost:8080` becomes the test server's.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { build } from "esbuild";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const HERE = join(import.meta.dirname, "..");
const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`);
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`README tests cannot run: ${skip}`);

/** A block runs at most this long; every example ends by itself well within it. */
const RUN_MS = 60_000;
const README_URL = "http://localhost:8080";

interface Block { n: number; line: number; lang: string; code: string }

function readmeBlocks(): Block[] {
  const text = readFileSync(join(HERE, "README.md"), "utf8");
  const blocks: Block[] = [];
  for (const m of text.matchAll(/^```([^\n]*)\n([\s\S]*?)^```\s*$/gm)) {
    const line = text.slice(0, m.index).split("\n").length;
    blocks.push({ n: blocks.length + 1, line, lang: m[1]!.trim(), code: m[2]! });
  }
  return blocks;
}

function run(cmd: string, args: string[], cwd: string, ms: number): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { cwd, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    p.stdout.on("data", (d: Buffer) => { out += d.toString(); });
    p.stderr.on("data", (d: Buffer) => { err += d.toString(); });
    const timer = setTimeout(() => p.kill("SIGKILL"), ms);
    p.on("error", reject);
    p.on("exit", (code) => { clearTimeout(timer); resolve({ code, out, err }); });
  });
}

/** Bundle a block with the library's source (`@pvwire/client` is this package). */
async function bundle(code: string, platform: "node" | "browser"): Promise<string> {
  const r = await build({
    stdin: { contents: code, resolveDir: HERE, loader: "ts", sourcefile: "README.md" },
    bundle: true,
    write: false,
    platform,
    format: platform === "node" ? "esm" : "iife",
    target: "es2022",
    alias: { "@pvwire/client": "./src/index.ts" },
    external: ["ws"],
    logLevel: "silent",
  });
  return r.outputFiles[0]!.text;
}

const blocks = readmeBlocks();

describe("README.md code blocks", () => {
  let stack: Stack;
  // Inside the package, so that `ws` resolves from its node_modules (see .gitignore).
  const work = join(HERE, ".readme-run");

  beforeAll(async () => {
    rmSync(work, { recursive: true, force: true });
    mkdirSync(work, { recursive: true });
    stack = await startStack();
  });
  afterAll(async () => {
    await stack?.stop();
    rmSync(work, { recursive: true, force: true });
  });

  it("has only blocks this test knows how to run", () => {
    expect(blocks.length).toBeGreaterThanOrEqual(3);
    for (const b of blocks) expect(["ts", "ts browser"], `block ${b.n} (README.md line ${b.line})`).toContain(b.lang);
  });

  it("type-checks every block with the library's strict settings", async () => {
    const dir = join(work, "check");
    mkdirSync(dir, { recursive: true });
    for (const b of blocks) writeFileSync(join(dir, `block${b.n}.ts`), `${b.code}\nexport {};\n`);
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({
      extends: "../../tsconfig.base.json",
      compilerOptions: { noEmit: true, types: ["node"], paths: { "@pvwire/client": ["../../src/index.ts"] } },
      include: ["*.ts"],
    }));
    const r = await run(process.execPath, [join(HERE, "node_modules/typescript/bin/tsc"), "-p", dir], HERE, 120_000);
    expect(r.out + r.err).toBe("");
    expect(r.code).toBe(0);
  }, 150_000);

  for (const b of blocks.filter((x) => x.lang === "ts")) {
    it(`runs block ${b.n} (README.md line ${b.line}) in Node`, async () => {
      expect(b.code).toContain(README_URL);
      const file = join(work, `block${b.n}.mjs`);
      writeFileSync(file, (await bundle(b.code, "node")).replaceAll(README_URL, stack.url));
      const r = await run(process.execPath, [file], work, RUN_MS);
      expect(r.err).toBe("");
      expect(r.code).toBe(0);
      // Each example prints what it read from the demo IOC.
      expect(r.out).toMatch(/PVWIRE:DEMO:/);
    }, RUN_MS + 30_000);
  }

  const browserBlocks = blocks.filter((x) => x.lang === "ts browser");
  it("runs the browser blocks in Chromium at the server's origin", async () => {
    expect(browserBlocks.length).toBeGreaterThanOrEqual(1);
    const browser: Browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    try {
      for (const b of browserBlocks) {
        const page = await browser.newPage();
        const errors: string[] = [];
        page.on("pageerror", (e) => errors.push(e.message));
        await page.goto(`${stack.url}/healthz`);
        await page.addScriptTag({ content: await bundle(b.code, "browser") });
        // The example shows the channel's live value in the page.
        await page.locator("output", { hasText: /PVWIRE:DEMO:SINE -?\d/ }).waitFor({ timeout: 20_000 });
        expect(errors).toEqual([]);
        await page.close();
      }
    } finally {
      await browser.close();
    }
  });
});
