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
 * The rows of `history` later than `afterNs`, or null when there are none: a re-attach after a
 * reconnect may send rows the reader has (a server without `since`, a bucket that straddles
 * it), and a reader keeps only what is newer than what it has (section 2.8). The columns are views of the received message (subarray, no copy).
 */
export function rowsAfter(history: History, afterNs: bigint): History | null {
  const t = history.t;
  let first = 0;
  while (first < t.length && t[first]! <= afterNs) first++;
  if (first === t.length) return null;
  if (first === 0) return history;
  return {
    ...history,
    t: t.subarray(first),
    value: rowsFrom(history.value, first),
    min: rowsFrom(history.min, first),
    max: rowsFrom(history.max, first),
    severity: history.severity.subarray(first),
    status: history.status.subarray(first),
    gap: history.gap.subarray(first),
  };
}

/** The rows of a value column from `first` on: a subarray, or an array channel's NdArray of the
 * rows [first, rows) (a view, no copy). */
function rowsFrom(column: Float64Array | NdArray, first: number): Float64Array | NdArray {
  if (!(column instanceof NdArray)) return column.subarray(first);
  const [rows, elements] = column.dims as [number, number];
  return new NdArray(column.dtype, [rows - first, elements], column.data.subarray(first * elements));
}
