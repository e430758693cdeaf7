// Every cs-web-lib widget kind that shows a PV (npm 0.9.14, unchanged) on one screen in headless
// Chromium, bound through pvwire's /pvws/pv to the IOC of tests/dbs/alltypes.db: each widget must
// show its PV's value (its text, colour, fill, needle, selected choice, plotted points), and a
// write of each type made by clicking and typing into cs-web-lib's own widgets must reach the IOC
// (read back with GraphQL `channel`). The widgets left off and why: test/cs-web-lib/widgets-page.ts
// and docs/PVWS.md. Saves test-artifacts/cs-web-lib-widgets.png.
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { type Locator, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CHROMIUM, openCsWebLibPage, type CsWebLibPage } from "./cs-web-lib/harness.js";
import { stackUnavailable, startStack, type Stack } from "./stack.js";

const ARTIFACTS = join(import.meta.dirname, "../../../test-artifacts");
const skip = stackUnavailable() ?? (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (make chromium)`);
// make test installs every prerequisite: a missing one is a failure, never a skip.
if (skip) throw new Error(`cs-web-lib tests cannot run: ${skip}`);

const ON = "rgb(0, 255, 0)"; // LED and ByteMonitor defaults
const LED_OFF = "rgb(60, 100, 60)";
const BIT_OFF = "rgb(0, 100, 0)";

describe("every cs-web-lib widget that takes a PV, through pvwire", () => {
  let stack: Stack;
  let shown: CsWebLibPage;
  let page: Page;
  const widget = (name: string): Locator => page.locator(`[data-widget="${name}"]`);
  const background = (l: Locator): Promise<string> => l.evaluate((e) => getComputedStyle(e).backgroundColor);
  /** The IOC's value now, read over GraphQL (not through the page). */
  const ioc = async (id: string): Promise<unknown> => {
    const res = await fetch(`${stack.url}/graphql`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ query: `query($id: String!) { channel(id: $id) { value } }`, variables: { id } }),
    });
    const body = (await res.json()) as { data?: { channel: { value: unknown } }; errors?: unknown };
    if (!body.data) throw new Error(`channel(${id}): ${JSON.stringify(body.errors)}`);
    return body.data.channel.value;
  };
  const needle = async () => Number(/^M ([\d.]+) /.exec((await widget("LinearMeter").locator('path[d^="M "]').getAttribute("d")) ?? "")?.[1]);
  /** The height of the thermometer's column of mercury. */
  const mercury = async () => Number(await widget("Thermometer").locator("rect").getAttribute("height"));
  let thermometer = 0;
  const waitIoc = (id: string, want: unknown) => expect.poll(() => ioc(id), { timeout: 15_000, interval: 200 }).toEqual(want);

  beforeAll(async () => {
    // The IOC's records are setpoints of this screen: a site grants that with write rules.
    stack = await startStack(["--write-rule", "ca://AT:*", "--write-rule", "pva://AT:*"], { PVWIRE_STACK_DB: join(import.meta.dirname, "../../../tests/dbs/alltypes.db") });
    shown = await openCsWebLibPage(stack.url, [], 1300, "widgets-page.ts");
    page = shown.page;
  });
  afterAll(async () => {
    await shown?.close();
    await stack?.stop();
  });

  it("each widget shows its PV's value", async () => {
    const timeout = 20_000;
    // Text widgets: the value formatted with the PV's precision and units, a string, an enum label.
    await expect.poll(() => widget("Readback").locator("textarea").first().inputValue(), { timeout }).toBe("1.25 V");
    await expect.poll(() => widget("Readback-string").locator("textarea").first().inputValue(), { timeout }).toBe("in text");
    await expect.poll(() => widget("Readback-enum").locator("textarea").first().inputValue(), { timeout }).toBe("fifteen");
    await expect.poll(() => widget("Input-double").locator("input").inputValue(), { timeout }).toBe("2.500");
    await expect.poll(() => widget("Input-string").locator("input").inputValue(), { timeout }).toBe("out text");
    // cs-web-lib formats every number with 3 decimals when the widget has no precision set.
    await expect.poll(() => widget("Input-long").locator("input").inputValue(), { timeout }).toBe("2147483647.000");
    // Binary: the LED of a 1 is lit, of a 0 dark; the button labelled from the PV's own states.
    await expect.poll(() => background(widget("LED-on").locator("div div div")), { timeout }).toBe(ON);
    await expect.poll(() => background(widget("LED-off").locator("div div div")), { timeout }).toBe(LED_OFF);
    await expect.poll(() => widget("BoolButton").locator("button").textContent(), { timeout }).toBe("Low");
    // A sim PV flipping every 0.5 s: the LED is seen lit and dark.
    for (const colour of [ON, LED_OFF, ON]) {
      await expect.poll(() => background(widget("LED-sim").locator("div div div")), { timeout, interval: 50 }).toBe(colour);
    }
    await expect.poll(() => widget("Readback-loc").locator("textarea").first().inputValue(), { timeout }).toBe("42");
    await expect.poll(() => widget("Checkbox").locator("input").isChecked(), { timeout }).toBe(true);
    // Enum: every label of the 16-state mbbo, the PV's state pressed; the menu shows its label.
    await expect.poll(() => widget("ChoiceButton").locator('button[aria-pressed="true"]').textContent(), { timeout }).toBe("fifteen");
    expect(await widget("ChoiceButton").locator("button").count()).toBe(16);
    await expect.poll(() => widget("MenuButton").locator('[role="combobox"]').textContent(), { timeout }).toBe("fifteen");
    // mbboDirect 165 = 0b10100101, bit 0 first.
    const bits = async () => Promise.all((await widget("ByteMonitor").locator("div div div div").all()).map((b) => background(b)));
    await expect.poll(bits, { timeout }).toEqual([ON, BIT_OFF, ON, BIT_OFF, BIT_OFF, ON, BIT_OFF, ON]);
    // 2.5 on a 0..10 scale: a quarter full, wherever the widget draws it.
    await expect.poll(() => widget("ProgressBar").locator('[role="progressbar"] span').getAttribute("style"), { timeout }).toContain("translateX(-75%)");
    expect(await widget("ProgressBar").textContent()).toContain("2.5");
    // The tank's fill is a quarter of its 100 px height (25 of fill, 75 empty).
    await expect.poll(() => widget("Tank").locator('rect[fill="rgba(0,0,255,1)"]').getAttribute("height"), { timeout }).toBe("25");
    await widget("Meter").getByText("2.50", { exact: true }).waitFor({ timeout });
    // The linear meter's needle on its 198 px scale from x = 21: 2.5 is at 21 + 49.5.
    await expect.poll(() => needle(), { timeout }).toBeCloseTo(70.5, 6);
    thermometer = await mercury();
    expect(thermometer).toBeGreaterThan(0);
    await expect.poll(() => widget("SlideControl").locator('input[type="range"]').inputValue(), { timeout }).toBe("2.5");
    // Symbol: the picture of index 1 (AT:BI is 1).
    await expect.poll(() => widget("Symbol").locator("img").getAttribute("src"), { timeout }).toContain("mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==");
    // Charts: the strip chart plots the live counter, the XY plot the waveform's 3 points.
    await widget("StripChart").getByText("No data to display").waitFor({ state: "detached", timeout });
    // Plotly draws one marker per element on cs-web-lib's default 0..100 y axis, 190 px high.
    const plotted = async () => (await widget("XYPlot").locator(".scatterlayer .trace .point").evaluateAll((points) =>
      points.map((p) => Number(/translate\([^,]+,([^)]+)\)/.exec(p.getAttribute("transform") ?? "")?.[1])))).map((y) => Math.round((190 - y) / 1.9));
    await expect.poll(plotted, { timeout }).toEqual([-32768, 0, 32767]);
    expect(shown.errors).toEqual([]);
  });

  it("writes each type through cs-web-lib's own widgets, and the IOC has it", async () => {
    const timeout = 15_000;
    // Input sends what was typed as text (its write is a DType stringValue): the server converts
    // it to the record's type, a double, a string and a long.
    const type = async (name: string, text: string) => {
      const input = widget(name).locator("input");
      await input.fill(text);
      await input.press("Enter");
    };
    await type("Input-double", "4.25");
    await waitIoc("ca://AT:AO", 4.25);
    await expect.poll(() => widget("ProgressBar").textContent(), { timeout }).toContain("4.25");
    await expect.poll(() => needle(), { timeout }).toBeCloseTo(21 + 0.425 * 198, 6);
    await expect.poll(() => mercury(), { timeout }).toBeGreaterThan(thermometer);
    await type("Input-string", "written by cs-web-lib");
    await waitIoc("ca://AT:STRINGOUT", "written by cs-web-lib");
    await type("Input-long", "-42");
    await waitIoc("ca://AT:LONGOUT", -42);
    // Enum: a choice button, then the menu; each shows the other's write.
    await widget("ChoiceButton").getByRole("button", { name: "three", exact: true }).click();
    await waitIoc("ca://AT:MBBO:16", 3);
    await expect.poll(() => widget("MenuButton").locator('[role="combobox"]').textContent(), { timeout }).toBe("three");
    await widget("MenuButton").locator('[role="combobox"]').click();
    await page.getByRole("option", { name: "seven", exact: true }).click();
    await waitIoc("ca://AT:MBBO:16", 7);
    await expect.poll(() => widget("ChoiceButton").locator('button[aria-pressed="true"]').textContent(), { timeout }).toBe("seven");
    await expect.poll(() => widget("Readback-enum").locator("textarea").first().inputValue(), { timeout }).toBe("seven");
    // Binary: the bool button turns AT:BO on (its LED on another widget lights), the checkbox
    // turns AT:BI off (its LED goes dark).
    await widget("BoolButton").locator("button").click();
    await waitIoc("ca://AT:BO", 1);
    await expect.poll(() => widget("BoolButton").locator("button").textContent(), { timeout }).toBe("High");
    await expect.poll(() => background(widget("LED-off").locator("div div div")), { timeout }).toBe(ON);
    await widget("Checkbox").locator("input").click();
    await waitIoc("ca://AT:BI", 0);
    await expect.poll(() => background(widget("LED-on").locator("div div div")), { timeout }).toBe(LED_OFF);
    // An action button's WRITE_PV action.
    await widget("ActionButton").locator("button").click();
    await waitIoc("ca://AT:SEQ", 7);
    expect(shown.errors).toEqual([]);
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "cs-web-lib-widgets.png"), fullPage: true });
  });
});
