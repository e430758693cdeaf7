"""Reading a history, one way for scalar and array channels: `query` (GraphQL `history`) and
`backfill` (a subscription's past, PROTOCOL.md section 2.8) choose between the raw ring and the
tiers by the same rules, whatever a row holds."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ...wire.codec import GapKind
from .layout import GAP_ALARM
from .slices import BucketRows, HistorySlice, RawRows
from .tiers import Buckets, tier_for

__all__ = ["Held", "backfill", "backfills_from", "oldest", "query", "take"]


class Held(Protocol):
    """A channel's rings as the readers see them (`ChannelHistory`, `ArrayHistory`)."""

    first: int  # ns of the first point ever recorded
    wrapped: bool  # the raw ring is full: older points are gone

    @property
    def tier(self) -> Buckets:
        """The finest tier; the coarser ones hang from it by `next`."""

    def raw(self) -> RawRows:
        """The raw ring, oldest first."""


def query(held: Held, since: int, until: int, max_points: int) -> HistorySlice:
    """Rows with since <= t <= until (ns): the raw points if they reach back to `since` and are
    at most `max_points`, else the finest tier that does; if none fits, the coarsest, its
    newest `max_points` buckets."""
    raw = held.raw()
    whole = not held.wrapped  # nothing dropped yet: it reaches back to the start
    sel = raw[(raw.t >= since) & (raw.t <= until)]
    if len(sel) <= max_points and (whole or (len(raw) and raw.t[0] <= since)):
        return sel.slice(held.first if whole or not len(raw) else int(raw.t[0]), False)

    def overlapping(tier: Buckets, rows: BucketRows) -> BucketRows:
        # A bucket overlaps [since, until] if it ends after since and starts before until.
        return rows[(rows.t + tier.width > since) & (rows.t <= until)]

    tier, picked = tier_for(held.tier, since, overlapping, max_points)
    truncated = len(picked) > max_points
    if truncated:
        picked = picked[len(picked) - max_points :]
    oldest = int(tier.rows([]).t[0]) if tier.wrapped else held.first
    return picked.slice(tier.width, truncated, oldest)


def backfill(held: Held, since: int, limit: int | None) -> list[HistorySlice]:
    """One or two slices, oldest first: buckets of the finest tier that reaches back to `since`,
    whole buckets only, ending at or before the raw ring's first point, when the ring does not
    reach back that far; then the raw points from `since` on. `limit`: the oldest `limit` rows
    of these only (`take`); the last slice's `truncated` then says that more rows follow.

    The seam: the bucket that holds the ring's first point also holds updates before it that
    the ring no longer has. Its min, max and last cannot be split at that point, and sent whole
    it would hold again the points that follow it (and, open, the current value): so the points
    start with a gap row (GapKind.SEAM) where those updates start, and a plot breaks there
    rather than draw a line through what no row holds. It comes with a point at least, so the
    next call (from after the last row sent) starts past it.

    The join with the snapshot: the newest raw point, unless it is a gap, is the channel's
    current value (the channel records every update where it stores it, and the snapshot is
    taken in the same call, with no update in between), so it is left out: the snapshot carries
    it. Nothing between: every older update is in the points."""
    held_raw = raw = held.raw()
    if len(raw) and not raw.gap[-1]:
        raw = raw[:-1]
    out: list[HistorySlice] = []
    seam: HistorySlice | None = None
    if held.wrapped and len(raw) and raw.t[0] > since:
        tier, rows = tier_for(held.tier, since)
        first = int(raw.t[0])
        end = rows.t + tier.width
        whole = rows[(end > since) & (end <= first)]
        cut = len(whole) if limit is None else take(whole.t, limit)
        if cut:
            out.append(whole[:cut].slice(tier.width, cut < len(whole), held.first))
            if cut < len(whole):
                return out
            limit = None if limit is None else limit - cut
        start = _unkept_from(tier.width, rows, held_raw, first)
        if start is not None:
            shape = held_raw.ring.shape[1:]
            seam = HistorySlice.gap_row(max(start, since), shape, GapKind.SEAM, held.first)
            limit = None if limit is None else max(limit - 1, 1)
    points = raw[raw.t >= since]
    cut = len(points) if limit is None else take(points.t, limit) if limit > 0 else 0
    if cut:
        rows_sent = points[:cut].slice(held.first, cut < len(points))
        out.append(rows_sent if seam is None else seam.then(rows_sent))
    elif len(points):
        out[-1] = dataclasses.replace(out[-1], truncated=True)
    return out


def _unkept_from(width: int, rows: BucketRows, raw: RawRows, first: int) -> int | None:
    """Where the updates in no row start, at the seam of buckets of `width` (`rows`) and the
    raw ring `raw` whose first point kept is at `first`: the start of the bucket holding that
    point, if it counts more updates than the ring holds of it; else None."""
    holding = rows[(rows.t <= first) & (rows.t + width > first)]
    if not len(holding):
        return None
    start = int(holding.t[0])
    kept = int(np.count_nonzero(~raw.gap & (raw.t >= start) & (raw.t < start + width)))
    return start if int(holding.count[0]) > kept else None


def backfills_from(
    t: npt.NDArray[np.int64], a: npt.NDArray[np.uint16], i: int, n: int, since: int
) -> bool:
    """Whether `backfill` from `since` has a row to give, in O(1) whatever the ring holds: of a
    ring of `n` points whose next goes at `i`, the newest one it keeps (the newest point, if a
    gap, else the one before: `backfill` leaves the current value out) is at or after `since`.
    Its tier rows need such a point too: they end at or before the oldest point kept, after
    `since`. Times are taken to grow in the order points came, so that point is the latest."""
    if not n:
        return False
    last = (i - 1) % len(t)
    if a.item(last) != GAP_ALARM:  # (`item`: a Python int, without a numpy scalar)
        if n < 2:
            return False
        last = (last - 1) % len(t)
    return bool(t.item(last) >= since)


def take(t: npt.NDArray[np.int64], n: int) -> int:
    """How many of the rows at times `t` (oldest first) one message takes, about `n`: never
    rows of one time in two messages, as the next message starts after the last time sent
    (a backfill's cursor is a time: core/backfill.py). At least one row when there is one."""
    n = max(n, 1)
    if n >= len(t):
        return len(t)
    last = t[n - 1]
    if t[n] != last:
        return n
    j = n - 1
    while j > 0 and t[j - 1] == last:
        j -= 1
    if j > 0:
        return j
    k = n
    while k < len(t) and t[k] == last:
        k += 1
    return k


def oldest(held: Held) -> tuple[int, int]:
    """(ns, resolution) of the oldest data `held` keeps: its first point, as points while the
    raw ring has dropped none, else as the finest tier still holding everything since it;
    else the coarsest tier's oldest bucket; (0, 0) while it holds nothing. What is older is
    the archive's (core/archive/); the readers above answer from that resolution there."""
    if not held.wrapped:
        return held.first, 0
    tier: Buckets | None = held.tier
    last = held.tier
    while tier is not None:
        if not tier.wrapped:
            return held.first, tier.width
        last, tier = tier, tier.next
    return int(last.rows([]).t[0]), last.width
