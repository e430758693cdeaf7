// A page with cs-web-lib's own Image widget (from npm, unchanged) pointed at pvwire's /mjpeg: the
// way a cs-web-lib screen shows a detector image. `?src=URL` is the MJPEG URL; a plain <img> with
// `?img=URL` sits next to it. Built and served by test/mjpeg.test.ts.
import { AbsolutePosition, Image, store } from "@diamondlightsource/cs-web-lib";
import { createElement as h } from "react";
import { createRoot } from "react-dom/client";
import { Provider } from "react-redux";

const params = new URLSearchParams(location.search);
const csStore = store({ PVWS_SOCKET: location.host, PVWS_SSL: false, THROTTLE_PERIOD: 100 });

const widget = h(Image, {
  imageFile: params.get("src") ?? "",
  position: new AbsolutePosition("0px", "0px", "256px", "256px"),
  alt: "cs-web-lib Image widget",
});
createRoot(document.getElementById("widget")!).render(h(Provider, { store: csStore }, widget));
const plain = document.getElementById("plain") as HTMLImageElement;
plain.src = params.get("img") ?? "";
