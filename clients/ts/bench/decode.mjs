// Decode speed of pvwire frames: hand-written decoder (src/msgpack.ts) vs @msgpack/msgpack vs
// msgpackr. Run `npm run build && node bench/decode.mjs`. Numbers go to README.md.
//
// Frames (built with @msgpack/msgpack so that no decoder sees its own encoder's output):
//  - DATA with 1,000 entries [sid, 3, float, serial, s, ns] in one group (a busy tick);
//  - SNAPSHOT-like DATA of 200 full entries with metadata maps (strings, limits);
//  - DATA with one 1,000,000-element float64 ndarray ext (8 MB waveform/image).
import { Encoder, Decoder, ExtensionCodec } from "@msgpack/msgpack";
import { Unpackr } from "msgpackr";
import { decode as pvDecode } from "../dist/msgpack.js";
import { decodeNdArray, encodeNdArray } from "../dist/ndarray.js";

const codec = new ExtensionCodec();
codec.register({ type: 1, encode: () => null, decode: (data) => decodeNdArray(data) });
const enc = new Encoder({ extensionCodec: codec, forceFloat32: false });

function framed(value) {
  return enc.encode(value);
}

const now = 1_700_000_000;
const dataFrame = framed([3, 42, [[1, Array.from({ length: 1000 }, (_, i) => [i, 3, 20 + i * 0.001 + 1e-9, 1000 + i, now, 123_456_789 + i])]]]);
const meta = { type: "float64", count: 1, units: "mm", precision: 3, description: "a channel", display: [0.5, 10.5], control: [0.5, 10.5], alarm: [NaN, 9.5], warning: [1.5, 8.5], writable: true };
const fullFrame = framed([2, 1, 1, Array.from({ length: 200 }, (_, i) => [i, 31, i + 0.5, 1, now, 5, 0, 0, "", meta, 1, ""])]);
const arr = new Float64Array(1_000_000).map((_, i) => Math.sin(i / 1000));
const ext = { type: 1, data: encodeNdArray(arr) };
// ExtData is what @msgpack/msgpack's encoder writes for {type, data}.
const { ExtData } = await import("@msgpack/msgpack");
const arrayFrame = framed([3, 7, [[1, [[0, 3, new ExtData(1, ext.data), 9, now, 1]]]]]);

const mmDecoder = new Decoder({ extensionCodec: codec });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "number" });
Unpackr.prototype; // eslint quiet
import { addExtension } from "msgpackr";
addExtension({ type: 1, unpack: (data) => decodeNdArray(data) });

const decoders = {
  "hand-written (src/msgpack.ts)": (b) => pvDecode(b, (t, d) => decodeNdArray(d)),
  "@msgpack/msgpack 3": (b) => mmDecoder.decode(b),
  "msgpackr 2": (b) => unpackr.unpack(b),
};

function bench(fn, bytes, minMs = 600) {
  for (let i = 0; i < 50; i++) fn(bytes); // warm up
  let n = 0;
  const t0 = performance.now();
  let t = t0;
  while (t - t0 < minMs) {
    for (let i = 0; i < 10; i++) fn(bytes);
    n += 10;
    t = performance.now();
  }
  return ((t - t0) * 1000) / n; // µs per decode
}

// A WebSocket message does not promise alignment: place the frame so that the float64 data is
// (aligned) or is not (misaligned) at a multiple of 8 in its ArrayBuffer.
function placed(bytes, wantAligned) {
  for (let shift = 0; shift < 8; shift++) {
    const b = new Uint8Array(bytes.length + shift);
    b.set(bytes, shift);
    const view = b.subarray(shift);
    const arr = pvDecode(view, (t, d) => decodeNdArray(d))[2][0][1][0][2];
    if ((arr.buffer === b.buffer) === wantAligned) return view;
  }
  throw new Error("no placement found");
}

const rows = [];
for (const [name, fn] of Object.entries(decoders)) {
  const check = fn(arrayFrame)[2][0][1][0][2];
  if (!(check instanceof Float64Array) || check.length !== 1_000_000) throw new Error(`${name}: ndarray not decoded`);
  rows.push({
    decoder: name,
    "DATA 1000 entries (µs)": bench(fn, dataFrame).toFixed(1),
    "SNAPSHOT 200 full (µs)": bench(fn, fullFrame).toFixed(1),
    "1M float64 aligned (µs)": bench(fn, placed(arrayFrame, true)).toFixed(1),
    "1M float64 misaligned (µs)": bench(fn, placed(arrayFrame, false), 1500).toFixed(1),
  });
}
console.log(`node ${process.version}; frame sizes: DATA ${dataFrame.length} B, SNAPSHOT ${fullFrame.length} B, ndarray ${arrayFrame.length} B`);
console.table(rows);
