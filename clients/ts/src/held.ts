/**
 * What a subscription with `backfill` holds of its channels' past (PROTOCOL.md section 2.8),
 * without I/O: which rows of a HISTORY it lacks, and the `since` of its next ATTACH.
 *
 * Per channel: `newest`, the latest time (ns) the client has, from HISTORY rows and entries; and
 * its *holes*, spans [lo, hi) it lacks though it has later rows. A hole opens where a slow
 * backfill left rows out: from that channel's gap row of status 1 (*left out*) to its snapshot
 * entry's time. The next ATTACH's `since` for the channel is then just before its oldest hole,
 * so the server sends the rows from there on; of those, the client keeps the rows in a hole and
 * the rows later than `newest`, and drops the ones it has (those between the snapshot and
 * `newest`). A row kept in a hole shrinks it; a backfill that ends without leaving that channel
 * out closes its holes (it sent every row from `since` on). The Python client's held.py is the
 * same machine.
 */

/** A gap row's status: the backfill left out this channel's rows from here on. */
export const LEFT_OUT = 1;
/** Holes kept per channel: a backfill cut short again while it filled one adds at most one
 * more; beyond this many, the oldest is given up (its rows are not asked for again). */
export const MAX_HOLES = 4;

export class Held {
  readonly newest: bigint[];
  holes: [bigint, bigint][][];
  /** `newest` when the attachment was made. */
  private before: bigint[];
  /** Its left-out gap row's time, if any. */
  private cut: (bigint | undefined)[];

  constructor(count: number) {
    this.newest = new Array<bigint>(count).fill(0n);
    this.holes = Array.from({ length: count }, () => []);
    this.before = new Array<bigint>(count).fill(0n);
    this.cut = new Array<bigint | undefined>(count).fill(undefined);
  }

  get length(): number {
    return this.newest.length;
  }

  /** A new attachment: its backfill starts from what is held now. */
  attached(): void {
    this.before = [...this.newest];
    this.cut = new Array<bigint | undefined>(this.newest.length).fill(undefined);
  }

  /** The ATTACH's `since`: per channel, the time after which the client lacks rows (0n: it has
   * none); undefined when it has no row of any channel. */
  since(): bigint[] | undefined {
    const since = this.holes.map((h, sid) => (h.length > 0 ? h[0]![0] - 1n : this.newest[sid]!));
    return since.some((t) => t > 0n) ? since : undefined;
  }

  /** One HISTORY of channel `sid` (its rows' times, gap flags and statuses): the runs
   * [start, stop) of its rows the client lacks, in order. */
  history(sid: number, t: BigInt64Array, gap: Uint8Array, status: Uint16Array, resolution: number): [number, number][] {
    const newest = this.newest[sid]!;
    const holes = this.holes[sid]!;
    const reached = new Array<bigint>(holes.length).fill(-1n); // per hole: the latest time kept in it
    const runs: [number, number][] = [];
    let start: number | undefined;
    for (let i = 0; i < t.length; i++) {
      const ti = t[i]!;
      // A left-out row brings nothing of its time on: the rows left out start there.
      const leftOut = gap[i] === 1 && status[i] === LEFT_OUT;
      if (leftOut) this.cut[sid] = ti;
      let lacked = ti > newest;
      holes.forEach(([lo, hi], k) => {
        if (lo <= ti && ti < hi) {
          lacked = true;
          if (!leftOut) reached[k] = ti;
        }
      });
      if (lacked && start === undefined) start = i;
      else if (!lacked && start !== undefined) {
        runs.push([start, i]);
        start = undefined;
      }
      if (ti > this.newest[sid]!) this.newest[sid] = ti;
    }
    if (start !== undefined) runs.push([start, t.length]);
    const step = BigInt(Math.max(resolution, 1)); // a bucket at t covers [t, t + resolution)
    reached.forEach((last, k) => {
      if (last >= 0n && last + step > holes[k]![0]) holes[k]![0] = last + step;
    });
    this.holes[sid] = holes.filter((h) => h[0] < h[1]);
    return runs;
  }

  /** An entry of channel `sid` with this time (ns). */
  entry(sid: number, t: bigint): void {
    if (t > this.newest[sid]!) this.newest[sid] = t;
  }

  /** The attachment's snapshot entry of channel `sid`, with its time (undefined: it has none).
   * Its backfill is over: if it left the channel's rows out from some time on, what the client
   * did not have of them before is a hole; the rest of its holes are filled. */
  snapshot(sid: number, t: bigint | undefined): void {
    const cut = this.cut[sid];
    if (cut === undefined) {
      this.holes[sid] = [];
      return;
    }
    const holes: [bigint, bigint][] = [];
    for (const [lo, hi] of this.holes[sid]!) {
      const from = lo > cut ? lo : cut;
      if (from < hi) holes.push([from, hi]);
    }
    const after = this.before[sid]! + 1n;
    const from = cut > after ? cut : after;
    if (t !== undefined && from < t) holes.push([from, t]);
    this.holes[sid] = holes.slice(-MAX_HOLES);
  }
}
