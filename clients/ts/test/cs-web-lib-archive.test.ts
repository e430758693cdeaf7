// cs-web-lib's archived data (npm 0.9.14, unchanged) on pvwire: its Data Browser in headless
// Chromium, a trace of a real IOC's counter with its archive at pvwire's Archiver Appliance API
// (`https://HOST/retrieval`), plots pvwire's history of the counter (useArchivedData's
// getDataForPVs.json with `mean_1`), then continues with the live values over /pvws/pv. All over
// pvwire's own TLS (https and wss, a test CA), the page served over https from an origin of its
// own that pvwire lists in `cors_origins` and `allowed_origins`, as a site deploys its screens.
// Asserted on what cs-web-lib holds and draws: the dataset it gives its chart and the chart's marks.
// Saves test-artifacts/cs-web-lib-archive.png.
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { request } from "node:https";
import { join } from "node:path";
import { type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CHROMIUM, openBrowser, servePage, type Browser, type PageServer } from "./cs-web-lib/harness.js";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const ARTIFACTS = join(import.meta.dirname, "../../../test-artifacts");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`);
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`cs-web-lib archive tests cannot run: ${skip}`);

// The demo IOC's counter (10 Hz, whole numbers), as a .plt names a PV: no scheme (CA).
const PV = "PVWIRE:DEMO:COUNTER";
const KEY = `ca://${PV}`; // cs-web-lib's name for it, in its chart's dataset
// Seconds of history pvwire holds before the page opens.
const HISTORY_S = 8;

interface Sample { secs: number; val: number }
interface ArchiveAnswer { meta: { name: string }; data: Sample[] }
interface Point { t: number; v: number }
/** What cs-web-lib's chart holds and draws: its dataset's points, its marks (one per point), its
 * y axis ticks (value, pixel) and its x axis (time range, pixel range). */
interface Held {
  points: Point[];
  marks: { cx: number; cy: number }[];
  yTicks: { v: number; y: number }[];
  x: { min: number; max: number; left: number; right: number };
}

/** What the Data Browser's chart holds now: the `dataset` cs-web-lib gives MUI's LineChart (read
 * from React's props of the chart's svg), and what that chart drew, read in one go. */
function held(page: Page, key: string): Promise<Held> {
  return page.evaluate((key) => {
    const svg = document.querySelector('[data-widget="DataBrowser"] svg:has(.MuiChartsAxis-root)');
    if (!svg) return { points: [], marks: [], yTicks: [], x: { min: 0, max: 0, left: 0, right: 0 } };
    type Fiber = { memoizedProps?: { dataset?: Record<string, unknown>[]; xAxis?: { min: Date; max: Date }[] }; return?: Fiber };
    const fiberKey = Object.keys(svg).find((k) => k.startsWith("__reactFiber$"))!;
    let fiber = (svg as unknown as Record<string, Fiber>)[fiberKey];
    while (fiber && !fiber.memoizedProps?.dataset) fiber = fiber.return!;
    const { dataset, xAxis } = fiber!.memoizedProps!;
    const number = (e: Element, name: string) => Number(e.getAttribute(name));
    const translate = (e: Element) => /translate\(([^,]+), ([^)]+)\)/.exec(e.getAttribute("transform") ?? "")!.slice(1).map(Number);
    const xLine = svg.querySelector(".MuiChartsAxis-directionX .MuiChartsAxis-line")!;
    return {
      points: dataset!.map((p) => ({ t: (p.dateTime as Date).getTime(), v: p[key] as number })),
      marks: [...svg.querySelectorAll("circle.MuiMarkElement-root")].map((c) => ({ cx: number(c, "cx"), cy: number(c, "cy") })),
      yTicks: [...svg.querySelectorAll(".MuiChartsAxis-directionY .MuiChartsAxis-tickContainer")].filter((g) => g.textContent)
        .map((g) => ({ v: Number(g.textContent), y: translate(g)[1]! })),
      x: { min: xAxis![0]!.min.getTime(), max: xAxis![0]!.max.getTime(), left: number(xLine, "x1"), right: number(xLine, "x2") },
    };
  }, key);
}

/** useArchivedData's request, once the page makes it. */
const archiveRequest = (page: Page) => page.waitForRequest((r) => r.url().includes("/data/getDataForPVs.json"), { timeout: 30_000 });

describe("cs-web-lib's Data Browser plots pvwire's history, then continues live", () => {
  let web: PageServer;
  let stack: Stack;
  let browser: Browser;

  /** GET from pvwire over https, trusting the test CA (no Origin: not a browser). */
  const get = (path: string) => new Promise<unknown>((resolve, reject) => {
    request(`${stack.url}${path}`, { ca: readFileSync(stack.ca!) }, (res) => {
      let body = "";
      res.on("data", (d: Buffer) => { body += d.toString(); });
      res.on("end", () => res.statusCode === 200 ? resolve(JSON.parse(body)) : reject(new Error(`${res.statusCode}: ${body}`)));
    }).on("error", reject).end();
  });
  const screen = (origin: string) => {
    const host = new URL(stack.url).host;
    return `${origin}/?pvws=${host}&ssl=1&archive=${encodeURIComponent(`${stack.url}/retrieval`)}&pvs=${PV}`;
  };

  beforeAll(async () => {
    // The page's origin is pvwire's to allow, so it is served first; over https once the
    // certificate of the server's test CA exists.
    web = await servePage("archive-page.ts", true);
    stack = await startStack(["--tls", "--history-channels", KEY], { PVWIRE_CORS_ORIGINS: web.origin, PVWIRE_ALLOWED_ORIGINS: web.origin });
    web.useCertificate(stack.cert!, stack.key!);
    browser = await openBrowser(1000, stack.spki);
  });
  afterAll(async () => {
    await browser?.close();
    await stack?.stop();
    await web?.close();
  });

  it("plots the archive's points, then the live ones, over https and wss from another origin", async () => {
    // pvwire records the counter from its start: wait until it holds HISTORY_S seconds of it.
    const bins = async () => {
      const now = Date.now();
      const doc = await get(`/retrieval/data/getDataForPVs.json?pv=mean_1(${PV})&from=${new Date(now - 60_000).toISOString()}&to=${new Date(now).toISOString()}`);
      return (doc as ArchiveAnswer[])[0]!.data.length;
    };
    await expect.poll(bins, { timeout: 60_000, interval: 500 }).toBeGreaterThanOrEqual(HISTORY_S);
    const { page, errors } = browser;
    const sockets: string[] = [];
    page.on("websocket", (ws) => sockets.push(ws.url()));
    const asked = archiveRequest(page);
    const opened = Date.now();
    await page.goto(screen(web.origin));

    // What cs-web-lib asked, and what pvwire answered it, across origins (CORS).
    const request = await asked;
    const response = await request.response();
    expect(response, `the archive request failed: ${request.failure()?.errorText}`).not.toBeNull();
    const url = new URL(request.url());
    expect(`${url.origin}${url.pathname}`).toBe(`${stack.url}/retrieval/data/getDataForPVs.json`);
    expect(url.searchParams.getAll("pv")).toEqual([`mean_1(${PV})`]);
    expect(Date.parse(url.searchParams.get("to")!) - Date.parse(url.searchParams.get("from")!)).toBe(60_000);
    expect(response!.status()).toBe(200);
    expect(response!.headers()["access-control-allow-origin"]).toBe(web.origin);
    const [answer] = (await response!.json()) as ArchiveAnswer[];
    expect(answer!.meta.name).toBe(PV);
    const archived = answer!.data.map((s) => ({ t: s.secs * 1000, v: s.val }));
    expect(archived.length).toBeGreaterThanOrEqual(HISTORY_S);

    // cs-web-lib's chart: the archive's points first, then the live ones it adds from pvws;
    // waited for until the live part reaches two seconds past the archive's end.
    const split = (h: Held) => {
      let n = 0;
      while (n < h.points.length && archived.some((a) => a.t === h.points[n]!.t && a.v === h.points[n]!.v)) n++;
      return { past: h.points.slice(0, n), live: h.points.slice(n) };
    };
    const onward = async () => {
      const { past, live } = split(await held(page, KEY));
      return past.length > 0 && live.length >= 10 && live.at(-1)!.t >= past.at(-1)!.t + 2000;
    };
    await expect.poll(onward, { timeout: 30_000, interval: 200 }).toBe(true);
    const shown = await held(page, KEY);
    const { past, live } = split(shown);

    // The past: pvwire's bins of the counter from before the page opened, from the first one to
    // the end of the answer (cs-web-lib keeps a bin only past `update_period` after the one
    // before, and drops the nanoseconds), its means rising as the counter does.
    expect(past[0]).toEqual(archived[0]);
    expect(past[0]!.t).toBeLessThan(opened - (HISTORY_S - 2) * 1000);
    expect(past.length).toBeGreaterThanOrEqual(HISTORY_S / 2);
    expect(archived.at(-1)!.t - past.at(-1)!.t).toBeLessThanOrEqual(1000);
    for (let i = 1; i < past.length; i++) expect(past[i]!.v).toBeGreaterThanOrEqual(past[i - 1]!.v);
    expect(past.at(-1)!.v).toBeGreaterThan(past[0]!.v);

    // Then live, over wss: each point one of the IOC's updates as pvwire recorded it (its raw
    // history: the same second, the same value), in the order the counter made them.
    expect(sockets.length).toBeGreaterThan(0);
    expect(sockets.every((s) => s === `wss://${new URL(stack.url).host}/pvws/pv`)).toBe(true);
    const from = new Date(past[0]!.t).toISOString();
    const [raw] = (await get(`/retrieval/data/getData.json?pv=${PV}&from=${from}&to=${new Date().toISOString()}`)) as ArchiveAnswer[];
    const updates = new Set(raw!.data.map((s) => `${s.secs * 1000} ${s.val}`));
    expect(live.filter((p) => !updates.has(`${p.t} ${p.v}`))).toEqual([]);
    for (let i = 1; i < live.length; i++) {
      expect(live[i]!.v).toBeGreaterThanOrEqual(live[i - 1]!.v);
      expect(live[i]!.t).toBeGreaterThanOrEqual(live[i - 1]!.t);
    }
    expect(live.at(-1)!.v).toBeGreaterThan(live[0]!.v);

    // What is drawn: a mark per point held, where the chart's own axes put that point's time
    // and value (the y scale from its tick labels, the x scale from its range and axis line).
    expect(shown.marks.length).toBe(shown.points.length);
    expect(shown.yTicks.length).toBeGreaterThanOrEqual(2);
    const [lo, hi] = [shown.yTicks[0]!, shown.yTicks.at(-1)!];
    const y = (v: number) => lo.y + (v - lo.v) * (hi.y - lo.y) / (hi.v - lo.v);
    const x = (t: number) => shown.x.left + (t - shown.x.min) * (shown.x.right - shown.x.left) / (shown.x.max - shown.x.min);
    shown.points.forEach((p, i) => {
      expect(shown.marks[i]!.cy).toBeCloseTo(y(p.v), 1);
      expect(shown.marks[i]!.cx).toBeCloseTo(x(p.t), 1);
    });
    expect(errors).toEqual([]);
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "cs-web-lib-archive.png") });
  });

  it("the same screen from an origin pvwire does not list gets neither the archive nor the stream", async () => {
    // localhost is the same page server under another name: another origin.
    const other = web.origin.replace("127.0.0.1", "localhost");
    const page = await browser.page.context().newPage();
    try {
      const asked = archiveRequest(page);
      let frames = 0;
      let closed = false;
      page.on("websocket", (ws) => {
        ws.on("framereceived", () => { frames++; });
        ws.on("close", () => { closed = true; });
      });
      await page.goto(screen(other));
      const request = await asked;
      expect(await request.response()).toBeNull(); // CORS: the page is not let read an answer
      expect(request.failure()?.errorText).toBe("net::ERR_FAILED");
      await expect.poll(() => closed, { timeout: 30_000 }).toBe(true);
      expect(frames).toBe(0);
      expect((await held(page, KEY)).points).toEqual([]);
    } finally {
      await page.close();
    }
  });
});
