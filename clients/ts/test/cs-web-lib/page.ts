// A page made only of cs-web-lib (Diamond's web display library, from npm): its redux store with
// its own pvws connection, and its `useConnection` hook, as a cs-web-lib screen gets PVs. Nothing
// of pvwire is on this page: it is pointed at a server by `?pvws=HOST:PORT` and shows `?pvs=...`
// (comma-separated), or `?pvlist=` a JSON array for names that hold commas (`sim://sine(-10, 10, 1)`).
// Built and served by test/cs-web-lib.test.ts.
import { DType, store, useConnection } from "@diamondlightsource/cs-web-lib";
import { createElement as h, useEffect, useRef, useState, type ReactElement } from "react";
import { createRoot } from "react-dom/client";
import { Provider } from "react-redux";

const params = new URLSearchParams(location.search);
const pvs = params.has("pvlist") ? JSON.parse(params.get("pvlist")!) as string[] : (params.get("pvs") ?? "").split(",").filter((pv) => pv !== "");
// `?ssl=1`: the server is reached over wss, as a site's https deployment is.
const csStore = store({ PVWS_SOCKET: params.get("pvws") ?? location.host, PVWS_SSL: params.get("ssl") === "1", THROTTLE_PERIOD: 100 });

function valueText(value: DType | undefined): string {
  if (value === undefined) return "–";
  const array = value.getArrayValue();
  if (array !== undefined) {
    const head = Array.from(array.slice(0, 3) as ArrayLike<number | bigint>, (x) => Number(x).toFixed(2)).join(", ");
    return `[${array.length} values: ${head}, …]`;
  }
  const precision = value.getDisplay()?.precision;
  const number = value.getDoubleValue();
  if (typeof number === "number" && precision !== undefined && value.getDisplay()?.choices === undefined) return number.toFixed(precision);
  return value.getStringValue() ?? "–";
}

/** A write as cs-web-lib's own widgets make one: its `write_pv` action, which its connection
 * middleware sends as a pvws `write` message (numbers as doubleValue, anything else as text). */
function write(pvName: string, text: string): void {
  const number = Number(text);
  const value = text.trim() !== "" && Number.isFinite(number) ? new DType({ doubleValue: number }) : new DType({ stringValue: text });
  csStore.dispatch({ type: "write_pv", payload: { pvName, value } });
}

function WriteBox({ pv }: { pv: string }): ReactElement {
  const [text, setText] = useState("");
  return h("form", { onSubmit: (e: { preventDefault(): void }) => { e.preventDefault(); write(pv, text); } },
    h("input", { "data-testid": "write-input", size: 8, value: text, onChange: (e: { target: { value: string } }) => setText(e.target.value) }),
    h("button", { "data-testid": "write-button", type: "submit" }, "write"));
}

function PvRow({ pv }: { pv: string }): ReactElement {
  const [name, connected, readonly, value] = useConnection(`pvwire-test-${pv}`, pv);
  // How many distinct values this row has rendered: the test waits for it to grow.
  const updates = useRef(0);
  useEffect(() => { if (value !== undefined) updates.current += 1; }, [value]);
  const cell = (testid: string, text: string) => h("td", { "data-testid": testid, key: testid }, text);
  return h("tr", { "data-pv": pv, "data-connected": String(connected), "data-updates": String(updates.current + (value !== undefined ? 1 : 0)) },
    cell("name", name),
    cell("connected", connected ? "connected" : "disconnected"),
    cell("readonly", readonly ? "read-only" : "writable"),
    cell("value", valueText(value)),
    cell("units", value?.getDisplay()?.units ?? ""),
    cell("alarm", value?.getAlarm()?.quality ?? ""),
    cell("time", value?.getTime()?.datetime.toISOString() ?? ""),
    h("td", { key: "write" }, h(WriteBox, { pv })));
}

function App(): ReactElement {
  return h("table", null,
    h("thead", null, h("tr", null, ...["PV", "connection", "access", "value", "units", "alarm", "time", ""].map((t) => h("th", { key: t }, t)))),
    h("tbody", null, ...pvs.map((pv) => h(PvRow, { pv, key: pv }))));
}

createRoot(document.getElementById("root")!).render(h(Provider, { store: csStore }, h(App)));
