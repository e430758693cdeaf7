// One screen of every cs-web-lib widget kind (npm 0.9.14, unchanged) that takes a PV, each bound
// to a PV of the IOC of tests/dbs/alltypes.db (or a sim:// / loc:// PV) through pvwire's /pvws/pv,
// as a cs-web-lib display lays them out. Each widget sits in a box `[data-widget=NAME]` the test
// reads. Built and served by test/cs-web-lib-widgets.test.ts; `?pvws=HOST:PORT` names the server.
//
// Not on this screen: DataBrowser (it draws its history from an Archiver Appliance at the
// configured archiver URL before it shows a live point: archive-page.ts shows one) and DynamicImage
// (in the package's sources but not exported by 0.9.14). SimpleSymbol, MenuMux and Line accept a
// PV but show nothing of it (SimpleSymbol's picture is its imageIndex prop, MenuMux sets a macro,
// Line's PV only feeds its rules); DropDown and the containers take none.
import {
  AbsolutePosition, ActionButton, BoolButton, ByteMonitor, Checkbox, ChoiceButton, Color, Font, Input, LED, LinearMeter, MenuButton,
  Meter, PV, ProgressBar, Readback, SlideControl, StripChart, Symbol, Tank, Thermometer, XYPlot, store,
} from "@diamondlightsource/cs-web-lib";
import { createElement as h, type ComponentType, type ReactElement } from "react";
import { createRoot } from "react-dom/client";
import { Provider } from "react-redux";

const params = new URLSearchParams(location.search);
const csStore = store({ PVWS_SOCKET: params.get("pvws") ?? location.host, PVWS_SSL: false, THROTTLE_PERIOD: 100 });

// A one-pixel PNG per state for the Symbol widgets: a screen's symbol files, inline.
const RED = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const GREEN = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/** A trace as cs-web-lib's file parsers build one (its Trace class is not exported): the charts
 * plot the PV whose name ends with `yPv`. */
function trace(yPv: string): Record<string, unknown> {
  return { yPv, name: yPv, axis: 0, lineWidth: 2, lineStyle: 0, traceType: 2, color: Color.fromRgba(0, 0, 255), pointType: 0, pointSize: 1, visible: true };
}

interface Shown { name: string; widget: unknown; pv: string; props?: Record<string, unknown>; width?: number; height?: number }

/** Each widget with its PV; `name` is the box's data-widget. */
export const WIDGETS: Shown[] = [
  { name: "Readback", widget: Readback, pv: "pva://AT:AI", props: { precisionFromPv: true, showUnits: true } },
  { name: "Readback-string", widget: Readback, pv: "ca://AT:STRINGIN" },
  { name: "Readback-enum", widget: Readback, pv: "pva://AT:MBBO:16" },
  { name: "LED-on", widget: LED, pv: "ca://AT:BI", width: 30, height: 30 },
  { name: "LED-off", widget: LED, pv: "pva://AT:BO", width: 30, height: 30 },
  { name: "LED-sim", widget: LED, pv: "sim://flipflop(0.5)", width: 30, height: 30 },
  { name: "Readback-loc", widget: Readback, pv: "loc://pvwire_widgets(42)" },
  { name: "BoolButton", widget: BoolButton, pv: "ca://AT:BO", props: { labelsFromPv: true } },
  { name: "Checkbox", widget: Checkbox, pv: "ca://AT:BI", props: { label: "AT:BI" } },
  { name: "ChoiceButton", widget: ChoiceButton, pv: "ca://AT:MBBO:16", width: 600, height: 40, props: { width: 600, height: 40 } },
  { name: "MenuButton", widget: MenuButton, pv: "pva://AT:MBBO:16" },
  { name: "Input-double", widget: Input, pv: "ca://AT:AO" },
  { name: "Input-string", widget: Input, pv: "pva://AT:STRINGOUT" },
  { name: "Input-long", widget: Input, pv: "ca://AT:LONGOUT" },
  { name: "ByteMonitor", widget: ByteMonitor, pv: "ca://AT:MBBODIRECT", width: 200, height: 25, props: { numBits: 8, width: 200, height: 25 } },
  { name: "ProgressBar", widget: ProgressBar, pv: "ca://AT:AO", props: { min: 0, max: 10, showLabel: true } },
  { name: "Tank", widget: Tank, pv: "ca://AT:AO", height: 120, props: { minimum: 0, maximum: 10 } },
  { name: "Thermometer", widget: Thermometer, pv: "ca://AT:AO", width: 40, height: 160, props: { minimum: 0, maximum: 10, width: 40, height: 160 } },
  { name: "Meter", widget: Meter, pv: "ca://AT:AO", width: 240, height: 120, props: { limitsFromPv: false, minimum: 0, maximum: 10 } },
  { name: "LinearMeter", widget: LinearMeter, pv: "ca://AT:AO", width: 240, height: 60, props: { limitsFromPv: false, minimum: 0, maximum: 10 } },
  { name: "SlideControl", widget: SlideControl, pv: "ca://AT:AO", width: 240, height: 60, props: { minimum: 0, maximum: 10, increment: 0.5 } },
  { name: "Symbol", widget: Symbol, pv: "ca://AT:BI", width: 30, height: 30, props: { symbols: [RED, GREEN] } },
  { name: "ActionButton", widget: ActionButton, pv: "ca://AT:SEQ", props: { text: "write 7", actions: { executeAsOne: false, actions: [{ type: "WRITE_PV", writePvInfo: { pvName: "ca://AT:SEQ", value: 7, description: "write 7" } }] } } },
  { name: "StripChart", widget: StripChart, pv: "ca://AT:COUNTER1", width: 400, height: 200, props: { traces: [trace("AT:COUNTER1")], axes: [] } },
  { name: "XYPlot", widget: XYPlot, pv: "pva://AT:WF:SHORT", width: 400, height: 250, props: { width: 400, height: 250, titleFont: new Font(), traces: [trace("AT:WF:SHORT")] } },
];

function Box({ shown }: { shown: Shown }): ReactElement {
  const width = shown.width ?? 160;
  const height = shown.height ?? 40;
  const Widget = shown.widget as ComponentType<Record<string, unknown>>;
  const widget = h(Widget, {
    pvMetadataList: [{ pvName: PV.parse(shown.pv) }],
    position: new AbsolutePosition("0px", "0px", `${width}px`, `${height}px`),
    ...shown.props,
  });
  return h("figure", { "data-widget": shown.name, style: { margin: 0, padding: 4, border: "1px solid #ccc" } },
    h("figcaption", { style: { font: "12px monospace" } }, `${shown.name} ${shown.pv}`),
    h("div", { style: { position: "relative", width, height } }, widget));
}

createRoot(document.getElementById("root")!).render(h(Provider, { store: csStore },
  h("div", { style: { display: "flex", flexWrap: "wrap", gap: 8, alignItems: "flex-start" } }, ...WIDGETS.map((shown) => h(Box, { shown, key: shown.name })))));
