import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  applyEntry, backoffDelay, CLOSE_CODES, DEFAULT_BACKOFF, CONNECTION_STATES, closeClass, decode, decodeNdArray, decodeServerMessage, encode, encodeNdArray, Ext,
  initialState, isWritable, NdArray, ProtocolError, PvwireClient, transition, TRANSITIONS, withAccess, type Access, type Encodable,
  type WebSocketConstructor,
} from "../src/index.js";

const frame = (v: Encodable) => encode(v);

describe("close codes", () => {
  const source = JSON.parse(readFileSync(join(import.meta.dirname, "../../../protocol/close_codes.json"), "utf8")) as { codes: { code: number; name: string; class: string }[] };
  it("equal protocol/close_codes.json (the single source)", () => {
    const fromJson = Object.fromEntries(source.codes.map((c) => [c.code, { name: c.name, class: c.class }]));
    expect(CLOSE_CODES).toEqual(fromJson);
  });
  it("classify unknown codes by the protocol's default rule", () => {
    expect(closeClass(3001)).toBe("reconnect");
    expect(closeClass(1014)).toBe("reconnect");
    expect(closeClass(4999)).toBe("terminal");
    expect(closeClass(4000)).toBe("reconnect");
    for (const c of source.codes) expect(closeClass(c.code)).toBe(c.class);
  });
});

describe("connection state machine", () => {
  it("has the documented transitions and refuses the others", () => {
    expect(transition("disconnected", "open")).toBe("connecting");
    expect(transition("connecting", "hello")).toBe("connected");
    expect(transition("connected", "lost")).toBe("connecting");
    expect(transition("connecting", "lost")).toBe("connecting");
    expect(transition("connected", "closed")).toBe("disconnected");
    expect(() => transition("disconnected", "hello")).toThrow(/illegal/);
    expect(() => transition("connected", "open")).toThrow(/illegal/);
    expect(() => transition("disconnected", "lost")).toThrow(/illegal/);
    expect(Object.keys(TRANSITIONS).sort()).toEqual(["connected", "connecting", "disconnected"]);
  });
  it("backs off with full jitter, capped", () => {
    const o = { baseMs: 500, maxMs: 5_000 };
    expect(backoffDelay(0, o, () => 0.999)).toBeCloseTo(499.5);
    expect(backoffDelay(3, o, () => 0.5)).toBe(2000);
    expect(backoffDelay(20, o, () => 1)).toBe(5_000);
    expect(DEFAULT_BACKOFF).toEqual(o); // the Python client's defaults too (PROTOCOL.md section 8)
    expect(backoffDelay(5, o, () => 0)).toBe(0);
  });
});

describe("msgpack", () => {
  it("round-trips the types pvwire uses", () => {
    const v = [0, 127, 128, 255, 256, 65535, 65536, 2 ** 32, -1, -32, -33, -128, -129, -40000, -(2 ** 31) - 1, 1.5, -0.25, "", "é", "x".repeat(40), "y".repeat(300), null, true, false, [1, [2]], { a: 1, b: "c" }];
    expect(decode(encode(v as Encodable))).toEqual(v);
  });
  it("keeps uint64 beyond 2^53 exact", () => {
    expect(decode(encode(2n ** 64n - 1n))).toBe(2n ** 64n - 1n);
    expect(decode(encode(-(2n ** 63n)))).toBe(-(2n ** 63n));
  });
  it("rejects trailing bytes, truncation and invalid type bytes", () => {
    expect(() => decode(new Uint8Array([0x91, 1, 2]))).toThrow(/1 trailing bytes/);
    expect(() => decode(new Uint8Array([0x92, 1]))).toThrow(/truncated|cannot fit/);
    expect(() => decode(new Uint8Array([0xc1]))).toThrow(/invalid MessagePack type byte 0xc1/);
    expect(() => decode(new Uint8Array([0xdd, 0xff, 0xff, 0xff, 0xff]))).toThrow(/cannot fit/);
  });
  it("bounds nesting depth", () => {
    const deep = new Uint8Array(200).fill(0x91);
    expect(() => decode(deep)).toThrow(/nested deeper/);
  });
});

describe("ndarray ext", () => {
  const payload = encodeNdArray(new Float64Array([1, 2, 3]));
  it("views the received bytes when aligned", () => {
    const buf = new Uint8Array(64);
    buf.set(payload, 8 - 6); // data starts at 2 + 4 = 6 → offset 8
    const a = decodeNdArray(buf.subarray(2, 2 + payload.length));
    expect(a).toBeInstanceOf(Float64Array);
    expect((a as Float64Array).buffer).toBe(buf.buffer);
    expect(Array.from(a as Float64Array)).toEqual([1, 2, 3]);
  });
  it("copies once when misaligned", () => {
    const buf = new Uint8Array(64);
    buf.set(payload, 3);
    const a = decodeNdArray(buf.subarray(3, 3 + payload.length)) as Float64Array;
    expect(a.buffer).not.toBe(buf.buffer);
    expect(Array.from(a)).toEqual([1, 2, 3]);
  });
  it("keeps dims of images", () => {
    const img = new NdArray("uint16", [2, 3], new Uint16Array([1, 2, 3, 4, 5, 6]));
    const back = decodeNdArray(encodeNdArray(img));
    expect(back).toBeInstanceOf(NdArray);
    expect((back as NdArray).dims).toEqual([2, 3]);
    expect((back as NdArray).dtype).toBe("uint16");
  });
  it("rejects a length that does not match the dims, and unknown dtypes", () => {
    const bad = encodeNdArray(new Int32Array([1, 2]));
    expect(() => decodeNdArray(bad.subarray(0, bad.length - 1))).toThrow(/need 8 data bytes, got 7/);
    expect(() => decodeNdArray(new Uint8Array([12, 0]))).toThrow(/unknown dtype code 12/);
    expect(() => decodeNdArray(new Uint8Array([9, 2, 0]))).toThrow(/header bytes/);
  });
});

describe("message validation", () => {
  const data = (entry: Encodable[]) => frame([3, 1, [[1, [entry]]]]);
  it("rejects unknown mask bits", () => {
    expect(() => decodeServerMessage(data([0, 32]))).toThrow(/unknown bits 0x20/);
  });
  it("checks the element count against the mask", () => {
    expect(() => decodeServerMessage(data([0, 3, 1.5, 1, 17]))).toThrow(/exactly 6 elements/);
    expect(() => decodeServerMessage(data([0, 1, 1.5, 1, 9]))).toThrow(/exactly 4 elements/);
  });
  it("checks field types and ranges", () => {
    expect(() => decodeServerMessage(data([0, 2, 1, 1e9]))).toThrow(/nanoseconds must be < 1e9/);
    expect(() => decodeServerMessage(data([0, 4, 4, 0, ""]))).toThrow(/severity must be 0..3/);
    expect(() => decodeServerMessage(data([0, 16, 1, 7]))).toThrow(/reason must be a string/);
    expect(() => decodeServerMessage(data([0, 8, { units: 5 }]))).toThrow(/metadata.units must be a string/);
    expect(() => decodeServerMessage(data([0, 8, { display: [1] }]))).toThrow(/display must be \[low, high\]/);
    expect(() => decodeServerMessage(data([0, 8, { reduced: { method: 1, from: [10] } }]))).toThrow(/metadata.reduced.method must be a string/);
    expect(() => decodeServerMessage(data([0, 8, { reduced: { method: "minmax", from: [-1] } }]))).toThrow(/metadata.reduced.from\[0\]/);
    expect(() => decodeServerMessage(data([0, 8, { reduced: "minmax" }]))).toThrow(/metadata.reduced must be a map/);
    expect(() => decodeServerMessage(data([-1, 0]))).toThrow(/sid must be an unsigned integer/);
    expect(() => decodeServerMessage(frame([0, 1, "s", 20]))).toThrow(/HELLO needs at least 6/);
    expect(() => decodeServerMessage(frame({ a: 1 }))).toThrow(ProtocolError);
    expect(() => decodeServerMessage(frame([3, 1, [[1, [[0, 1, new Ext(5, new Uint8Array(1)), 1]]]]]))).toThrow(/unknown MessagePack ext type 5/);
  });
  it("ignores unknown server kinds and extra trailing elements", () => {
    expect(decodeServerMessage(frame([9, "future"]))).toBeNull();
    expect(decodeServerMessage(frame([6, "extra"]))).toEqual({ kind: "HEARTBEAT" });
    expect(decodeServerMessage(frame([16, 1, "tok"]))).toBeNull(); // section 1: any unknown kind, even a client one
  });
});

describe("channel state merge", () => {
  it("merges deltas, counts conflation and resets on a lower serial", () => {
    let s = initialState("ca://X", 0);
    [s] = applyEntry(s, { sid: 0, mask: 31, value: 1, serial: 5, seconds: 10, nanoseconds: 0, severity: 0, status: 0, message: "", metadata: { units: "mm" }, state: 1, reason: "" });
    expect(s).toMatchObject({ value: 1, serial: 5, connection: "CONNECTED", metadata: { units: "mm" }, alarm: { severity: "NO_ALARM" } });
    let changed;
    [s, changed] = applyEntry(s, { sid: 0, mask: 3, value: 2, serial: 8, seconds: 11, nanoseconds: 5 });
    expect(changed).toEqual(["value", "time"]);
    expect(s).toMatchObject({ value: 2, conflated: 2, conflatedTotal: 2, metadata: { units: "mm" }, connection: "CONNECTED" });
    [s] = applyEntry(s, { sid: 0, mask: 16, state: 2, reason: "IOC gone" });
    expect(s).toMatchObject({ value: 2, connection: "DISCONNECTED", reason: "IOC gone" });
    [s] = applyEntry(s, { sid: 0, mask: 19, value: 3, serial: 1, seconds: 12, nanoseconds: 0, state: 1, reason: "" });
    expect(s).toMatchObject({ value: 3, serial: 1, conflated: 0, conflatedTotal: 0, connection: "CONNECTED" });
  });
  it("merges a snapshot entry: fields it lacks keep what the client had", () => {
    let s = initialState("pva://X", 0);
    [s] = applyEntry(s, { sid: 0, mask: 31, value: 1, serial: 5, seconds: 10, nanoseconds: 0, severity: 1, status: 3, message: "HIGH", metadata: { units: "mm" }, state: 1, reason: "" });
    // A re-attach's snapshot without ALARM, TIME and META (the server had nothing new to say).
    let changed;
    [s, changed] = applyEntry(s, { sid: 0, mask: 17, value: 1, serial: 5, state: 1, reason: "" });
    expect(changed).toEqual([]); // changed, not carried: it repeats what the client knew
    expect(s.alarm).toEqual({ severity: "MINOR", status: 3, message: "HIGH" });
    expect(s.time).toEqual({ seconds: 10, nanoseconds: 0 });
    expect(s.metadata).toEqual({ units: "mm" });
    // The same serial again is no gap and no reopen.
    expect(s).toMatchObject({ serial: 5, conflated: 0, conflatedTotal: 0 });
  });
  it("names only what changed: unset limits (NaN) repeated, an equal value with a new serial, arrays", () => {
    let s = initialState("ca://X", 0);
    let changed;
    [s, changed] = applyEntry(s, { sid: 0, mask: 8, metadata: { display: [Number.NaN, 10], units: "mA" } });
    expect(changed).toEqual(["metadata"]);
    [s, changed] = applyEntry(s, { sid: 0, mask: 8, metadata: { display: [Number.NaN, 10], units: "mA" } });
    expect(changed).toEqual([]);
    [s, changed] = applyEntry(s, { sid: 0, mask: 1, value: 5, serial: 1 });
    [s, changed] = applyEntry(s, { sid: 0, mask: 1, value: 5, serial: 2 });
    expect(changed).toEqual(["value"]);
    const a = new Float64Array([1, 2]);
    [s, changed] = applyEntry(s, { sid: 0, mask: 1, value: a, serial: 2 });
    expect(changed).toEqual(["value"]);
    [s, changed] = applyEntry(s, { sid: 0, mask: 1, value: new Float64Array([1, 2]), serial: 2 });
    expect(changed).toEqual(["value"]); // arrays are not compared: a new one is news
  });
  it("keeps the alarm through value deltas once known, and leaves it undefined until the server says", () => {
    let s = initialState("pva://X", 0);
    [s] = applyEntry(s, { sid: 0, mask: 27, value: 1, serial: 1, seconds: 1, nanoseconds: 0, metadata: {}, state: 1, reason: "" });
    expect(s.alarm).toBeUndefined(); // not known: the client never invents NO_ALARM
    [s] = applyEntry(s, { sid: 0, mask: 4, severity: 0, status: 0, message: "" });
    for (let i = 2; i < 5; i++) [s] = applyEntry(s, { sid: 0, mask: 3, value: i, serial: i, seconds: i, nanoseconds: 0 });
    expect(s).toMatchObject({ value: 4, alarm: { severity: "NO_ALARM", status: 0, message: "" } });
  });
  it("decodes the NOT_FOUND connection state (wire 4) with its reason", () => {
    const m = decodeServerMessage(frame([3, 1, [[1, [[0, 16, 4, "not found (no IOC answered for 5 s)"]]]]]));
    expect(m?.kind).toBe("DATA");
    const e = m?.kind === "DATA" ? m.groups[0]!.entries[0]! : undefined;
    const [s] = applyEntry(initialState("ca://NOPE", 0), e!);
    expect(s).toMatchObject({ connection: "NOT_FOUND", reason: "not found (no IOC answered for 5 s)" });
    expect(CONNECTION_STATES).toEqual(["CONNECTING", "CONNECTED", "DISCONNECTED", "FAILED", "NOT_FOUND"]);
  });
});

describe("demo page chart ticks", () => {
  it("picks 1-2-5 steps inside the range, labelled with just enough decimals", async () => {
    const { niceTicks } = await import("../page/axes.js");
    expect(niceTicks(0, 999, 5).map((t) => t.label)).toEqual(["0", "200", "400", "600", "800"]);
    expect(niceTicks(-5, 5, 4).map((t) => t.label)).toEqual(["-5", "0", "5"]);
    expect(niceTicks(-5, 5, 10).map((t) => t.label)).toEqual(["-5", "-4", "-3", "-2", "-1", "0", "1", "2", "3", "4", "5"]);
    expect(niceTicks(0.1, 0.35, 5).map((t) => t.label)).toEqual(["0.10", "0.15", "0.20", "0.25", "0.30", "0.35"]);
    expect(niceTicks(1, 1)).toEqual([]);
    expect(niceTicks(0, Number.NaN)).toEqual([]);
  });
  it("puts time ticks on whole multiples of the step, as local HH:MM:SS", async () => {
    const { timeTicks } = await import("../page/axes.js");
    const t0 = new Date(2026, 0, 2, 10, 0, 7).getTime();
    const ticks = timeTicks(t0, t0 + 60_000, 15);
    expect(ticks.map((t) => t.label)).toEqual(["10:00:15", "10:00:30", "10:00:45", "10:01:00"]);
  });
});

describe("connection states", () => {
  it("shows NOT_FOUND, and an unknown state number as DISCONNECTED", () => {
    const base = initialState("ca://NOPE", 0);
    const [found] = applyEntry(base, { sid: 0, mask: 16, state: 4, reason: "not found (no IOC answered for 5 s)" });
    expect(found.connection).toBe("NOT_FOUND");
    const [later] = applyEntry(found, { sid: 0, mask: 16, state: 99, reason: "" });
    expect(later.connection).toBe("DISCONNECTED");
  });
  it("takes a snapshot's serial as a new baseline, not as conflation (reconnect, other replica)", () => {
    let s = initialState("ca://X", 0);
    [s] = applyEntry(s, { sid: 0, mask: 1, value: 1, serial: 5 }, true);
    [s] = applyEntry(s, { sid: 0, mask: 1, value: 2, serial: 7 }, false);
    expect(s).toMatchObject({ serial: 7, conflated: 1, conflatedTotal: 1 });
    [s] = applyEntry(s, { sid: 0, mask: 1, value: 3, serial: 500 }, true);
    // `conflated` counts since the subscription started: the baseline adds nothing to it.
    expect(s).toMatchObject({ serial: 500, conflated: 1, conflatedTotal: 1 });
    [s] = applyEntry(s, { sid: 0, mask: 1, value: 4, serial: 503 }, false);
    expect(s).toMatchObject({ serial: 503, conflated: 3, conflatedTotal: 3 });
  });
});

describe("writable for this identity", () => {
  it.each([
    ["WRITE", undefined, true], // the upstream cannot tell (PVA): the grant decides
    ["WRITE", true, true],
    ["WRITE", false, false], // the IOC refuses writes whatever the rules say
    ["READ", true, false],
    ["READ", undefined, false],
    [undefined, true, true], // a token obtained elsewhere: only the metadata can say
    [undefined, undefined, false],
  ] as [Access | undefined, boolean | undefined, boolean][])("access %s, upstream writable %s: %s", (access, upstream, writable) => {
    expect(isWritable(access, upstream === undefined ? {} : { writable: upstream })).toBe(writable);
  });

  it("follows metadata entries and access changes", () => {
    let s = initialState("ca://SP", 0, "WRITE");
    expect(s.writable).toBe(true);
    [s] = applyEntry(s, { sid: 0, mask: 8, metadata: { writable: false } });
    expect(s).toMatchObject({ access: "WRITE", writable: false });
    [s] = applyEntry(s, { sid: 0, mask: 8, metadata: { units: "mm" } });
    expect(s.writable).toBe(true);
    const read = withAccess(s, "READ");
    expect(read).toMatchObject({ access: "READ", writable: false, metadata: { units: "mm" } });
    expect(withAccess(read, "READ")).toBe(read);
  });
});

describe("subscribe options", () => {
  it("ask for a reduction only when given, and send it as the GraphQL SubscribeOptions", async () => {
    const sent: unknown[] = [];
    const fetch = async (_url: string, init: { body: string }) => {
      sent.push((JSON.parse(init.body) as { variables: { o: unknown } }).variables.o);
      return { ok: true, status: 200, json: async () => ({ data: { subscribe: { token: "t", expiresAt: 0, streamPath: "/stream", channels: [] } } }) };
    };
    const c = new PvwireClient("http://127.0.0.1:1", { WebSocket: class {} as unknown as WebSocketConstructor, fetch });
    await c.register(["a"]);
    await c.register(["a"], { maxColumns: 628, maxPixels: 262_144, maxRate: 5 });
    expect(sent).toEqual([
      { maxRate: 0, mode: "LATEST" },
      { maxRate: 5, mode: "LATEST", maxColumns: 628, maxPixels: 262_144 },
    ]);
  });
});
