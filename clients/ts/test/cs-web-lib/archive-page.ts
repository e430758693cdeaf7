// One cs-web-lib (npm 0.9.14, unchanged) Data Browser, its plt as cs-web-lib's .plt parser builds
// one: a trace per PV of `?pvs=` (comma-separated), each with its archive at pvwire's Archiver
// Appliance API, `?archive=URL` (`https://HOST/retrieval`), and its live values over pvws from
// `?pvws=HOST:PORT` (wss with `?ssl=1`). cs-web-lib's useArchivedData fetches the archive once,
// then its strip chart adds the live values. Built and served by test/cs-web-lib-archive.test.ts.
//
// Built here rather than parsed from a .plt: 0.9.14's .plt parser rewrites every archive URL to
// `http://` (docs/ARCHIVER.md), which a page served over https may not fetch.
import { AbsolutePosition, Color, DataBrowser, Font, PV, store } from "@diamondlightsource/cs-web-lib";
import { createElement as h, type ComponentType } from "react";
import { createRoot } from "react-dom/client";
import { Provider } from "react-redux";

const params = new URLSearchParams(location.search);
const pvs = (params.get("pvs") ?? "").split(",").filter((pv) => pv !== "");
const csStore = store({ PVWS_SOCKET: params.get("pvws") ?? location.host, PVWS_SSL: params.get("ssl") === "1", THROTTLE_PERIOD: 100 });

// The .plt this stands for: <databrowser><update_period>1</update_period><start>-1 minutes</start>
// <end>now</end><pvlist><pv><name>PV</name><point_type>CIRCLES</point_type>
// <archive><name>pvwire</name><url>ARCHIVE</url></archive></pv></pvlist></databrowser>
// (cs-web-lib's Trace, Axis and Plt classes are not exported: objects of their fields.)
const archive = { name: "pvwire", url: params.get("archive") ?? "" };
const traces = pvs.map((pv) => ({
  yPv: pv, name: pv, axis: 0, lineWidth: 2, lineStyle: 0, traceType: 2, color: Color.fromRgba(0, 0, 255), pointType: 2, pointSize: 1, visible: true, archive,
}));
const axis = {
  xAxis: false, color: Color.fromRgba(0, 0, 0), title: "counts", showGrid: true, visible: true, logScale: false, autoscale: true, minimum: 0, maximum: 100,
  titleFont: new Font(14), scaleFont: new Font(12), onRight: false,
};
const plt = {
  title: "pvwire history, then live", pvlist: traces, axes: [axis], backgroundColor: Color.WHITE, foregroundColor: Color.BLACK, scroll: true, scrollStep: 5,
  updatePeriod: 1, bufferSize: 5000, showGrid: true, start: "-1 minutes", end: "now", titleFont: new Font(), scaleFont: new Font(), labelFont: new Font(), legendFont: new Font(),
};

const Widget = DataBrowser as ComponentType<Record<string, unknown>>;
createRoot(document.getElementById("root")!).render(h(Provider, { store: csStore },
  h("div", { "data-widget": "DataBrowser", style: { position: "relative", width: 900, height: 400 } },
    pvs.length ? h(Widget, { plt, pvMetadataList: pvs.map((pv) => ({ pvName: PV.parse(pv) })), position: new AbsolutePosition("0px", "0px", "900px", "400px") }) : null)));
