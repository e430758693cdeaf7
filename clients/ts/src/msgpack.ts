/**
 * A small MessagePack codec for the pvwire stream, with no dependencies.
 *
 * Why hand-written: bench/decode.mjs measured it against @msgpack/msgpack and msgpackr on real
 * pvwire frames (numbers in README.md); it is as fast or faster on DATA frames and decodes the
 * ndarray ext without copying, and it lets the package ship with zero runtime dependencies.
 *
 * Strict by design: one value per buffer (trailing bytes are an error), bounded nesting, array
 * and map lengths checked against the bytes left before anything is allocated.
 */

import { ProtocolError } from "./errors.js";

/** Raised for bytes that are not valid MessagePack (or not what pvwire allows). */
export class MsgpackError extends ProtocolError {
  override name = "MsgpackError";
}

/** Called for every ext value; returns the decoded value. `data` views the received bytes. */
export type ExtDecoder = (type: number, data: Uint8Array) => unknown;

/** Deepest nesting accepted, counted from the message itself: it bounds the reader's stack.
 * protocol.ts holds values to section 4's 64 levels, under the 5 levels of a DATA message. */
export const MAX_DEPTH = 100;

// fatal: invalid UTF-8 is a malformed message (PROTOCOL.md section 1), not text to repair.
const utf8 = new TextDecoder("utf-8", { fatal: true });
const utf8enc = new TextEncoder();

function decodeUtf8(bytes: Uint8Array): string {
  try {
    return utf8.decode(bytes);
  } catch {
    throw new MsgpackError("MessagePack str is not valid UTF-8");
  }
}

class Reader {
  pos = 0;
  readonly view: DataView;
  constructor(
    readonly bytes: Uint8Array,
    readonly ext: ExtDecoder | undefined,
    readonly allowBin: boolean,
  ) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  need(n: number): number {
    const p = this.pos;
    if (p + n > this.bytes.length) {
      throw new MsgpackError(`truncated MessagePack: need ${n} bytes at offset ${p}, have ${this.bytes.length - p}`);
    }
    this.pos = p + n;
    return p;
  }

  str(n: number): string {
    const p = this.need(n);
    const b = this.bytes;
    // Short ASCII strings (field names, alarm messages) decode faster by hand than through
    // TextDecoder, whose call overhead dominates below ~16 bytes.
    if (n < 16) {
      let s = "";
      for (let i = p; i < p + n; i++) {
        const c = b[i]!;
        if (c >= 0x80) return decodeUtf8(b.subarray(p, p + n));
        s += String.fromCharCode(c);
      }
      return s;
    }
    return decodeUtf8(b.subarray(p, p + n));
  }

  array(n: number, depth: number): unknown[] {
    if (n > this.bytes.length - this.pos) throw new MsgpackError(`array of ${n} elements cannot fit in ${this.bytes.length - this.pos} bytes`);
    const out = new Array<unknown>(n);
    for (let i = 0; i < n; i++) out[i] = this.value(depth);
    return out;
  }

  map(n: number, depth: number): Record<string, unknown> {
    if (2 * n > this.bytes.length - this.pos) throw new MsgpackError(`map of ${n} pairs cannot fit in ${this.bytes.length - this.pos} bytes`);
    const out: Record<string, unknown> = {};
    for (let i = 0; i < n; i++) {
      const key = this.value(depth);
      // Every map of the protocol has string keys (section 5; structures in section 4).
      if (typeof key !== "string") throw new MsgpackError(`map key must be a string, got ${typeof key}`);
      const v = this.value(depth);
      if (key === "__proto__") Object.defineProperty(out, key, { value: v, enumerable: true, writable: true, configurable: true });
      else out[key] = v;
    }
    return out;
  }

  extension(n: number): unknown {
    const type = this.view.getInt8(this.need(1));
    const p = this.need(n);
    const data = this.bytes.subarray(p, p + n);
    if (this.ext === undefined) throw new MsgpackError(`unexpected MessagePack ext type ${type}`);
    return this.ext(type, data);
  }

  u64(p: number, signed: boolean): number | bigint {
    const v = signed ? this.view.getBigInt64(p) : this.view.getBigUint64(p);
    return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v;
  }

  value(depth: number): unknown {
    if (depth > MAX_DEPTH) throw new MsgpackError(`MessagePack nested deeper than ${MAX_DEPTH}`);
    const t = this.bytes[this.need(1)]!;
    if (t < 0x80) return t; // positive fixint
    if (t < 0x90) return this.map(t & 0x0f, depth + 1);
    if (t < 0xa0) return this.array(t & 0x0f, depth + 1);
    if (t < 0xc0) return this.str(t & 0x1f);
    if (t >= 0xe0) return t - 0x100; // negative fixint
    const v = this.view;
    switch (t) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: { const n = this.bytes[this.need(1)]!; if (!this.allowBin) throw new MsgpackError("MessagePack bin is not allowed here"); const p = this.need(n); return this.bytes.subarray(p, p + n); }
      case 0xc5: { const n = v.getUint16(this.need(2)); if (!this.allowBin) throw new MsgpackError("MessagePack bin is not allowed here"); const p = this.need(n); return this.bytes.subarray(p, p + n); }
      case 0xc6: { const n = v.getUint32(this.need(4)); if (!this.allowBin) throw new MsgpackError("MessagePack bin is not allowed here"); const p = this.need(n); return this.bytes.subarray(p, p + n); }
      case 0xc7: return this.extension(this.bytes[this.need(1)]!);
      case 0xc8: return this.extension(v.getUint16(this.need(2)));
      case 0xc9: return this.extension(v.getUint32(this.need(4)));
      case 0xca: return v.getFloat32(this.need(4));
      case 0xcb: return v.getFloat64(this.need(8));
      case 0xcc: return this.bytes[this.need(1)]!;
      case 0xcd: return v.getUint16(this.need(2));
      case 0xce: return v.getUint32(this.need(4));
      case 0xcf: return this.u64(this.need(8), false);
      case 0xd0: return v.getInt8(this.need(1));
      case 0xd1: return v.getInt16(this.need(2));
      case 0xd2: return v.getInt32(this.need(4));
      case 0xd3: return this.u64(this.need(8), true);
      case 0xd4: return this.extension(1);
      case 0xd5: return this.extension(2);
      case 0xd6: return this.extension(4);
      case 0xd7: return this.extension(8);
      case 0xd8: return this.extension(16);
      case 0xd9: return this.str(this.bytes[this.need(1)]!);
      case 0xda: return this.str(v.getUint16(this.need(2)));
      case 0xdb: return this.str(v.getUint32(this.need(4)));
      case 0xdc: return this.array(v.getUint16(this.need(2)), depth + 1);
      case 0xdd: return this.array(v.getUint32(this.need(4)), depth + 1);
      case 0xde: return this.map(v.getUint16(this.need(2)), depth + 1);
      case 0xdf: return this.map(v.getUint32(this.need(4)), depth + 1);
      default: throw new MsgpackError(`invalid MessagePack type byte 0x${t.toString(16)} at offset ${this.pos - 1}`);
    }
  }
}

/** Decode exactly one MessagePack value; trailing bytes are an error. Binary values view `bytes`. */
export function decode(bytes: Uint8Array, ext?: ExtDecoder, allowBin = true): unknown {
  const r = new Reader(bytes, ext, allowBin);
  const value = r.value(0);
  if (r.pos !== bytes.length) throw new MsgpackError(`${bytes.length - r.pos} trailing bytes after the MessagePack value`);
  return value;
}

/** Values the encoder accepts: what the client sends (ATTACH, DETACH, PING) and test frames. */
export type Encodable = null | boolean | number | bigint | string | Uint8Array | Ext | readonly Encodable[] | { readonly [key: string]: Encodable };

/** An ext value to encode (used by tests to build server frames). */
export class Ext {
  constructor(
    readonly type: number,
    readonly data: Uint8Array,
  ) {}
}

class Writer {
  buf = new Uint8Array(64);
  view = new DataView(this.buf.buffer);
  pos = 0;

  reserve(n: number): number {
    if (this.pos + n > this.buf.length) {
      const next = new Uint8Array(Math.max(this.buf.length * 2, this.pos + n));
      next.set(this.buf);
      this.buf = next;
      this.view = new DataView(next.buffer);
    }
    const p = this.pos;
    this.pos += n;
    return p;
  }
  /** Reserve n bytes and return the (possibly regrown) view; the bytes start at pos - n. */
  at(n: number): DataView {
    this.reserve(n);
    return this.view;
  }
  u8(x: number): void { const p = this.reserve(1); this.buf[p] = x; }
  head(x: number, small: number, c8: number | null, c16: number, c32: number, smallMax: number): void {
    if (x <= smallMax) this.u8(small | x);
    else if (c8 !== null && x < 0x100) { this.u8(c8); this.u8(x); }
    else if (x < 0x10000) { this.u8(c16); this.at(2).setUint16(this.pos - 2, x); }
    else { this.u8(c32); this.at(4).setUint32(this.pos - 4, x); }
  }

  value(v: Encodable): void {
    if (v === null) this.u8(0xc0);
    else if (typeof v === "boolean") this.u8(v ? 0xc3 : 0xc2);
    else if (typeof v === "number") this.number(v);
    else if (typeof v === "bigint") {
      if (v >= 0n) { this.u8(0xcf); this.at(8).setBigUint64(this.pos - 8, v); }
      else { this.u8(0xd3); this.at(8).setBigInt64(this.pos - 8, v); }
    } else if (typeof v === "string") {
      const b = utf8enc.encode(v);
      this.head(b.length, 0xa0, 0xd9, 0xda, 0xdb, 31);
      { const p = this.reserve(b.length); this.buf.set(b, p); }
    } else if (v instanceof Uint8Array) {
      this.head(v.length, 0, 0xc4, 0xc5, 0xc6, -1);
      { const p = this.reserve(v.length); this.buf.set(v, p); }
    } else if (v instanceof Ext) {
      const n = v.data.length;
      const fixed = [1, 2, 4, 8, 16].indexOf(n);
      if (fixed >= 0) this.u8(0xd4 + fixed);
      else this.head(n, 0, 0xc7, 0xc8, 0xc9, -1);
      this.at(1).setInt8(this.pos - 1, v.type);
      { const p = this.reserve(n); this.buf.set(v.data, p); }
    } else if (Array.isArray(v)) {
      const a = v as readonly Encodable[];
      this.head(a.length, 0x90, null, 0xdc, 0xdd, 15);
      for (const x of a) this.value(x);
    } else {
      const entries = Object.entries(v as { [key: string]: Encodable });
      this.head(entries.length, 0x80, null, 0xde, 0xdf, 15);
      for (const [k, x] of entries) { this.value(k); this.value(x); }
    }
  }

  number(x: number): void {
    if (Number.isInteger(x) && Math.abs(x) <= Number.MAX_SAFE_INTEGER) {
      if (x >= 0) {
        if (x < 0x80) this.u8(x);
        else if (x < 0x100) { this.u8(0xcc); this.u8(x); }
        else if (x < 0x10000) { this.u8(0xcd); this.at(2).setUint16(this.pos - 2, x); }
        else if (x < 0x100000000) { this.u8(0xce); this.at(4).setUint32(this.pos - 4, x); }
        else { this.u8(0xcf); this.at(8).setBigUint64(this.pos - 8, BigInt(x)); }
      } else if (x >= -32) this.u8(x + 0x100);
      else if (x >= -0x80) { this.u8(0xd0); this.at(1).setInt8(this.pos - 1, x); }
      else if (x >= -0x8000) { this.u8(0xd1); this.at(2).setInt16(this.pos - 2, x); }
      else if (x >= -0x80000000) { this.u8(0xd2); this.at(4).setInt32(this.pos - 4, x); }
      else { this.u8(0xd3); this.at(8).setBigInt64(this.pos - 8, BigInt(x)); }
    } else {
      this.u8(0xcb);
      this.at(8).setFloat64(this.pos - 8, x);
    }
  }
}

/** Encode one value. Integers use the smallest encoding, other numbers float 64. */
export function encode(value: Encodable): Uint8Array {
  const w = new Writer();
  w.value(value);
  return w.buf.slice(0, w.pos);
}
