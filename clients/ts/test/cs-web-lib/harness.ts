// The page of test/cs-web-lib/page.ts, built and served from its own origin (as a site serves its
// screens), and a headless Chromium to open it: shared by the cs-web-lib tests.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { build } from "esbuild";
import { chromium, type BrowserContext, type Page } from "playwright-core";

export const CHROMIUM = process.env.PVWIRE_CHROMIUM ?? "/usr/bin/chromium";

/** Bundle the page for the browser. cs-web-lib reads its settings from `process.env` and
 * `import.meta.env` when the config passed to it lacks them: give it empty ones. One of its
 * bundled modules requires node's `buffer`: the `buffer` package stands in for it in the
 * browser. */
async function buildPage(dir: string, entry: string): Promise<void> {
  await build({
    entryPoints: [join(import.meta.dirname, entry)],
    bundle: true,
    format: "esm",
    target: "es2022",
    outfile: join(dir, "page.js"),
    logLevel: "warning",
    define: { "process.env.NODE_ENV": '"production"', "process.env": "{}", "import.meta.env": "{}" },
  });
  writeFileSync(join(dir, "index.html"), '<!doctype html><html><head><meta charset="utf-8"><title>cs-web-lib on pvwire</title>'
    + "<style>body{font:14px system-ui,sans-serif;margin:1em}td,th{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd}</style></head>"
    + '<body><h1>cs-web-lib (npm) through pvwire /pvws/pv</h1><div id="root"></div><script type="module" src="page.js"></script></body></html>');
}

/** A plain static file server on its own port: the page's origin is not the pvwire server's. */
async function serve(dir: string): Promise<Server> {
  const types: Record<string, string> = { html: "text/html", js: "text/javascript" };
  const server = createServer((req, res) => {
    const name = (req.url ?? "/").split("?")[0] === "/page.js" ? "page.js" : "index.html";
    res.writeHead(200, { "content-type": types[name.split(".")[1]!]! });
    res.end(readFileSync(join(dir, name)));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

export interface CsWebLibPage {
  page: Page;
  /** Uncaught errors of the page. */
  errors: string[];
  /** The text of one cell of the row of `pv` (name, connected, readonly, value, units, alarm, time). */
  text(pv: string, cell: string): Promise<string | null>;
  close(): Promise<void>;
}

/** Build the page, serve it, open it in Chromium showing `pvs` from the pvws server at `pvwsUrl`.
 * `entry` is the page's module in this folder: page.ts (a table of PVs) unless told. An
 * `https://` server is reached over wss (cs-web-lib's PVWS_SSL), its certificate trusted by
 * Chromium through `spki` (the hash of its key: `--ignore-certificate-errors-spki-list`). */
export async function openCsWebLibPage(pvwsUrl: string, pvs: readonly string[], width = 1300, entry = "page.ts", spki?: string): Promise<CsWebLibPage> {
  const dir = mkdtempSync(join(tmpdir(), "pvwire-cs-web-lib-"));
  const profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
  let web: Server | undefined;
  let browser: BrowserContext | undefined;
  const close = async () => {
    await browser?.close();
    rmSync(profile, { recursive: true, force: true });
    await new Promise((r) => web ? web.close(r) : r(undefined));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await buildPage(dir, entry);
    web = await serve(dir);
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width, height: 500 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
        ...(spki ? [`--ignore-certificate-errors-spki-list=${spki}`] : [])],
    });
    const page = browser.pages()[0] ?? (await browser.newPage());
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(e.message));
    const server = new URL(pvwsUrl);
    const ssl = server.protocol === "https:" ? "&ssl=1" : "";
    await page.goto(`http://127.0.0.1:${(web.address() as AddressInfo).port}/?pvws=${server.host}${ssl}&pvs=${encodeURIComponent(pvs.join(","))}`);
    const text = (pv: string, cell: string) => page.locator(`tr[data-pv="${pv}"] [data-testid="${cell}"]`).textContent();
    return { page, errors, text, close };
  } catch (e) {
    await close();
    throw e;
  }
}
