/**
 * pvwire stream protocol v1 (protocol/PROTOCOL.md): message types, the decoder with runtime
 * validation of every field, and the encoder for client messages. Pure: bytes in, objects out.
 */
import { ProtocolError } from "./errors.js";
import { decode, encode } from "./msgpack.js";
import { decodeNdArray, NDARRAY_EXT, NdArray, type ArrayValue } from "./ndarray.js";

export const PROTOCOL_VERSION = 1;
export const SUBPROTOCOL = "pvwire.v1";
/** The same protocol with ndarray data padded to 8-byte alignment (section 1), which this client
 * views in place; offered first, so an older server that knows only SUBPROTOCOL still serves it. */
export const ALIGNED_SUBPROTOCOL = "pvwire.v1.aligned";

export const Kind = {
  HELLO: 0, ATTACHED: 1, SNAPSHOT: 2, DATA: 3, DETACHED: 4, ERROR: 5, HEARTBEAT: 6, PONG: 7, HISTORY: 8,
  ATTACH: 16, DETACH: 17, PING: 18,
} as const;

/** Entry mask bits (section 3), in the order their fields follow. */
export const Mask = { VALUE: 1, TIME: 2, ALARM: 4, META: 8, CONN: 16 } as const;
const KNOWN_MASK = 31;

/** A decoded value (section 4): numbers, strings, arrays, structures, or null for "no value yet". */
export type Value = number | bigint | string | null | ArrayValue | readonly string[] | readonly Value[] | { readonly [field: string]: Value };

/** Limits: [low, high]; an unset side is NaN. */
export type Limits = readonly [number, number];

/** Channel metadata (section 5); every key optional, unknown keys are kept as they came. */
export interface Metadata {
  readonly type?: string;
  readonly count?: number;
  readonly description?: string;
  readonly units?: string;
  readonly precision?: number;
  readonly form?: string;
  readonly display?: Limits;
  readonly control?: Limits;
  readonly alarm?: Limits;
  readonly warning?: Limits;
  readonly choices?: readonly string[];
  readonly writable?: boolean;
  /** Images: how the dims hold colour, `mono`, `RGB1`, `RGB2`, `RGB3` (section 4.5). */
  readonly colorMode?: string;
  /** The value is reduced (subscription options `maxColumns`/`maxPixels`, section 4.6). */
  readonly reduced?: Reduced;
  readonly [key: string]: unknown;
}

/**
 * How a value was reduced (section 4.6). `minmax`: a 1-D array of `from[0]` elements sent as
 * `[min0, max0, min1, max1, ...]` per column; `subsample`: an image of dims `from` sent with
 * every `step`-th row and column.
 */
export interface Reduced {
  /** `minmax` or `subsample` (a later server may add methods). */
  readonly method: string;
  /** The dims of the whole array. */
  readonly from: readonly number[];
  /** `subsample`: every `step`-th row and column. */
  readonly step?: number;
}

/** One entry: sid, mask and exactly the fields the mask selects. */
export interface Entry {
  sid: number;
  mask: number;
  value?: Value;
  serial?: number;
  seconds?: number;
  nanoseconds?: number;
  severity?: number;
  status?: number;
  message?: string;
  metadata?: Metadata;
  state?: number;
  reason?: string;
}

export interface Group { att: number; entries: Entry[] }

/**
 * A channel's recorded past, sent before its attachment's snapshot when the subscription asked
 * for `backfill` (section 2.8): columns of one length, oldest first. `resolution` 0: every
 * update as it came (min = max = value); else buckets of that many ns starting at `t`, `value`
 * the last in each. `gap` 1 marks where the channel was away (value NaN).
 *
 * An array channel's `value`, `min` and `max` are float64 NdArrays of dims [rows, elements]
 * (min and max element-wise); a scalar channel's are Float64Arrays, one number per row.
 */
export interface History {
  kind: "HISTORY";
  att: number;
  sid: number;
  resolution: number;
  /** ns since the POSIX epoch, IOC time. */
  t: BigInt64Array;
  value: Float64Array | NdArray;
  min: Float64Array | NdArray;
  max: Float64Array | NdArray;
  severity: Uint8Array;
  status: Uint16Array;
  gap: Uint8Array;
  /** Why the rows end in a gap, when that gap is a part the server could not have (the archive
   * behind its history: the archiver down, too slow...); absent: not said (section 2.8). */
  reason?: string;
}

export type ServerMessage =
  | { kind: "HELLO"; version: number; server: string; tickMs: number; heartbeatMs: number; maxInBytes: number }
  | { kind: "ATTACHED"; req: number; att: number; ids: string[] }
  | { kind: "SNAPSHOT"; seq: number; att: number; entries: Entry[] }
  | { kind: "DATA"; seq: number; groups: Group[] }
  | { kind: "DETACHED"; req: number | null; att: number }
  | { kind: "ERROR"; req: number | null; code: number; message: string }
  | { kind: "HEARTBEAT" }
  | { kind: "PONG"; nonce: number | bigint | string }
  | History;

export type ClientMessage =
  /** `since`: per channel of the token, the time (ns) after which the client lacks rows (its
   * newest, or just before a hole: held.ts), 0 for none; the server then sends only later rows
   * (section 2.8). */
  | { kind: "ATTACH"; req: number; token: string; since?: readonly bigint[] }
  | { kind: "DETACH"; req: number; att: number }
  | { kind: "PING"; nonce: number | string };

// ---- validation helpers: each names the field, so an error says exactly what was wrong ----

function fail(what: string, got: unknown): never {
  const shown = typeof got === "string" ? JSON.stringify(got) : Array.isArray(got) ? `array(${got.length})` : String(got);
  throw new ProtocolError(`invalid server message: ${what}, got ${shown}`);
}
function uint(v: unknown, what: string): number {
  if (typeof v === "number" && Number.isInteger(v) && v >= 0) return v;
  return fail(`${what} must be an unsigned integer`, v);
}
function str(v: unknown, what: string): string {
  return typeof v === "string" ? v : fail(`${what} must be a string`, v);
}
function arr(v: unknown, what: string): unknown[] {
  return Array.isArray(v) ? v : fail(`${what} must be an array`, v);
}
function optUint(v: unknown, what: string): number | null {
  return v === null ? null : uint(v, what);
}
function isMap(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v) && !ArrayBuffer.isView(v) && Object.getPrototypeOf(v) === Object.prototype;
}
function minLength(a: unknown[], n: number, what: string): void {
  if (a.length < n) fail(`${what} needs at least ${n} elements`, a);
}

function limits(v: unknown, what: string): Limits {
  const a = arr(v, what);
  if (a.length !== 2 || typeof a[0] !== "number" || typeof a[1] !== "number") fail(`${what} must be [low, high] numbers`, v);
  return [a[0], a[1]];
}

const META_CHECKS: Record<string, (v: unknown, what: string) => unknown> = {
  type: str, description: str, units: str, form: str, colorMode: str,
  count: uint,
  precision: (v, w) => (typeof v === "number" && Number.isInteger(v) ? v : fail(`${w} must be an integer`, v)),
  display: limits, control: limits, alarm: limits, warning: limits,
  choices: (v, w) => arr(v, w).map((c, i) => str(c, `${w}[${i}]`)),
  writable: (v, w) => (typeof v === "boolean" ? v : fail(`${w} must be a boolean`, v)),
  reduced: (v, w) => {
    if (!isMap(v)) return fail(`${w} must be a map`, v);
    const out: Record<string, unknown> = { ...v, method: str(v.method, `${w}.method`), from: arr(v.from, `${w}.from`).map((d, i) => uint(d, `${w}.from[${i}]`)) };
    if (v.step !== undefined) out.step = uint(v.step, `${w}.step`);
    return out;
  },
};

function metadata(v: unknown, what: string): Metadata {
  if (!isMap(v)) return fail(`${what} must be a map`, v);
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(v)) {
    const check = META_CHECKS[key];
    out[key] = check === undefined ? value : check(value, `${what}.${key}`);
  }
  return out as Metadata;
}

/** Most levels of arrays and maps in one value, its own outermost one being level 1 (section 4). */
export const MAX_VALUE_DEPTH = 64;

function value(v: unknown, what: string, level = 1): Value {
  if (v === null || typeof v === "number" || typeof v === "string" || typeof v === "bigint") return v;
  if (ArrayBuffer.isView(v)) return v as ArrayValue; // from the ndarray ext (bin is refused by the decoder)
  if (typeof v === "boolean") return fail(`${what}: booleans travel as 0/1`, v);
  const container = Array.isArray(v) || isMap(v);
  if (container && level > MAX_VALUE_DEPTH) return fail(`${what}: nested deeper than ${MAX_VALUE_DEPTH} arrays and maps`, v);
  // An array of str (string arrays, PROTOCOL.md 4.2) or of values (structure and union arrays, 4.3).
  if (Array.isArray(v)) return v.map((x, i) => value(x, `${what}[${i}]`, level + 1));
  if (isMap(v)) {
    for (const [k, x] of Object.entries(v)) value(x, `${what}.${k}`, level + 1);
    return v as Value;
  }
  return v as ArrayValue; // NdArray (from the ext decoder)
}

/** Element counts per mask bit, in field order. */
const FIELD_COUNTS: readonly (readonly [number, number])[] = [[Mask.VALUE, 2], [Mask.TIME, 2], [Mask.ALARM, 3], [Mask.META, 1], [Mask.CONN, 2]];

export function decodeEntry(raw: unknown, what: string): Entry {
  const a = arr(raw, what);
  minLength(a, 2, what);
  const sid = uint(a[0], `${what} sid`);
  const mask = uint(a[1], `${what} mask`);
  if ((mask & ~KNOWN_MASK) !== 0) fail(`${what} mask has unknown bits 0x${(mask & ~KNOWN_MASK).toString(16)} (reserved)`, mask);
  let expected = 2;
  for (const [bit, n] of FIELD_COUNTS) if (mask & bit) expected += n;
  if (a.length !== expected) fail(`${what} with mask ${mask} must have exactly ${expected} elements`, a);
  const e: Entry = { sid, mask };
  let i = 2;
  if (mask & Mask.VALUE) {
    e.value = value(a[i++], `${what} value`);
    e.serial = uint(a[i++], `${what} serial`);
  }
  if (mask & Mask.TIME) {
    e.seconds = uint(a[i++], `${what} seconds`);
    e.nanoseconds = uint(a[i++], `${what} nanoseconds`);
    if (e.nanoseconds >= 1e9) fail(`${what} nanoseconds must be < 1e9`, e.nanoseconds);
  }
  if (mask & Mask.ALARM) {
    e.severity = uint(a[i++], `${what} severity`);
    if (e.severity > 3) fail(`${what} severity must be 0..3`, e.severity);
    e.status = uint(a[i++], `${what} status`);
    e.message = str(a[i++], `${what} alarm message`);
  }
  if (mask & Mask.META) e.metadata = metadata(a[i++], `${what} metadata`);
  if (mask & Mask.CONN) {
    e.state = uint(a[i++], `${what} state`);
    e.reason = str(a[i++], `${what} reason`);
  }
  return e;
}

function entries(v: unknown, what: string): Entry[] {
  const out: Entry[] = [];
  // nil items are padding that aligns ndarray data (section 3): skipped, not entries.
  arr(v, what).forEach((x, i) => { if (x !== null) out.push(decodeEntry(x, `${what}[${i}]`)); });
  return out;
}

function extDecoder(type: number, data: Uint8Array): unknown {
  if (type !== NDARRAY_EXT) throw new ProtocolError(`invalid server message: unknown MessagePack ext type ${type}`);
  return decodeNdArray(data);
}

/**
 * Decode and validate one server message. Returns null for kinds this client does not know
 * (section 1: ignored, not an error). Throws ProtocolError for anything malformed.
 */
export function decodeServerMessage(bytes: Uint8Array): ServerMessage | null {
  const a = arr(decode(bytes, extDecoder, false), "message");
  minLength(a, 1, "message");
  const kind = uint(a[0], "kind");
  switch (kind) {
    case Kind.HELLO:
      minLength(a, 6, "HELLO");
      return { kind: "HELLO", version: uint(a[1], "HELLO version"), server: str(a[2], "HELLO server"), tickMs: uint(a[3], "HELLO tick_ms"), heartbeatMs: uint(a[4], "HELLO heartbeat_ms"), maxInBytes: uint(a[5], "HELLO max_in_bytes") };
    case Kind.ATTACHED:
      minLength(a, 4, "ATTACHED");
      return { kind: "ATTACHED", req: uint(a[1], "ATTACHED req"), att: uint(a[2], "ATTACHED att"), ids: arr(a[3], "ATTACHED ids").map((x, i) => str(x, `ATTACHED ids[${i}]`)) };
    case Kind.SNAPSHOT:
      minLength(a, 4, "SNAPSHOT");
      return { kind: "SNAPSHOT", seq: uint(a[1], "SNAPSHOT seq"), att: uint(a[2], "SNAPSHOT att"), entries: entries(a[3], "SNAPSHOT entries") };
    case Kind.DATA: {
      minLength(a, 3, "DATA");
      const groups = arr(a[2], "DATA groups").map((g, i): Group => {
        const pair = arr(g, `DATA groups[${i}]`);
        if (pair.length !== 2) fail(`DATA groups[${i}] must be [att, entries]`, pair);
        return { att: uint(pair[0], `DATA groups[${i}] att`), entries: entries(pair[1], `DATA groups[${i}] entries`) };
      });
      return { kind: "DATA", seq: uint(a[1], "DATA seq"), groups };
    }
    case Kind.DETACHED:
      minLength(a, 3, "DETACHED");
      return { kind: "DETACHED", req: optUint(a[1], "DETACHED req"), att: uint(a[2], "DETACHED att") };
    case Kind.ERROR:
      minLength(a, 4, "ERROR");
      return { kind: "ERROR", req: optUint(a[1], "ERROR req"), code: uint(a[2], "ERROR code"), message: str(a[3], "ERROR message") };
    case Kind.HEARTBEAT:
      return { kind: "HEARTBEAT" };
    case Kind.PONG:
      minLength(a, 2, "PONG");
      return { kind: "PONG", nonce: nonce(a[1]) };
    case Kind.HISTORY:
      minLength(a, 5, "HISTORY");
      return history(a);
    default:
      return null; // section 1: a kind this client does not know is ignored, whatever its number
  }
}

const HISTORY_COLUMNS = [
  ["t", BigInt64Array], ["value", Float64Array], ["min", Float64Array], ["max", Float64Array],
  ["severity", Uint8Array], ["status", Uint16Array], ["gap", Uint8Array],
] as const;

function history(a: unknown[]): History {
  // nil items are padding that aligns each column's data (section 2.8), not columns.
  const columns = arr(a[4], "HISTORY columns").filter((c) => c !== null);
  if (columns.length !== HISTORY_COLUMNS.length) fail(`HISTORY needs ${HISTORY_COLUMNS.length} columns`, columns);
  const rows = (columns[0] as { length?: number }).length;
  const out: Record<string, unknown> = { kind: "HISTORY", att: uint(a[1], "HISTORY att"), sid: uint(a[2], "HISTORY sid"), resolution: uint(a[3], "HISTORY resolution") };
  HISTORY_COLUMNS.forEach(([name, Ctor], i) => {
    const c = columns[i];
    // An array channel's value, min and max are 2-D: dims [rows, elements] (section 2.8).
    if (i >= 1 && i <= 3 && c instanceof NdArray && c.dims.length === 2 && c.data instanceof Float64Array) {
      if (c.dims[0] !== rows) fail(`HISTORY column ${name} must have ${rows} rows`, c.dims[0]);
      out[name] = c;
      return;
    }
    if (!(c instanceof Ctor)) fail(`HISTORY column ${name} must be a 1-D ${Ctor.name}${i >= 1 && i <= 3 ? " or a 2-D float64 ndarray" : ""}`, c);
    if (c.length !== rows) fail(`HISTORY column ${name} must have ${rows} rows`, c.length);
    out[name] = c;
  });
  const dims = (c: unknown) => (c instanceof NdArray ? c.dims.join("x") : "1-D");
  if (dims(out.value) !== dims(out.min) || dims(out.value) !== dims(out.max)) {
    fail("HISTORY value, min and max must have the same dims", [dims(out.value), dims(out.min), dims(out.max)]);
  }
  if ((out.severity as Uint8Array).some((s) => s > 3)) fail("HISTORY severity must be 0..3", out.severity);
  const reason = a.length > 5 ? a[5] : null;
  if (reason !== null && typeof reason !== "string") fail("HISTORY reason must be a string or nil", reason);
  if (typeof reason === "string") out.reason = reason;
  return out as unknown as History;
}

function nonce(v: unknown): number | bigint | string {
  if ((typeof v === "number" && Number.isInteger(v)) || typeof v === "bigint" || typeof v === "string") return v;
  return fail("PONG nonce must be an integer or a string", v);
}

export function encodeClientMessage(m: ClientMessage): Uint8Array {
  switch (m.kind) {
    case "ATTACH":
      if (m.since === undefined) return encode([Kind.ATTACH, m.req, m.token]);
      // Each time in its smallest encoding, as every MessagePack writer does (0 as one byte).
      return encode([Kind.ATTACH, m.req, m.token, m.since.map((t) => (t <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(t) : t))]);
    case "DETACH": return encode([Kind.DETACH, m.req, m.att]);
    case "PING": return encode([Kind.PING, m.nonce]);
  }
}
