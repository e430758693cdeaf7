// The pages of test/cs-web-lib/ (page.ts unless told), built and served from their own origin (as a
// site serves its screens, over http or https), and a headless Chromium to open them: shared by the
// cs-web-lib tests.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer, Server as HttpsServer } from "node:https";
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
async function serve(dir: string, secure: boolean): Promise<Server | HttpsServer> {
  const types: Record<string, string> = { html: "text/html", js: "text/javascript" };
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    const name = (req.url ?? "/").split("?")[0] === "/page.js" ? "page.js" : "index.html";
    res.writeHead(200, { "content-type": types[name.split(".")[1]!]! });
    res.end(readFileSync(join(dir, name)));
  };
  const server = secure ? createHttpsServer(handler) : createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

export interface PageServer {
  /** `http://127.0.0.1:PORT`, or `https://` for a secure one. */
  origin: string;
  /** A secure server's certificate chain and key (PEM files): it answers only once they are set,
   * so its origin can be given to the server that issues them before it starts. */
  useCertificate(cert: string, key: string): void;
  close(): Promise<void>;
}

/** Build the page of `entry` (a module in this folder) and serve it from an origin of its own. */
export async function servePage(entry = "page.ts", secure = false): Promise<PageServer> {
  const dir = mkdtempSync(join(tmpdir(), "pvwire-cs-web-lib-"));
  let web: Server | HttpsServer | undefined;
  const close = async () => {
    await new Promise((r) => web ? web.close(r) : r(undefined));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await buildPage(dir, entry);
    const server = await serve(dir, secure);
    web = server;
    return {
      origin: `${secure ? "https" : "http"}://127.0.0.1:${(server.address() as AddressInfo).port}`,
      useCertificate(cert, key) {
        if (!(server instanceof HttpsServer)) throw new Error("the page is served over http");
        server.setSecureContext({ cert: readFileSync(cert), key: readFileSync(key) });
      },
      close,
    };
  } catch (e) {
    await close();
    throw e;
  }
}

export interface Browser {
  page: Page;
  /** Uncaught errors of the page. */
  errors: string[];
  close(): Promise<void>;
}

/** A headless Chromium trusting the certificate whose key hashes to `spki`
 * (`--ignore-certificate-errors-spki-list`), if given. */
export async function openBrowser(width: number, spki?: string): Promise<Browser> {
  const profile = mkdtempSync(join(tmpdir(), "pvwire-chromium-"));
  let browser: BrowserContext | undefined;
  const close = async () => {
    await browser?.close();
    rmSync(profile, { recursive: true, force: true });
  };
  try {
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
    return { page, errors, close };
  } catch (e) {
    await close();
    throw e;
  }
}

export interface CsWebLibPage extends Browser {
  /** The text of one cell of the row of `pv` (name, connected, readonly, value, units, alarm, time). */
  text(pv: string, cell: string): Promise<string | null>;
}

/** Build the page, serve it, open it in Chromium showing `pvs` from the pvws server at `pvwsUrl`.
 * `entry` is the page's module in this folder: page.ts (a table of PVs) unless told. An
 * `https://` server is reached over wss (cs-web-lib's PVWS_SSL), its certificate trusted by
 * Chromium through `spki` (the hash of its key: `--ignore-certificate-errors-spki-list`). */
export async function openCsWebLibPage(pvwsUrl: string, pvs: readonly string[], width = 1300, entry = "page.ts", spki?: string): Promise<CsWebLibPage> {
  let web: PageServer | undefined;
  let browser: Browser | undefined;
  const close = async () => {
    await browser?.close();
    await web?.close();
  };
  try {
    web = await servePage(entry);
    browser = await openBrowser(width, spki);
    const { page, errors } = browser;
    const server = new URL(pvwsUrl);
    const ssl = server.protocol === "https:" ? "&ssl=1" : "";
    await page.goto(`${web.origin}/?pvws=${server.host}${ssl}&pvs=${encodeURIComponent(pvs.join(","))}`);
    const text = (pv: string, cell: string) => page.locator(`tr[data-pv="${pv}"] [data-testid="${cell}"]`).textContent();
    return { page, errors, text, close };
  } catch (e) {
    await close();
    throw e;
  }
}
