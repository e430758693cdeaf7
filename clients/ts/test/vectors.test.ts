// Every golden vector in protocol/vectors/ decoded (server→client) or encoded (client→server) and
// compared with its meaning (protocol/vectors/README.md).
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseExact } from "./exactJson.js";
import { decodeServerMessage, encodeClientMessage, NdArray, ProtocolError, type ClientMessage, type TypedArray, type Entry, type ServerMessage } from "../src/index.js";

export const VECTORS = join(import.meta.dirname, "../../../protocol/vectors");


/** A JSON meaning value → what the client yields. */
function expectedValue(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(expectedValue);
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    if ("$float" in o) return Number(o.$float);
    if ("$ndarray" in o) {
      const nd = o.$ndarray as { dtype: string; dims: number[]; data: (number | bigint)[] };
      const data = nd.dtype.endsWith("int64") ? nd.data.map((x) => BigInt(x)) : nd.data.map(Number);
      const flat = { dtype: nd.dtype, data };
      return nd.dims.length === 1 ? flat : { ...flat, dims: nd.dims };
    }
    return Object.fromEntries(Object.entries(o).map(([k, x]) => [k, expectedValue(x)]));
  }
  return typeof v === "bigint" && v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v;
}

const DTYPE_OF: Record<string, string> = {
  Int8Array: "int8", Uint8Array: "uint8", Int16Array: "int16", Uint16Array: "uint16", Int32Array: "int32",
  Uint32Array: "uint32", BigInt64Array: "int64", BigUint64Array: "uint64", Float32Array: "float32", Float64Array: "float64",
};

/** What the client yielded → comparable plain data. */
function actualValue(v: unknown): unknown {
  if (v instanceof NdArray) return { dtype: v.dtype, data: Array.from(v.data as ArrayLike<number>), dims: [...v.dims] };
  if (ArrayBuffer.isView(v)) return { dtype: DTYPE_OF[v.constructor.name], data: Array.from(v as unknown as ArrayLike<number>) };
  if (Array.isArray(v)) return v.map(actualValue);
  if (v !== null && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, actualValue(x)]));
  return v;
}

/** Every TypedArray in a decoded message, in order. */
function typedArrays(v: unknown): TypedArray[] {
  if (v instanceof NdArray) return [v.data];
  if (ArrayBuffer.isView(v)) return [v as TypedArray];
  if (Array.isArray(v)) return v.flatMap(typedArrays);
  if (v !== null && typeof v === "object") return Object.values(v).flatMap(typedArrays);
  return [];
}

const SNAKE: Record<string, string> = { tickMs: "tick_ms", heartbeatMs: "heartbeat_ms", maxInBytes: "max_in_bytes" };

function asMeaning(m: ServerMessage): unknown {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(m)) out[SNAKE[k] ?? k] = v;
  const entries = (es: Entry[]) => es.map((e) => ({ ...e, ...("value" in e ? { value: actualValue(e.value) } : {}) }));
  if (m.kind === "SNAPSHOT") out.entries = entries(m.entries);
  if (m.kind === "HISTORY") for (const k of ["t", "value", "min", "max", "severity", "status", "gap"] as const) out[k] = actualValue(m[k]);
  if (m.kind === "DATA") out.groups = m.groups.map((g) => ({ att: g.att, entries: entries(g.entries) }));
  return out;
}

const files = readdirSync(VECTORS).filter((f) => f.endsWith(".json")).sort();

interface Meaning {
  name: string;
  direction: "server" | "client";
  /** Absent means "decode" (protocol/vectors/README.md). */
  expect?: "decode" | "accept" | "ignore" | "reject";
  message: Record<string, unknown>;
}

describe("golden vectors", () => {
  it("exist", () => expect(files.length).toBeGreaterThan(20));

  for (const file of files) {
    const meaning = parseExact(readFileSync(join(VECTORS, file), "utf8")) as Meaning;
    const bin = new Uint8Array(readFileSync(join(VECTORS, file.replace(/\.json$/, ".bin"))));
    const expected = meaning.expect ?? "decode";
    if (meaning.direction === "server" && expected === "reject") {
      it(`rejects ${meaning.name}`, () => {
        expect(() => decodeServerMessage(bin)).toThrow(ProtocolError);
      });
    } else if (meaning.direction === "server" && expected === "ignore") {
      it(`ignores ${meaning.name}`, () => {
        expect(decodeServerMessage(bin)).toBeNull();
      });
    } else if (meaning.direction === "server") {
      it(`decodes ${meaning.name}`, () => {
        const m = decodeServerMessage(bin);
        expect(m).not.toBeNull();
        expect(asMeaning(m!)).toEqual(expectedValue(meaning.message));
      });
      if (expected === "decode") {
        it(`views the arrays of ${meaning.name} in the message's buffer (no copy)`, () => {
          // The server pads entries so that ndarray data starts on a multiple of 8 (PROTOCOL.md
          // section 3, Padding): every TypedArray is a view of the received ArrayBuffer.
          const arrays = typedArrays(decodeServerMessage(bin)).filter((a) => a.length > 0);
          // data_struct's entry holds two arrays; the padding aligns one (the largest, the first
          // of equals), and the other, an int32 at an odd offset, is copied.
          const viewed = meaning.name === "data_struct" ? arrays.slice(0, 1) : arrays;
          for (const a of viewed) expect(a.buffer).toBe(bin.buffer);
          if (meaning.name === "data_struct") expect(arrays[1]!.buffer).not.toBe(bin.buffer);
        });
      }
      it(`decodes ${meaning.name} from a misaligned buffer`, () => {
        const shifted = new Uint8Array(bin.length + 1);
        shifted.set(bin, 1);
        expect(asMeaning(decodeServerMessage(shifted.subarray(1))!)).toEqual(expectedValue(meaning.message));
      });
    } else if (expected === "decode") {
      it(`encodes ${meaning.name}`, () => {
        expect(Buffer.from(encodeClientMessage(meaning.message as unknown as ClientMessage)).toString("hex")).toBe(Buffer.from(bin).toString("hex"));
      });
    }
    // Client-to-server "accept" and "reject" vectors concern the server's decoder (tests/test_vectors.py).
  }
});
