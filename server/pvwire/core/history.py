"""Recent history of monitored channels, so a plot opens full (DESIGN.md section 7c).

Per channel, fixed-size round-robin buffers, allocated once when the channel gets its history:
- the raw ring: the last `RAW_POINTS` updates as they came (IOC time in ns, value, severity and
  status, or a gap mark), about 100 s of a 10 Hz channel;
- tiers of buckets (`TIERS`: 10 s for an hour, 5 min for a day), each bucket the min, max, sum
  (mean = sum / count), last value, count, highest severity and a gap flag of its span. Each
  tier's open bucket is kept in plain attributes and written to its ring when it closes; a
  closed bucket is merged into the next tier's open bucket.

Recording is a ring write per update: three item writes, O(1), nothing allocated.
`ChannelHistory.record` checks the value's type first; `Channel.on_update` writes values of the
type already checked itself (`ChannelHistory.kind`), without a call. Every AGGREGATE_EVERY
updates (and before any read) the new points are folded into the finest tier at once,
vectorised: one merge per bucket they touch, not per update. Times are the IOC's; a gap
(the channel disconnected or stopped being monitored) is a point of its own with the server's
clock, as the IOC cannot tell when it went away.

The budget (`HistoryStore`): every channel's buffers cost the same, `CHANNEL_BYTES`, and the
store holds at most `budget // CHANNEL_BYTES` of them. When it is full:
1. the history of the channel that stopped being monitored longest ago is reclaimed (nobody
   watches it and its data only gets older);
2. if every history in the store belongs to a monitored channel, the new channel gets none, and
   `refused` counts it: taking history away from a channel someone is watching would break a
   plot on screen, while a new channel without history still streams as before.
A channel released after the linger keeps its history (ended by a gap) while the budget allows,
and continues it if it is monitored again.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import PvwireError

__all__ = [
    "CHANNEL_BYTES",
    "FOLD_MASK",
    "NS",
    "RAW_POINTS",
    "TIERS",
    "ChannelHistory",
    "HistorySlice",
    "HistoryStats",
    "HistoryStore",
    "NoHistory",
]

log = logging.getLogger("pvwire.history")

NS = 1_000_000_000
RAW_POINTS = 1024  # ~100 s of a 10 Hz channel, ~17 min of a 1 Hz one
# (bucket width in ns, buckets): 10 s for an hour, 5 min for a day.
TIERS: tuple[tuple[int, int], ...] = ((10 * NS, 360), (300 * NS, 288))

# What reading the raw ring gives (`points`); it is held as three columns (ChannelHistory).
RAW_DTYPE = np.dtype([("t", "<i8"), ("v", "<f8"), ("sev", "u1"), ("stat", "u1"), ("gap", "?")])
RAW_ITEM_BYTES = 8 + 8 + 2  # time, value, alarm
GAP_ALARM = 0xFFFF  # the alarm column's mark of a gap
# Updates are folded into the tiers this many at a time (and before any read): a ring write
# per update, and the bucketing vectorised.
# 512 (half the ring, so no pending point is overwritten): the bucketing's share is ~55 ns per
# update here against ~90 at 256 and ~200 at 64, its numpy calls amortised.
AGGREGATE_EVERY = RAW_POINTS // 2
# The writer folds when the index it just advanced to is a multiple of AGGREGATE_EVERY.
FOLD_MASK = AGGREGATE_EVERY - 1
assert RAW_POINTS % AGGREGATE_EVERY == 0 and not AGGREGATE_EVERY & FOLD_MASK  # powers of two
BUCKET_DTYPE = np.dtype(
    [("t", "<i8"), ("min", "<f8"), ("max", "<f8"), ("sum", "<f8"), ("last", "<f8"),
     ("count", "<u4"), ("sev", "u1"), ("gap", "u1")]
)  # fmt: skip
CHANNEL_BYTES = RAW_POINTS * RAW_ITEM_BYTES + sum(size * BUCKET_DTYPE.itemsize for _, size in TIERS)

INVALID = 3  # the severity a gap carries: EPICS shows a disconnected channel INVALID
_NUMBERS = (int, float, bool)
_LAST = RAW_POINTS - 1


class Tier:
    """One ring of buckets, with its open bucket in plain attributes."""

    __slots__ = ("count", "data", "gap", "key", "last", "max", "min", "n", "next", "sev", "sum",
                 "width")  # fmt: skip

    def __init__(self, width: int, size: int, following: Tier | None) -> None:
        self.width = width
        self.data = np.zeros(size, BUCKET_DTYPE)
        self.n = 0  # buckets closed into `data` so far; the next goes to n % size
        self.next = following
        self.key = -1  # t // width of the open bucket; -1: none open
        self.min = self.max = self.sum = self.last = math.nan
        self.count = self.sev = self.gap = 0

    def add_bucket(
        self, t: int, mn: float, mx: float, s: float, last: float, count: int, sev: int, gap: int
    ) -> None:
        """Merge a closed bucket of the tier before (whose start is `t`)."""
        key = t // self.width
        if key > self.key:
            if self.key >= 0:
                self._close()
            self.key = key
            self.min, self.max, self.sum, self.last = mn, mx, s, last
            self.count, self.sev, self.gap = count, sev, gap
            return
        if count:
            if self.count:
                self.min = min(self.min, mn)
                self.max = max(self.max, mx)
                self.sum += s
            else:
                self.min, self.max, self.sum = mn, mx, s
            self.last = last
            self.count += count
        self.sev = max(self.sev, sev)
        self.gap |= gap

    def add_gap(self, t: int) -> None:
        key = t // self.width
        if key > self.key:
            if self.key >= 0:
                self._close()
            self.key = key
            self.min = self.max = self.sum = self.last = math.nan
            self.count, self.sev = 0, INVALID
        self.gap = 1

    def _close(self) -> None:
        start = self.key * self.width
        row = (start, self.min, self.max, self.sum, self.last, self.count, self.sev, self.gap)
        self.data[self.n % len(self.data)] = row
        self.n += 1
        if self.next is not None:
            self.next.add_bucket(*row)

    def open_row(self) -> tuple[int, float, float, float, float, int, int, int] | None:
        if self.key < 0:
            return None
        return (self.key * self.width, self.min, self.max, self.sum, self.last, self.count,
                self.sev, self.gap)  # fmt: skip

    def rows(self, finer: list[Tier]) -> npt.NDArray[Any]:
        """Every bucket held, oldest first, the open one last (a copy). `finer`: the tiers before
        this one, coarsest first, whose open buckets are not merged into this one yet."""
        size = len(self.data)
        if self.n <= size:
            closed = self.data[: self.n]
        else:
            i = self.n % size
            closed = np.concatenate((self.data[i:], self.data[:i]))
        # The open buckets, merged on a scratch tier as they will be when they close.
        scratch = Tier(self.width, len(finer) + 1, None)
        for tier in (self, *finer):
            row = tier.open_row()
            if row is not None:
                scratch.add_bucket(*row)
        tail = scratch.data[: scratch.n]
        row = scratch.open_row()
        if row is not None:
            tail = np.concatenate((tail, np.array([row], BUCKET_DTYPE)))
        return np.concatenate((closed, tail))

    @property
    def wrapped(self) -> bool:
        return self.n >= len(self.data)


@dataclass(frozen=True, slots=True)
class HistorySlice:
    """What `ChannelHistory.query` returns: points or buckets, oldest first, as columns.

    For points (`resolution` 0) min = max = mean = value and count = 1. A gap is a row of its own
    with `gap` set and value NaN (buckets: `gap` set if the channel was away in that span)."""

    resolution: int  # ns per bucket; 0: every update as it came
    t: npt.NDArray[np.int64]  # IOC time of the point, or the bucket's start, in ns
    value: npt.NDArray[np.float64]  # the point, or a bucket's last value
    min: npt.NDArray[np.float64]
    max: npt.NDArray[np.float64]
    mean: npt.NDArray[np.float64]
    count: npt.NDArray[np.int64]
    severity: npt.NDArray[np.int64]  # highest in the bucket
    status: npt.NDArray[np.int64]  # points only (buckets: 0)
    gap: npt.NDArray[np.bool_]
    truncated: bool  # more rows matched than the limit: the newest were kept
    since: int  # ns: the oldest time this answer could hold (older data is gone)

    def __len__(self) -> int:
        return len(self.t)


class ChannelHistory:
    """One channel's buffers. `record` and `mark_gap` are called by its Channel."""

    __slots__ = ("_a", "_t", "_v", "attached", "channel_id", "failed", "first", "folded", "i",
                 "kind", "numeric", "pinned", "ring_a", "ring_t", "ring_v", "tier",
                 "wrapped")  # fmt: skip

    def __init__(self, channel_id: str) -> None:
        self.channel_id = channel_id
        # The raw ring as three columns: IOC time (ns), value, and alarm (severity << 8 |
        # status; GAP_ALARM for a gap). Written through memoryviews (`ring_*`): ~45 ns an item
        # against ~80 ns through numpy's item assignment and ~200 ns for a structured row
        # (measured here), nothing is allocated, and a "d" view refuses anything but a number
        # (a string, an array, None) with a TypeError.
        self._t = np.zeros(RAW_POINTS, "<i8")
        self._v = np.zeros(RAW_POINTS, "<f8")
        self._a = np.zeros(RAW_POINTS, "<u2")
        # (typed Any: typeshed's memoryview takes ints only, a "d" view takes floats too)
        self.ring_t: Any = self._t.data
        self.ring_v: Any = self._v.data
        self.ring_a: Any = self._a.data
        self.i = 0  # where the next point goes
        self.folded = 0  # points before `i` from here on are not in the tiers yet
        self.wrapped = False  # the ring is full: the oldest point is at `i`
        # The type of the values `record` last accepted: `Channel.on_update` writes a value of
        # this type into the ring itself. None until a number came (and after a non-number).
        self.kind: type | None = None
        following: Tier | None = None
        for width, size in reversed(TIERS):
            following = Tier(width, size, following)
        assert following is not None
        self.tier = following  # the finest; the others hang from it by `next`
        self.first = 0  # ns of the first point ever recorded
        self.numeric = True  # False once a value was not a number (strings, arrays)
        self.attached = True  # its channel is monitored
        self.pinned = False  # --history-channels: never reclaimed
        self.failed = False  # recording raised: no longer recorded nor handed out

    def record(
        self, value: object, seconds: int, nanoseconds: int, severity: int, status: int
    ) -> None:
        """One update, its type checked: a number is written, anything else is not kept.

        `Channel.on_update` calls this for the first value and whenever the type changes, and
        writes values of `kind` with the same lines itself: the call and its checks were about
        half of what recording cost (bench/history.py, 2026-11-24, load 6.5, two runs each:
        recording added 0.61-0.75 us to on_update through this call, 0.31-0.44 us inline). Keep
        the two alike; tests/test_history.py checks they record the same."""
        kind = type(value)
        if not (kind in _NUMBERS or issubclass(kind, np.number | np.bool_)):
            self.kind = None
            self.numeric = False  # strings and arrays are not kept (yet)
            return
        self.kind = kind
        i = self.i
        self.ring_v[i] = value
        self.ring_t[i] = seconds * NS + nanoseconds
        # A severity out of range raises here: the channel's failure path stops this history.
        self.ring_a[i] = severity << 8 | status & 0xFF
        self.i = i = i + 1
        if not i & FOLD_MASK:
            self.fold()

    def fold(self) -> None:
        """Called by the writer when `i` reached a multiple of AGGREGATE_EVERY: the pending
        points go into the tiers, and at the ring's end the next point goes to its start."""
        self._aggregate()
        if self.i == RAW_POINTS:
            self.i = self.folded = 0
            self.wrapped = True

    def mark_gap(self) -> None:
        """The channel went away (disconnected, or no longer monitored): the line breaks here.

        Stamped with the server's clock, never before the last point (IOC clocks can be ahead)."""
        if not self.n or self._a[self.i - 1] == GAP_ALARM:  # none yet, or one per absence
            return
        self._aggregate()
        t = max(time.time_ns(), int(self._t[self.i - 1]) + 1)
        i = self.i
        self._t[i], self._v[i], self._a[i] = t, math.nan, GAP_ALARM
        if i < _LAST:
            self.i = self.folded = i + 1  # the gap goes to the tiers here, not by `_aggregate`
        else:
            self.i = self.folded = 0
            self.wrapped = True
        self.tier.add_gap(t)

    @property
    def n(self) -> int:
        """Points held in the raw ring."""
        return RAW_POINTS if self.wrapped else self.i

    def _aggregate(self) -> None:
        """Fold the pending points into the finest tier: one merge per bucket they touch."""
        i = self.i
        k = i - self.folded if i >= self.folded else i + RAW_POINTS - self.folded
        if not k:
            return
        self.folded = i
        idx = np.arange(i - k, i) % RAW_POINTS  # oldest first, across the ring's end
        t, v, a = self._t[idx], self._v[idx], self._a[idx]
        if not self.first:
            self.first = int(t[0])
        tier = self.tier
        keys = t // tier.width
        cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [k]))
        low = np.minimum.reduceat(v, starts)
        high = np.maximum.reduceat(v, starts)
        total = np.add.reduceat(v, starts)
        sev = np.maximum.reduceat(a >> 8, starts)
        for j, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            tier.add_bucket(int(keys[s]) * tier.width, float(low[j]), float(high[j]),
                            float(total[j]), float(v[e - 1]), e - s, int(sev[j]), 0)  # fmt: skip

    # --- reading ------------------------------------------------------------------------------

    def points(self) -> npt.NDArray[Any]:
        """The raw ring, oldest first, as RAW_DTYPE rows (a copy)."""
        n = self.n
        idx = np.arange(self.i - n, self.i) % RAW_POINTS
        a = self._a[idx]
        gap = a == GAP_ALARM
        out = np.empty(n, RAW_DTYPE)
        out["t"] = self._t[idx]
        out["v"] = self._v[idx]
        out["sev"] = np.where(gap, INVALID, a >> 8)
        out["stat"] = np.where(gap, 0, a & 0xFF)
        out["gap"] = gap
        return out

    def query(self, since: int, until: int, max_points: int) -> HistorySlice:
        """Rows with since <= t <= until (ns): the raw points if they reach back to `since` and
        are at most `max_points`, else the finest tier that does; if none fits, the coarsest,
        its newest `max_points` buckets."""
        self._aggregate()
        raw = self.points()
        raw_whole = not self.wrapped  # nothing dropped yet: it reaches back to the start
        sel = raw[(raw["t"] >= since) & (raw["t"] <= until)]
        if len(sel) <= max_points and (raw_whole or (len(raw) and raw["t"][0] <= since)):
            return _points(sel, self._oldest(raw, raw_whole), False)
        tier: Tier | None = self.tier
        chosen: tuple[Tier, npt.NDArray[Any]] | None = None
        finer: list[Tier] = []
        while tier is not None:
            rows = tier.rows(finer)
            finer.insert(0, tier)
            # A bucket overlaps [since, until] if it ends after since and starts before until.
            picked = rows[(rows["t"] + tier.width > since) & (rows["t"] <= until)]
            chosen = (tier, picked)
            reaches = not tier.wrapped or (len(rows) and rows["t"][0] <= since)
            if len(picked) <= max_points and reaches:
                break
            tier = tier.next
        assert chosen is not None
        tier_used, picked = chosen
        truncated = len(picked) > max_points
        if truncated:
            picked = picked[len(picked) - max_points :]
        oldest = self.first
        if tier_used.wrapped:
            oldest = int(tier_used.rows([])["t"][0])
        return _buckets(picked, tier_used.width, truncated, oldest)

    def backfill(self, since: int) -> list[HistorySlice]:
        """What a subscription's `backfill` sends before its snapshot (PROTOCOL.md section 2.8):
        one or two slices, oldest first. Buckets of the finest tier that reaches back to `since`,
        whole buckets only, ending at or before the raw ring's first point, when the ring does
        not reach back that far; then the raw points from `since` on.

        The join with the snapshot: the newest raw point, unless it is a gap, is the channel's
        current value (the channel records every update where it stores it, and the snapshot
        is taken in the same call, with no update in between), so it is left out: the snapshot
        carries it. Nothing between: every older update is in the points."""
        self._aggregate()
        raw = self.points()
        if len(raw) and not raw["gap"][-1]:
            raw = raw[:-1]
        out = []
        if self.wrapped and len(raw) and raw["t"][0] > since:
            first = int(raw["t"][0])
            tier: Tier | None = self.tier
            finer: list[Tier] = []
            chosen: tuple[Tier, npt.NDArray[Any]] | None = None
            while tier is not None:
                rows = tier.rows(finer)
                finer.insert(0, tier)
                chosen = (tier, rows)
                if not tier.wrapped or (len(rows) and rows["t"][0] <= since):
                    break
                tier = tier.next
            assert chosen is not None
            tier_used, rows = chosen
            end = rows["t"] + tier_used.width
            rows = rows[(end > since) & (end <= first)]
            if len(rows):
                out.append(_buckets(rows, tier_used.width, False, self.first))
        points = raw[raw["t"] >= since]
        if len(points):
            out.append(_points(points, self.first, False))
        return out

    def _oldest(self, raw: npt.NDArray[Any], whole: bool) -> int:
        if whole or not len(raw):
            return self.first
        return int(raw["t"][0])


def _points(sel: npt.NDArray[Any], oldest: int, truncated: bool) -> HistorySlice:
    v = sel["v"].astype(np.float64)
    return HistorySlice(
        resolution=0,
        t=sel["t"].astype(np.int64),
        value=v,
        min=v,
        max=v,
        mean=v,
        count=np.where(sel["gap"] != 0, 0, 1).astype(np.int64),
        severity=sel["sev"].astype(np.int64),
        status=sel["stat"].astype(np.int64),
        gap=sel["gap"] != 0,
        truncated=truncated,
        since=oldest,
    )


def _buckets(rows: npt.NDArray[Any], width: int, truncated: bool, oldest: int) -> HistorySlice:
    count = rows["count"].astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, rows["sum"] / np.maximum(count, 1), np.nan)
    return HistorySlice(
        resolution=width,
        t=rows["t"].astype(np.int64),
        value=rows["last"].astype(np.float64),
        min=rows["min"].astype(np.float64),
        max=rows["max"].astype(np.float64),
        mean=mean.astype(np.float64),
        count=count,
        severity=rows["sev"].astype(np.int64),
        status=np.zeros(len(rows), np.int64),
        gap=rows["gap"] != 0,
        truncated=truncated,
        since=oldest,
    )


class NoHistory(PvwireError):
    code = "NO_HISTORY"


@dataclass(frozen=True, slots=True)
class HistoryStats:
    budget_bytes: int
    used_bytes: int
    channels: int  # histories held
    monitored: int  # of which their channel is monitored now
    refused: int  # channels that got no history: the budget was full of monitored channels
    reclaimed: int  # histories of unmonitored channels dropped to make room


class HistoryStore:
    """Every channel's history under one memory budget (the policy: the module docstring)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.capacity = budget_bytes // CHANNEL_BYTES
        # Insertion order is the order of the last attach or detach: the first detached one
        # found is the one released longest ago.
        self._histories: dict[str, ChannelHistory] = {}
        self.refused = 0
        self.reclaimed = 0

    def get(self, channel_id: str) -> ChannelHistory | None:
        return self._histories.get(channel_id)

    def query(self, channel_id: str, since: int, until: int, max_points: int) -> HistorySlice:
        """Raises NoHistory when nothing is recorded for the channel, saying why."""
        h = self._histories.get(channel_id)
        if h is None or h.failed:
            why = (
                "recording it failed"
                if h is not None
                else (
                    "history is recorded while a channel is subscribed (or named by "
                    "--history-channels) and the history budget has room"
                )
            )
            raise NoHistory(f"no history of {channel_id}: {why}")
        if not h.numeric and not h.n:
            raise NoHistory(f"no history of {channel_id}: only numeric values are recorded")
        return h.query(since, until, max_points)

    def attach(self, channel_id: str, pinned: bool = False) -> ChannelHistory | None:
        """The history to record `channel_id` into from now on, or None when the budget is full
        of monitored channels (counted)."""
        h = self._histories.pop(channel_id, None)
        if h is not None and h.failed:
            self._histories[channel_id] = h
            return None
        if h is None:
            if len(self._histories) >= self.capacity and not self._reclaim():
                self.refused += 1
                return None
            h = ChannelHistory(channel_id)
        h.attached = True
        h.pinned = h.pinned or pinned
        self._histories[channel_id] = h
        return h

    def detach(self, h: ChannelHistory) -> None:
        """Its channel is no longer monitored: the history ends with a gap and may be reclaimed."""
        if self._histories.get(h.channel_id) is not h:
            return
        h.mark_gap()
        h.attached = False
        del self._histories[h.channel_id]
        self._histories[h.channel_id] = h  # most recently released: last to be reclaimed

    def _reclaim(self) -> bool:
        for cid, h in self._histories.items():
            if h.failed or (not h.attached and not h.pinned):
                del self._histories[cid]
                self.reclaimed += 1
                return True
        return False

    def stats(self) -> HistoryStats:
        n = len(self._histories)
        return HistoryStats(
            budget_bytes=self.budget_bytes,
            used_bytes=n * CHANNEL_BYTES,
            channels=n,
            monitored=sum(1 for h in self._histories.values() if h.attached),
            refused=self.refused,
            reclaimed=self.reclaimed,
        )
