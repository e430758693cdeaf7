/**
 * A channel's recorded past (HISTORY, PROTOCOL.md section 2.8), for subscriptions made with
 * `backfill`. Pure: the decoded message in, the rows a reader does not have yet out. The channel
 * states, their serials and conflation counts are never touched by it.
 */
import type { Timestamp } from "./channel.js";
import { NdArray } from "./ndarray.js";
import type { History } from "./protocol.js";

const NS = 1_000_000_000n;

/** A timestamp in ns since the POSIX epoch, as HISTORY's `t` column holds them. */
export function timeNs(time: Timestamp): bigint {
  return BigInt(time.seconds) * NS + BigInt(time.nanoseconds);
}

/**
 * The rows of `history` later than `afterNs`, or null when there are none: a reader keeps only
 * what is newer than what it has (section 2.8; the session does this for a subscription with
 * `backfill`, holes included: held.ts). The columns are views of the received message
 * (subarray, no copy).
 */
export function rowsAfter(history: History, afterNs: bigint): History | null {
  const t = history.t;
  let first = 0;
  while (first < t.length && t[first]! <= afterNs) first++;
  return first === t.length ? null : rowsBetween(history, first, t.length);
}

/** Rows [start, stop) of `history`, as one message's: views of its columns, no copy. */
export function rowsBetween(history: History, start: number, stop: number): History {
  if (start === 0 && stop === history.t.length) return history;
  return {
    ...history,
    t: history.t.subarray(start, stop),
    value: rowsOf(history.value, start, stop),
    min: rowsOf(history.min, start, stop),
    max: rowsOf(history.max, start, stop),
    severity: history.severity.subarray(start, stop),
    status: history.status.subarray(start, stop),
    gap: history.gap.subarray(start, stop),
  };
}

/** Rows [start, stop) of a value column: a subarray, or an array channel's NdArray of those
 * rows (a view, no copy). */
function rowsOf(column: Float64Array | NdArray, start: number, stop: number): Float64Array | NdArray {
  if (!(column instanceof NdArray)) return column.subarray(start, stop);
  const elements = column.dims[1]!;
  return new NdArray(column.dtype, [stop - start, elements], column.data.subarray(start * elements, stop * elements));
}
