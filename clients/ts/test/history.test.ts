// Backfill against the real server and demo IOC: a subscription with `backfill` gets the
// channel's recorded past (onHistory) before its first state, and the first state is the step
// after the last past row (PROTOCOL.md section 2.8).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { decodeServerMessage, NdArray, PvwireClient, rowsAfter, type History, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

/** A scalar channel's column (an array channel's would be an NdArray). */
function scalars(column: Float64Array | NdArray): Float64Array {
  if (column instanceof NdArray) throw new Error("an array channel's rows, not numbers");
  return column;
}

const skip = stackUnavailable();
if (skip) throw new Error(`integration tests cannot run: ${skip}`);

describe("backfill", () => {
  let stack: Stack;
  let client: PvwireClient;

  beforeAll(async () => {
    stack = await startStack();
    client = new PvwireClient(stack.url, { WebSocket: WebSocket as unknown as WebSocketConstructor });
  });
  afterAll(async () => {
    client?.close();
    await stack?.stop();
  });

  it("delivers the past, then live values that continue it with no gap or duplicate", async () => {
    // The 1 Hz counter: the 10 Hz one lost a step upstream of the server on a busy machine
    // (two updates of a channel before the event loop ran libca's callback are one update,
    // counted in the serial but not recorded), and then the past had a hole of its own.
    const id = `ca://${stack.prefix}COUNTER_1HZ`;
    const kept: number[] = [];
    const keeper = client.subscribe([id], (st) => { if (typeof st.value === "number") kept.push(st.value); });
    await until(() => kept.length > 8, 60_000, "8 counter updates recorded");
    const past: History[] = [];
    const live: { value: unknown; serial: number | undefined }[] = [];
    const sub = client.subscribe([id], (st) => live.push({ value: st.value, serial: st.serial }), {
      backfill: 60,
      onHistory: (sid, h) => {
        expect(sid).toBe(0);
        expect(live).toHaveLength(0); // the past comes before the first state
        past.push(h);
      },
    });
    await sub.ready;
    await until(() => live.length >= 2, 60_000, "live updates");
    sub.unsubscribe();
    keeper.unsubscribe();
    const points = past[past.length - 1]!;
    expect(points.resolution).toBe(0);
    const values = Array.from(scalars(points.value));
    expect(values.length).toBeGreaterThanOrEqual(8);
    values.forEach((v, i) => expect(v).toBe(values[0]! + i)); // every step
    const ts = Array.from(points.t);
    ts.slice(1).forEach((t, i) => expect(t > ts[i]!).toBe(true));
    expect(live[0]!.value).toBe(values[values.length - 1]! + 1); // the join
  });

  it("keeps only the rows newer than what a reader has", () => {
    const h: History = {
      kind: "HISTORY", att: 1, sid: 0, resolution: 0,
      t: new BigInt64Array([10n, 20n, 30n]), value: new Float64Array([1, 2, 3]),
      min: new Float64Array([1, 2, 3]), max: new Float64Array([1, 2, 3]),
      severity: new Uint8Array(3), status: new Uint16Array(3), gap: new Uint8Array(3),
    };
    expect(rowsAfter(h, 0n)).toBe(h);
    expect(Array.from(scalars(rowsAfter(h, 20n)!.value))).toEqual([3]);
    expect(rowsAfter(h, 30n)).toBeNull();
  });

  it("decodes an array channel's rows as [rows, elements] and keeps the newer ones", () => {
    const bin = readFileSync(join(import.meta.dirname, "../../../protocol/vectors/history_array.bin"));
    const h = decodeServerMessage(new Uint8Array(bin)) as History;
    expect(h.kind).toBe("HISTORY");
    for (const column of [h.value, h.min, h.max]) {
      expect(column).toBeInstanceOf(NdArray);
      expect((column as NdArray).dims).toEqual([3, 3]);
    }
    const t = h.t;
    const newer = rowsAfter(h, t[0]!)!;
    const value = newer.value as NdArray;
    expect(value.dims).toEqual([2, 3]);
    expect(Array.from(value.data as Float64Array).slice(0, 3)).toEqual([1.5, 2.5, -3.5]);
    expect(value.data.buffer).toBe((h.value as NdArray).data.buffer); // a view, not a copy
    expect(Array.from(newer.gap)).toEqual([0, 1]);
  });

  it("refuses an array HISTORY whose value, min and max differ in dims", () => {
    const bin = readFileSync(join(import.meta.dirname, "../../../protocol/vectors/reject_history_array_dims.bin"));
    expect(() => decodeServerMessage(new Uint8Array(bin))).toThrow(/same dims/);
  });
});
