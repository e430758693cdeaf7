// Every EPICS record type and FTVL (tests/dbs/alltypes.db) through the real server, over CA and
// PVA: all records and two 10 Hz counters in ONE subscription; the counters must flow with no gap
// the serials do not explain, and every unusual channel must decode to the value PROTOCOL.md
// section 4 promises (string arrays, int64 beyond 2^53 as bigint, NaN, empty arrays, enums).
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { NdArray, PvwireClient, type ChannelState, type Value, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

const skip = stackUnavailable();
if (skip) throw new Error(`integration tests cannot run: ${skip}`);

const CONNECTED = "CONNECTED";
const LONG_LSO = "a long string over CA's forty-character limit, read whole over PVA and through NAME.VAL$";

/** What a channel must hold: [value, metadata type], per protocol. */
type Want = readonly [Value | ((v: unknown) => boolean), string];
const same = (want: Want[0], got: unknown): boolean => (typeof want === "function" ? want(got) : JSON.stringify(plain(got)) === JSON.stringify(plain(want)));
/** Comparable data: typed arrays with their type name, bigints as text, NaN as text. */
function plain(v: unknown): unknown {
  if (v instanceof NdArray) return { dims: v.dims, data: plain(v.data) };
  if (ArrayBuffer.isView(v)) return { type: v.constructor.name, data: Array.from(v as unknown as ArrayLike<unknown>, plain) };
  if (Array.isArray(v)) return v.map(plain);
  if (typeof v === "bigint") return `${v}n`;
  if (typeof v === "number" && !Number.isFinite(v)) return String(v);
  return v;
}

const ODD: Record<string, { ca: Want; pva: Want }> = {
  "AT:WF:STRING": { ca: [["a", "", "thirty-nine characters, the CA maximum"], "string"], pva: [["a", "", "thirty-nine characters, the CA maximum"], "string"] },
  "AT:WF:STRING1": { ca: [["only"], "string"], pva: [["only"], "string"] },
  "AT:WF:STRING0": { ca: [[], "string"], pva: [[], "string"] },
  "AT:AO:NAN": { ca: [(v) => Number.isNaN(v), "float64"], pva: [(v) => Number.isNaN(v), "float64"] },
  "AT:AO:NINF": { ca: [-Infinity, "float64"], pva: [-Infinity, "float64"] },
  "AT:INT64IN": { ca: [9007199254740992, "float64"], pva: [9007199254740993n, "int64"] },
  "AT:INT64OUT": { ca: [-9223372036854775807, "float64"], pva: [-9223372036854775807n, "int64"] },
  "AT:WF:INT64": { ca: [new Float64Array([-9223372036854775807, 9007199254740993, 9223372036854775807]), "float64"], pva: [new BigInt64Array([-9223372036854775807n, 9007199254740993n, 9223372036854775807n]), "int64"] },
  "AT:SA:UINT64": { ca: [new Float64Array([9223372036854775807, 9007199254740993]), "float64"], pva: [new BigUint64Array([9223372036854775807n, 9007199254740993n]), "uint64"] },
  "AT:WF:CHAR": { ca: [new Uint8Array([128, 0, 127]), "uint8"], pva: [new Int8Array([-128, 0, 127]), "int8"] },
  "AT:AAO:DOUBLE": { ca: [new Float64Array([]), "float64"], pva: [new Float64Array([]), "float64"] },
  "AT:AAI:FLOAT": { ca: [new Float32Array([0.5, 1.5]), "float32"], pva: [new Float32Array([0.5, 1.5]), "float32"] },
  "AT:WF:USHORT": { ca: [new Int32Array([0, 65535, 1]), "int32"], pva: [new Uint16Array([0, 65535, 1]), "uint16"] },
  "AT:MBBI:16": { ca: [15, "enum"], pva: [15, "enum"] },
  "AT:MBBI:EMPTY": { ca: [3, "enum"], pva: [3, "enum"] },
  "AT:BI": { ca: [1, "enum"], pva: [1, "enum"] },
  "AT:LSO": { ca: [LONG_LSO.slice(0, 39), "string"], pva: [LONG_LSO, "string"] },
  "AT:LSO.VAL$": { ca: [LONG_LSO, "string"], pva: [LONG_LSO, "string"] },
  "AT:HISTOGRAM": { ca: [new Float64Array([0, 0, 0, 0]), "float64"], pva: [new Uint32Array([0, 0, 0, 0]), "uint32"] },
};
const COUNTERS = ["AT:COUNTER1", "AT:COUNTER2"] as const;

describe("every EPICS type through the real server", () => {
  let stack: Stack;
  let client: PvwireClient;

  beforeAll(async () => {
    process.env.PVWIRE_STACK_DB = join(import.meta.dirname, "../../../tests/dbs/alltypes.db");
    stack = await startStack(["--write-rule", "ca://AT:*", "--write-rule", "pva://AT:*"]);
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
  });
  afterAll(async () => {
    client?.close();
    await stack?.stop();
  });

  for (const scheme of ["ca", "pva"] as const) {
    it(`${scheme}: every odd channel and two 10 Hz counters in one subscription`, async () => {
      const names = [...Object.keys(ODD), ...COUNTERS];
      const counterSeen: [number, number][][] = [[], []];
      const problems = (chs: readonly ChannelState[]): string[] =>
        Object.entries(ODD).flatMap(([name, want], i) => {
          const [value, type] = want[scheme];
          const ch = chs[i]!;
          return ch.connection === CONNECTED && ch.metadata.type === type && same(value, ch.value) ? [] : [`${name}: ${ch.connection} ${String(ch.metadata.type)} ${JSON.stringify(plain(ch.value))}`];
        });
      let settled = false;
      const sub = client.subscribe(names.map((n) => `${scheme}://${n}`), (st) => {
        const c = st.sid - Object.keys(ODD).length;
        if (c >= 0 && settled && st.serial !== undefined) counterSeen[c]!.push([st.serial, st.value as number]);
      });
      await sub.ready;
      await until(() => (settled = problems(sub.channels).length === 0), 30_000, `every channel right: ${problems(sub.channels).join("; ")}`);
      await until(() => counterSeen.every((s) => s.length >= 30), 30_000, "30 updates of each counter");
      sub.unsubscribe();
      counterSeen.forEach((seen, c) => {
        for (let i = 1; i < seen.length; i++) {
          const [s0, v0] = seen[i - 1]!;
          const [s1, v1] = seen[i]!;
          if (s1 === s0) continue; // the same update seen again (e.g. an alarm-only change)
          expect(s1).toBeGreaterThan(s0);
          // Every gap is counted in the serial: the counter moved by at most that many steps
          // (not exactly: the serial counts upstream updates, and one may repeat the value).
          expect(v1 - v0).toBeGreaterThanOrEqual(0);
          expect(v1 - v0).toBeLessThanOrEqual((c + 1) * (s1 - s0));
        }
        expect(seen.at(-1)![1] - seen[0]![1]).toBeGreaterThanOrEqual((c + 1) * Math.floor(seen.length / 2)); // it counts
      });
    });
  }

  it("reads the odd channels over GraphQL", async () => {
    const chans = await client.get(["pva://AT:WF:STRING", "ca://AT:WF:STRING0", "pva://AT:MBBO:16", "pva://AT:INT64IN"]);
    expect(chans.map((c) => c.error)).toEqual([null, null, null, null]);
    expect(chans[0]!.value).toEqual(["a", "", "thirty-nine characters, the CA maximum"]);
    expect(chans[1]!.value).toEqual([]);
    expect(chans[2]!.metadata.choices).toHaveLength(16);
    expect(chans[3]!.metadata.type).toBe("int64");
  });

  it("puts a string array and a 64-bit array; the stream follows", async () => {
    const sub = client.subscribe(["pva://AT:AAO:STRING", "ca://AT:AAO:STRING", "pva://AT:AAO:INT64"], () => undefined);
    await sub.ready;
    await until(() => sub.channels.every((c) => c.connection === CONNECTED), 20_000, "connected");
    // One record seen over both protocols: each put shows on both channels.
    await client.put("pva://AT:AAO:STRING", ["ts", "", "put"], { wait: true });
    await until(() => sub.channels.slice(0, 2).every((c) => JSON.stringify(c.value) === JSON.stringify(["ts", "", "put"])), 30_000, "string array over both");
    await client.put("ca://AT:AAO:STRING", ["one"], { wait: true });
    await until(() => sub.channels.slice(0, 2).every((c) => JSON.stringify(c.value) === JSON.stringify(["one"])), 30_000, "string array of one over both");
    await client.put("pva://AT:AAO:INT64", [-5, 6], { wait: true });
    await until(() => same(new BigInt64Array([-5n, 6n]), sub.channels[2]!.value), 30_000, "int64 array");
    sub.unsubscribe();
  });
});
