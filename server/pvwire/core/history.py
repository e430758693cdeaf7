"""Recent history of monitored channels, so a plot opens full (DESIGN.md section 7c).

Per channel, fixed-size round-robin buffers, allocated once when the channel gets its history:
- the raw ring: the last `RAW_POINTS` updates as they came (IOC time in ns, value, severity and
  status, or a gap mark), about 100 s of a 10 Hz channel;
- tiers of buckets (`TIERS`: 10 s for an hour, 5 min for a day), each bucket the min, max, sum
  (mean = sum / count), last value, count, highest severity and a gap flag of its span. Each
  tier's open bucket is kept in plain attributes and written to its ring when it closes; a
  closed bucket is merged into the next tier's open bucket.

Recording costs an update one slot write: `Channel.on_update` marks a value of the type
`ChannelHistory.record` checked last (`kind`) as pending, and the tick writes every dirty
channel's pending update into the store's `Journal` in one compiled call (`_journal.Pending`,
through `channel.write_all_pending`), which reads the channels' slots where CPython keeps them.
A second update before the tick writes the first itself, and a read, gap or reclaim of a history
writes its channel's pending update first (`ChannelHistory.source`), so the ring always holds
every update in order when anyone looks. The journal's writer puts every recorded channel's new
points in arrival order (time, value, alarm and the channel's slot) into four columns, O(1),
nothing allocated. When the journal is full (and before any read, gap or reclaim) it is flushed:
every point into its channel's ring (the rings are rows of the store's arrays, one row per
slot) and each ring's index moved on, in one compiled call (`_journal.Rings`). Everything
compiled is in core/_journal.c, built by `make ext`; where it is not built the same runs in
Python (`PyWriter`, `Channel.write_pending`, `advance`) and numpy (a sort by slot and one
scatter per column). At 2,000 sim channels recording cost the server, per update: 1.7-1.9 us
writing each update into its own channel's ring (+51-63 %, 2026-11-24: the update touched the
channel's history, three memoryviews and three ring lines scattered over the store's memory),
0.8 us through the journal from Python (+27 %), 0.3-0.5 us with a compiled call per update
(+11-17 %), and now ~0.1 us timed inside the server (bench/README.md), less than the whole
server's figure varies from run to run.
A channel's points wait in the journal at most until it is full. Whenever AGGREGATE_EVERY of a
channel's points are in its ring and not in its tiers, they are folded into the finest tier at
once, in one compiled pass (`_journal.fold`, the same buckets as numpy's reductions to the bit):
one merge per bucket they touch, not per update. Times are the IOC's; a gap
(the channel disconnected or stopped being monitored) is a point of its own with the server's
clock, as the IOC cannot tell when it went away.

Small arrays, opt-in (`--history-array-max N`, 0 = off): a 1-D numeric array channel of at
most N elements gets an `ArrayHistory` on its first array, which `ChannelHistory.record` (the
slow path: an ndarray is never `kind`, so the scalar writes in `Channel.on_update` are not
touched) hands every frame to:
- a raw ring of whole frames (IOC time, the elements as float64, alarm), at most RAW_POINTS;
- the same tiers, each bucket holding its last frame and the element-wise min and max (NaN
  elements ignored), count, highest severity and gap flag. No mean: a sum per element would
  cost a fourth frame per bucket for a figure a strip chart of arrays does not draw.
Frames are folded into the finest tier as they come (one element-wise min and max per frame):
an array update already costs its encoding, and no ring of pending frames has to be kept for a
vectorised fold. Recording a frame through `record` costs 3.5-9 us at 16 to 1,024 elements
(bench/history.py, 2026-11-24, load 3.5-4, three runs): numpy's per-call overhead, not the size.
One channel's rings are held under `HISTORY_ARRAY_BYTES` (limits.py, 4 MiB): half for the raw
ring, a quarter per tier; an array too wide for RAW_POINTS frames or a tier's buckets in its
share gets fewer (1,024 elements: 255 frames and 42 buckets per tier, so the tiers cover 7 min
and 3.5 h). The width is the first frame's; a frame of another length starts the channel's
array history again (one answer has one width), and one longer than N, or not 1-D numeric, is
not kept (NO_HISTORY says why). A channel whose arrays the budget refused is asked again when
it is opened again, not at every frame. GraphQL `history` answers with a list of elements per
row; a backfill sends 2-D columns (PROTOCOL.md section 2.8), built by the same rules as a
scalar channel's (`ArrayHistory.backfill`).

The budget (`HistoryStore`) is bytes: a channel costs `CHANNEL_BYTES` (its scalar buffers,
allocated when it gets a history), an array channel that plus its `ArrayHistory`'s arrays,
counted when they are allocated. When a new history or a channel's arrays do not fit:
1. the history of the channel that stopped being monitored longest ago is reclaimed (nobody
   watches it and its data only gets older), again until it fits;
2. if every history in the store belongs to a monitored channel, the new channel (or its
   arrays) gets none, and `refused` counts it: taking history away from a channel someone is
   watching would break a plot on screen, while a new channel without history still streams as
   before.
A channel released after the linger keeps its history (ended by a gap) while the budget allows,
and continues it if it is monitored again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..errors import PvwireError
from ..limits import HISTORY_ARRAY_BYTES, HISTORY_ARRAY_LIMIT

__all__ = [
    "CHANNEL_BYTES",
    "JOURNAL_POINTS",
    "NS",
    "RAW_POINTS",
    "TIERS",
    "ArrayHistory",
    "ChannelHistory",
    "HistorySlice",
    "HistoryStats",
    "HistoryStore",
    "Journal",
    "NoHistory",
]

log = logging.getLogger("pvwire.history")

NS = 1_000_000_000
RAW_POINTS = 1024  # ~100 s of a 10 Hz channel, ~17 min of a 1 Hz one
assert RAW_POINTS & (RAW_POINTS - 1) == 0  # a power of two: the flush masks instead of %
# (bucket width in ns, buckets): 10 s for an hour, 5 min for a day.
TIERS: tuple[tuple[int, int], ...] = ((10 * NS, 360), (300 * NS, 288))

# What reading the raw ring gives (`points`); it is held as three columns (ChannelHistory).
RAW_DTYPE = np.dtype([("t", "<i8"), ("v", "<f8"), ("sev", "u1"), ("stat", "u1"), ("gap", "?")])
RAW_ITEM_BYTES = 8 + 8 + 2  # time, value, alarm
GAP_ALARM = 0xFFFF  # the alarm column's mark of a gap
# Updates are folded into the tiers this many at a time (and before any read): a ring write
# per update, and the bucketing in one pass.
# 512 (half the ring, so no pending point is overwritten): the bucketing's share was ~55 ns per
# update with numpy here, against ~90 at 256 and ~200 at 64, its numpy calls amortised; ~21 ns
# with the compiled fold, most of it the Python merge per bucket (2,000 channels, 2026-11-25).
AGGREGATE_EVERY = RAW_POINTS // 2
# Points the journal holds before it is flushed into the rings. The flush costs a pass over them
# and a step per channel among them: at 2,000 channels of 10 Hz (~8 points each per flush) ~20
# ns per point compiled, ~80 with numpy (in process, 2026-11-25); a fuller journal would spend
# the cache lines it saves.
JOURNAL_POINTS = 16_384
BUCKET_DTYPE = np.dtype(
    [("t", "<i8"), ("min", "<f8"), ("max", "<f8"), ("sum", "<f8"), ("last", "<f8"),
     ("count", "<u4"), ("sev", "u1"), ("gap", "u1")]
)  # fmt: skip
CHANNEL_BYTES = RAW_POINTS * RAW_ITEM_BYTES + sum(size * BUCKET_DTYPE.itemsize for _, size in TIERS)

INVALID = 3  # the severity a gap carries: EPICS shows a disconnected channel INVALID
_NUMBERS = (int, float, bool)
_LAST = RAW_POINTS - 1


class _Buckets:
    """What both kinds of tier share: one bucket open at a time, keyed by `t // width`, closed
    when a point or bucket of a later one comes."""

    __slots__ = ("key", "width")
    key: int  # t // width of the open bucket; -1: none open
    width: int

    def _opens(self, t: int) -> bool:
        """Whether `t` is past the open bucket: then that one is closed and `t`'s is open, for
        the caller to fill."""
        key = t // self.width
        if key <= self.key:
            return False
        if self.key >= 0:
            self._close()
        self.key = key
        return True

    def _close(self) -> None:
        raise NotImplementedError


class Tier(_Buckets):
    """One ring of buckets, with its open bucket in plain attributes."""

    __slots__ = ("count", "data", "gap", "last", "max", "min", "n", "next", "sev", "sum")

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
        if self._opens(t):
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
        if self._opens(t):
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
    with `gap` set and value NaN (buckets: `gap` set if the channel was away in that span).
    An array channel's `value`, `min` and `max` have a row of elements per row (ndim 2) and its
    `mean` is NaN (not kept for arrays: the module docstring)."""

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
    # More rows matched than the limit: `query` kept the newest; `backfill` the oldest, and
    # more follow.
    truncated: bool
    since: int  # ns: the oldest time this answer could hold (older data is gone)

    def __len__(self) -> int:
        return len(self.t)


class PendingSource(Protocol):
    """A channel holding an update not yet written (`Channel.on_update`)."""

    history_pending: bool

    def write_pending(self) -> None: ...


class ChannelHistory:
    """One channel's buffers. `record` and `mark_gap` are called by its Channel."""

    __slots__ = ("_a", "_t", "_v", "arrays", "attached", "channel_id", "failed", "first",
                 "folded", "i", "journal", "kind", "no_room", "numeric", "pinned", "ring_a",
                 "ring_t", "ring_v", "slot", "source", "store", "tier", "unkept",
                 "wrapped")  # fmt: skip

    def __init__(self, channel_id: str, store: HistoryStore | None = None, slot: int = -1) -> None:
        self.channel_id = channel_id
        # Where its arrays' bytes are asked for; None: arrays are not kept (a bare history).
        self.store = store
        # A store's history is written through the store's journal into its row `slot` of the
        # store's rings; a bare one (no store: tests, benchmarks) into rings of its own, at once.
        self.slot = slot
        self.journal = store.journal if store is not None and slot >= 0 else None
        # The channel recording into it (set by `Channel.record_into`), whose last update may
        # still wait for the tick: written before any read, gap or reclaim (`_sync`).
        self.source: PendingSource | None = None
        self.arrays: ArrayHistory | None = None  # an array channel's frames (the docstring)
        self.unkept = ""  # why the last value that was not a number was not kept
        self.no_room = False  # the store refused its arrays since it was last attached (opened)
        # The raw ring as three columns: IOC time (ns), value, and alarm (severity << 8 |
        # status; GAP_ALARM for a gap). A bare history writes them through memoryviews
        # (`ring_*`): ~45 ns an item against ~80 ns through numpy's item assignment and ~200 ns
        # for a structured row (measured here), nothing is allocated, and a "d" view refuses
        # anything but a number (a string, an array, None) with a TypeError. A store's history
        # is written by the journal's flush only, and has no views.
        # (typed Any: typeshed's memoryview takes ints only, a "d" view takes floats too)
        self.ring_t: Any
        self.ring_v: Any
        self.ring_a: Any
        if self.journal is not None and store is not None:
            self._t, self._v, self._a = store.raw_t[slot], store.raw_v[slot], store.raw_a[slot]
            self.ring_t = self.ring_v = self.ring_a = None
            # Its row's pages are mapped now, when its channel is opened, not at the journal's
            # flushes: the first flush after 1,000 channels opened otherwise faulted in their
            # ~2,500 pages at once, 45-80 ms on the event loop (in a server of 1,000 CA channels,
            # 2026-11-25: recording took 2.3-4.0 us per update over the first 20,000 updates,
            # ~0.5 us after; with this, 0.47 us over the first 20,000).
            for row in (self._t, self._v, self._a):
                row.fill(0)
        else:
            self._t = np.zeros(RAW_POINTS, "<i8")
            self._v = np.zeros(RAW_POINTS, "<f8")
            self._a = np.zeros(RAW_POINTS, "<u2")
            self.ring_t, self.ring_v, self.ring_a = self._t.data, self._v.data, self._a.data
        self.i = 0  # where the next point goes
        self.folded = 0  # points before `i` from here on are not in the tiers yet
        self.wrapped = False  # the ring is full: the oldest point is at `i`
        # The type of the values `record` last accepted: `Channel.on_update` writes a value of
        # this type into the journal itself. None until a number came (and after a non-number).
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
        writes values of `kind` through the journal's writer itself: this call and its checks
        were about half of what recording cost in a loop of one channel (bench/history.py,
        2026-11-24, load 6.5: 0.61-0.75 us with the call, 0.31-0.44 without).
        tests/test_history.py checks that both record the same."""
        kind = type(value)
        if not (kind in _NUMBERS or issubclass(kind, np.number | np.bool_)):
            self.kind = None
            if isinstance(value, np.ndarray):
                # An ndarray is never `kind`: every frame comes here, off the scalar path.
                t = seconds * NS + nanoseconds
                if not 0 <= severity <= 0xFE:
                    raise ValueError(f"alarm severity {severity} out of range")
                self._record_array(value, t, severity << 8 | status & 0xFF)
                return
            self.numeric = False
            self.unkept = "only numbers and numeric arrays are recorded"
            return
        self.kind = kind
        journal = self.journal
        if journal is not None:
            if journal.write(value, seconds, nanoseconds, severity, status, self.slot):
                journal.flush()
            return
        i = self.i
        self.ring_v[i] = value
        self.ring_t[i] = seconds * NS + nanoseconds
        # A severity out of range raises here: the channel's failure path stops this history.
        self.ring_a[i] = severity << 8 | status & 0xFF
        self.advance(1)

    def _record_array(self, value: npt.NDArray[Any], t: int, alarm: int) -> None:
        store = self.store
        limit = store.array_max if store is not None else 0
        arrays = self.arrays
        if arrays is not None and value.shape == (arrays.elements,):
            arrays.record(value, t, alarm)
            return
        self.numeric = False
        if value.ndim != 1 or value.dtype.kind not in "biuf":
            self.unkept = "only numbers and 1-D numeric arrays are recorded"
        elif store is None or not limit:
            self.unkept = "arrays are recorded only with --history-array-max (it is 0)"
        elif not 0 < len(value) <= limit:
            self.unkept = (
                f"its array of {len(value):,} elements is longer than --history-array-max "
                f"({limit:,})"
                if len(value)
                else "its array is empty"
            )
        elif self.no_room:
            return  # refused once: asked again when the channel is opened again
        else:
            # The first frame, or one of another length: the array history starts (again).
            if arrays is not None:
                self.arrays = None
                store.release_bytes(arrays.nbytes)
            if not store.take_bytes(self, array_bytes(len(value))):
                # Not tried again at every frame: that would count one refusal per update and
                # look for histories to reclaim at the channel's rate.
                self.no_room = True
                self.unkept = "the history budget (--history-mb) had no room for its arrays"
                return
            self.arrays = ArrayHistory(len(value))
            self.arrays.record(value, t, alarm)
            return
        if arrays is not None:  # a frame that is not kept: the line breaks here
            arrays.mark_gap()

    @property
    def nbytes(self) -> int:
        """What this history holds allocated: its scalar buffers and its frames' arrays."""
        return CHANNEL_BYTES + (self.arrays.nbytes if self.arrays is not None else 0)

    def advance(self, k: int) -> None:
        """`k` more points were written into the ring from `i` on (k <= AGGREGATE_EVERY, so
        none was still waiting for the tiers): the index moves on, and once AGGREGATE_EVERY
        points wait they are folded into the tiers."""
        i = self.i + k
        if i >= RAW_POINTS:
            i -= RAW_POINTS
            self.wrapped = True
        self.i = i
        folded = self.folded
        if (i - folded if i >= folded else i + RAW_POINTS - folded) >= AGGREGATE_EVERY:
            self._aggregate()

    def write_points(
        self, t: npt.NDArray[np.int64], v: npt.NDArray[np.float64], a: npt.NDArray[np.uint16]
    ) -> None:
        """Points straight into the ring, any number, in chunks that `advance` folds: none
        longer than AGGREGATE_EVERY, none across the ring's end."""
        n, o = len(t), 0
        while o < n:
            i = self.i
            k = min(n - o, AGGREGATE_EVERY, RAW_POINTS - i)
            self._t[i : i + k] = t[o : o + k]
            self._v[i : i + k] = v[o : o + k]
            self._a[i : i + k] = a[o : o + k]
            self.advance(k)
            o += k

    def _sync(self) -> None:
        """Points of this history still in its channel or in the journal go to the ring first
        (before a read, a gap, or a reclaim), so that the ring holds every update in order."""
        source = self.source
        if source is not None and source.history_pending:
            source.write_pending()
        journal = self.journal
        if journal is not None and journal.j:
            journal.flush()

    def mark_gap(self) -> None:
        """The channel went away (disconnected, or no longer monitored): the line breaks here.

        Stamped with the server's clock, never before the last point (IOC clocks can be ahead)."""
        self._sync()
        if self.arrays is not None:
            self.arrays.mark_gap()
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
        """Points held in the raw ring (the journal flushed first)."""
        self._sync()
        return RAW_POINTS if self.wrapped else self.i

    def _aggregate(self) -> None:
        """Fold the pending points into the finest tier: one merge per bucket they touch."""
        i = self.i
        k = i - self.folded if i >= self.folded else i + RAW_POINTS - self.folded
        if not k:
            return
        self.folded = i
        start = (i - k) % RAW_POINTS  # the oldest; the points run on across the ring's end
        if not self.first:
            self.first = int(self._t[start])
        tier = self.tier
        if _fold is not None:
            for row in _fold(self._t, self._v, self._a, start, k, tier.width):
                tier.add_bucket(*row, 0)  # start, min, max, sum, last, count, severity; no gap
            return
        idx = np.arange(i - k, i) % RAW_POINTS
        t, v, a = self._t[idx], self._v[idx], self._a[idx]
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
        n = self.n  # (flushes the journal)
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
        its newest `max_points` buckets. An array channel answers with its frames."""
        self._sync()
        if self.arrays is not None:
            return self.arrays.query(since, until, max_points)
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

    def backfill(self, since: int, limit: int | None = None) -> list[HistorySlice]:
        """What a subscription's `backfill` sends before its snapshot (PROTOCOL.md section 2.8):
        one or two slices, oldest first. Buckets of the finest tier that reaches back to `since`,
        whole buckets only, ending at or before the raw ring's first point, when the ring does
        not reach back that far; then the raw points from `since` on. `limit`: the oldest
        `limit` rows of these only (`_take`), for a backfill sent a message at a time; the last
        slice's `truncated` then says that more rows follow.

        The join with the snapshot: the newest raw point, unless it is a gap, is the channel's
        current value (the channel records every update where it stores it, and the snapshot
        is taken in the same call, with no update in between), so it is left out: the snapshot
        carries it. Nothing between: every older update is in the points. An array channel
        sends its frames the same way."""
        self._sync()
        if self.arrays is not None:
            return self.arrays.backfill(since, limit)
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
            cut = len(rows) if limit is None else _take(rows["t"], limit)
            if cut:
                out.append(_buckets(rows[:cut], tier_used.width, cut < len(rows), self.first))
                if cut < len(rows):
                    return out
                limit = None if limit is None else limit - cut
        points = raw[raw["t"] >= since]
        cut = len(points) if limit is None else _take(points["t"], limit) if limit > 0 else 0
        if cut:
            out.append(_points(points[:cut], self.first, cut < len(points)))
        elif len(points):
            out[-1] = dataclasses.replace(out[-1], truncated=True)
        return out

    def _oldest(self, raw: npt.NDArray[Any], whole: bool) -> int:
        if whole or not len(raw):
            return self.first
        return int(raw["t"][0])


def array_sizes(elements: int) -> tuple[int, tuple[int, ...]]:
    """(raw frames, buckets per tier) of an array history of `elements` under
    HISTORY_ARRAY_BYTES: half of it for the raw ring, the rest shared by the tiers."""
    frame = elements * 8 + 8 + 2
    bucket = 3 * elements * 8 + 8 + 4 + 1 + 1
    frames = max(2, min(RAW_POINTS, HISTORY_ARRAY_BYTES // 2 // frame))
    share = HISTORY_ARRAY_BYTES // 2 // len(TIERS)
    return frames, tuple(max(2, min(size, share // bucket)) for _, size in TIERS)


def array_bytes(elements: int) -> int:
    """What an ArrayHistory of `elements` allocates (its `nbytes`), before it is made."""
    frames, sizes = array_sizes(elements)
    frame = elements * 8
    return (frames * (frame + 8 + 2)
            + sum(size * (3 * frame + 8 + 4 + 1 + 1) + 3 * frame for size in sizes))  # fmt: skip


class ArrayTier(_Buckets):
    """A tier of array buckets: the last frame and the element-wise min and max of each."""

    __slots__ = ("count", "gap", "hi", "last", "lo", "n", "next", "o_count", "o_gap", "o_hi",
                 "o_last", "o_lo", "o_sev", "sev", "t")  # fmt: skip

    def __init__(self, width: int, size: int, elements: int, following: ArrayTier | None) -> None:
        self.width = width
        self.t = np.zeros(size, "<i8")
        self.last = np.full((size, elements), math.nan)
        self.lo = np.full((size, elements), math.nan)
        self.hi = np.full((size, elements), math.nan)
        self.count = np.zeros(size, "<u4")
        self.sev = np.zeros(size, "u1")
        self.gap = np.zeros(size, "u1")
        self.n = 0
        self.next = following
        self.key = -1
        # The open bucket.
        self.o_last = np.full(elements, math.nan)
        self.o_lo = np.full(elements, math.nan)
        self.o_hi = np.full(elements, math.nan)
        self.o_count = self.o_sev = self.o_gap = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.t, self.last, self.lo, self.hi, self.count, self.sev,
                                      self.gap, self.o_last, self.o_lo, self.o_hi))  # fmt: skip

    def add(self, t: int, last: npt.NDArray[np.float64], lo: npt.NDArray[np.float64],
            hi: npt.NDArray[np.float64], count: int, sev: int, gap: int) -> None:  # fmt: skip
        """Merge one frame (count 1, lo = hi = last) or a closed bucket of the tier before."""
        if self._opens(t):
            self.o_last[:] = last
            self.o_lo[:] = lo
            self.o_hi[:] = hi
            self.o_count, self.o_sev, self.o_gap = count, sev, gap
            return
        if count:
            if self.o_count:
                np.fmin(self.o_lo, lo, out=self.o_lo)
                np.fmax(self.o_hi, hi, out=self.o_hi)
            else:
                self.o_lo[:] = lo
                self.o_hi[:] = hi
            self.o_last[:] = last
            self.o_count += count
        self.o_sev = max(self.o_sev, sev)
        self.o_gap |= gap

    def add_gap(self, t: int) -> None:
        if self._opens(t):
            self.o_last[:] = self.o_lo[:] = self.o_hi[:] = math.nan
            self.o_count, self.o_sev = 0, INVALID
        self.o_gap = 1

    def _close(self) -> None:
        j = self.n % len(self.t)
        self.t[j] = self.key * self.width
        self.last[j], self.lo[j], self.hi[j] = self.o_last, self.o_lo, self.o_hi
        self.count[j], self.sev[j], self.gap[j] = self.o_count, self.o_sev, self.o_gap
        self.n += 1
        if self.next is not None:
            self.next.add(int(self.t[j]), self.last[j], self.lo[j], self.hi[j], self.o_count,
                          self.o_sev, self.o_gap)  # fmt: skip

    def rows(self, finer: list[ArrayTier]) -> _ArrayRows:
        """Every bucket held, oldest first, the open one last (copies). `finer`: the tiers
        before this one, coarsest first, whose open buckets are not merged into this one yet."""
        size = len(self.t)
        order = np.arange(self.n) if self.n <= size else np.arange(self.n, self.n + size) % size
        scratch = ArrayTier(self.width, len(finer) + 1, self.o_last.shape[0], None)
        for tier in (self, *finer):
            if tier.key >= 0:
                scratch.add(tier.key * tier.width, tier.o_last, tier.o_lo, tier.o_hi,
                            tier.o_count, tier.o_sev, tier.o_gap)  # fmt: skip
        if scratch.key >= 0:
            scratch._close()
        tail = np.arange(scratch.n)
        return _ArrayRows(
            t=np.concatenate((self.t[order], scratch.t[tail])),
            last=np.concatenate((self.last[order], scratch.last[tail])),
            lo=np.concatenate((self.lo[order], scratch.lo[tail])),
            hi=np.concatenate((self.hi[order], scratch.hi[tail])),
            count=np.concatenate((self.count[order], scratch.count[tail])).astype(np.int64),
            sev=np.concatenate((self.sev[order], scratch.sev[tail])).astype(np.int64),
            gap=np.concatenate((self.gap[order], scratch.gap[tail])) != 0,
        )

    @property
    def wrapped(self) -> bool:
        return self.n >= len(self.t)


@dataclass(frozen=True, slots=True)
class _ArrayRows:
    t: npt.NDArray[np.int64]
    last: npt.NDArray[np.float64]
    lo: npt.NDArray[np.float64]
    hi: npt.NDArray[np.float64]
    count: npt.NDArray[np.int64]
    sev: npt.NDArray[np.int64]
    gap: npt.NDArray[np.bool_]

    def __getitem__(self, sel: Any) -> _ArrayRows:
        return _ArrayRows(self.t[sel], self.last[sel], self.lo[sel], self.hi[sel],
                          self.count[sel], self.sev[sel], self.gap[sel])  # fmt: skip

    def __len__(self) -> int:
        return len(self.t)

    def slice(self, width: int, truncated: bool, oldest: int) -> HistorySlice:
        n = len(self.t)
        return HistorySlice(
            resolution=width, t=self.t, value=self.last, min=self.lo, max=self.hi,
            mean=np.full(n, math.nan), count=self.count, severity=self.sev,
            status=np.zeros(n, np.int64), gap=self.gap, truncated=truncated, since=oldest,
        )  # fmt: skip


class ArrayHistory:
    """One array channel's frames: a raw ring of whole frames and tiers of array buckets (the
    module docstring). `ChannelHistory` owns it and hands it every frame of its width."""

    __slots__ = ("_a", "_t", "_v", "elements", "first", "i", "tier", "wrapped")

    def __init__(self, elements: int) -> None:
        self.elements = elements
        frames, sizes = array_sizes(elements)
        self._t = np.zeros(frames, "<i8")
        self._v = np.full((frames, elements), math.nan)
        self._a = np.zeros(frames, "<u2")
        self.i = 0
        self.wrapped = False
        self.first = 0
        following: ArrayTier | None = None
        for (width, _), size in reversed(tuple(zip(TIERS, sizes, strict=True))):
            following = ArrayTier(width, size, elements, following)
        assert following is not None
        self.tier = following

    @property
    def nbytes(self) -> int:
        total = self._t.nbytes + self._v.nbytes + self._a.nbytes
        tier: ArrayTier | None = self.tier
        while tier is not None:
            total += tier.nbytes
            tier = tier.next
        return total

    @property
    def n(self) -> int:
        return len(self._t) if self.wrapped else self.i

    def record(self, value: npt.NDArray[Any], t: int, alarm: int) -> None:
        i = self.i
        row = self._v[i]
        row[:] = value  # any numeric dtype, as float64
        self._t[i], self._a[i] = t, alarm
        if not self.first:
            self.first = t
        self.tier.add(t, row, row, row, 1, alarm >> 8, 0)
        self._advance()

    def mark_gap(self) -> None:
        """As ChannelHistory.mark_gap: one gap row per absence, on the server's clock."""
        if not self.n or self._a[self.i - 1] == GAP_ALARM:
            return
        t = max(time.time_ns(), int(self._t[self.i - 1]) + 1)
        i = self.i
        self._t[i], self._a[i] = t, GAP_ALARM
        self._v[i] = math.nan
        self.tier.add_gap(t)
        self._advance()

    def _advance(self) -> None:
        self.i += 1
        if self.i == len(self._t):
            self.i = 0
            self.wrapped = True

    def _order(self) -> npt.NDArray[np.intp]:
        """Indices of the frames held, oldest first."""
        return np.arange(self.i - self.n, self.i) % len(self._t)

    def _frames(self, idx: npt.NDArray[np.intp], oldest: int) -> HistorySlice:
        a = self._a[idx]
        gap = a == GAP_ALARM
        v = self._v[idx]
        return HistorySlice(
            resolution=0, t=self._t[idx].astype(np.int64), value=v, min=v, max=v,
            mean=np.full(len(idx), math.nan), count=np.where(gap, 0, 1).astype(np.int64),
            severity=np.where(gap, INVALID, a >> 8).astype(np.int64),
            status=np.where(gap, 0, a & 0xFF).astype(np.int64), gap=gap, truncated=False,
            since=oldest,
        )  # fmt: skip

    def _tier_for(self, since: int) -> tuple[ArrayTier, _ArrayRows]:
        """The finest tier that reaches back to `since`, else the coarsest, with its rows."""
        tier: ArrayTier | None = self.tier
        finer: list[ArrayTier] = []
        chosen: tuple[ArrayTier, _ArrayRows] | None = None
        while tier is not None:
            rows = tier.rows(finer)
            finer.insert(0, tier)
            chosen = (tier, rows)
            if not tier.wrapped or (len(rows) and rows.t[0] <= since):
                break
            tier = tier.next
        assert chosen is not None
        return chosen

    def query(self, since: int, until: int, max_points: int) -> HistorySlice:
        """As ChannelHistory.query, with rows of frames."""
        idx = self._order()
        t = self._t[idx]
        sel = idx[(t >= since) & (t <= until)]
        whole = not self.wrapped
        if len(sel) <= max_points and (whole or (len(t) and t[0] <= since)):
            return self._frames(sel, self.first if whole or not len(t) else int(t[0]))
        tier: ArrayTier | None = self.tier
        finer: list[ArrayTier] = []
        chosen: tuple[ArrayTier, _ArrayRows] | None = None
        while tier is not None:
            rows = tier.rows(finer)
            finer.insert(0, tier)
            picked = rows[(rows.t + tier.width > since) & (rows.t <= until)]
            chosen = (tier, picked)
            reaches = not tier.wrapped or (len(rows) and rows.t[0] <= since)
            if len(picked) <= max_points and reaches:
                break
            tier = tier.next
        assert chosen is not None
        used, picked = chosen
        truncated = len(picked) > max_points
        if truncated:
            picked = picked[len(picked) - max_points :]
        oldest = int(used.rows([]).t[0]) if used.wrapped else self.first
        return picked.slice(used.width, truncated, oldest)

    def backfill(self, since: int, limit: int | None = None) -> list[HistorySlice]:
        """As ChannelHistory.backfill (the join included: the newest frame, unless a gap, is
        the channel's current value, which the snapshot carries). `limit` counts values: a
        row of frames is `elements` of them (at least one row is given)."""
        idx = self._order()
        if len(idx) and self._a[idx[-1]] != GAP_ALARM:
            idx = idx[:-1]
        t = self._t[idx]
        rows_left = None if limit is None else max(1, limit // self.elements)
        out = []
        if self.wrapped and len(idx) and t[0] > since:
            used, rows = self._tier_for(since)
            end = rows.t + used.width
            rows = rows[(end > since) & (end <= int(t[0]))]
            cut = len(rows) if rows_left is None else _take(rows.t, rows_left)
            if cut:
                out.append(rows[:cut].slice(used.width, cut < len(rows), self.first))
                if cut < len(rows):
                    return out
                rows_left = None if rows_left is None else rows_left - cut
        keep = idx[t >= since]
        cut = (
            len(keep)
            if rows_left is None
            else _take(self._t[keep], rows_left)
            if rows_left > 0
            else 0
        )
        if cut:
            frames = self._frames(keep[:cut], self.first)
            out.append(dataclasses.replace(frames, truncated=cut < len(keep)))
        elif len(keep):
            out[-1] = dataclasses.replace(out[-1], truncated=True)
        return out


def _take(t: npt.NDArray[np.int64], n: int) -> int:
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


class PyWriter:
    """The journal's writer in Python, where the compiled one (`_journal.c`) is not built (a
    checkout before `make ext`): the same columns, checks and errors (tests/test_journal.py).

    `write(value, seconds, nanoseconds, severity, status, slot)` puts one point at `j` and
    answers whether the columns are full. TypeError for a value that is not a number, ValueError
    for anything out of its column's range (a severity above 255, a time past 2262); a point
    that raises is not counted."""

    __slots__ = ("_a", "_c", "_t", "_v", "j", "size")

    def __init__(self, t: npt.NDArray[np.int64], v: npt.NDArray[np.float64],
                 a: npt.NDArray[np.uint16], c: npt.NDArray[np.int32]) -> None:  # fmt: skip
        if not len(t) == len(v) == len(a) == len(c):
            raise ValueError("Writer: the four columns must be of one length")
        # Written through memoryviews, as the rings were (typed Any: a "d" view takes floats).
        self._t: Any = t.data
        self._v: Any = v.data
        self._a: Any = a.data
        self._c: Any = c.data
        self.size = len(t)
        self.j = 0  # where the next point goes

    def write(self, value: object, seconds: int, nanoseconds: int, severity: int, status: int,
              slot: int) -> bool:  # fmt: skip
        j = self.j
        if j >= self.size:
            raise IndexError("write: the journal is full (flush it first)")
        self._v[j] = value  # a TypeError for anything but a number
        self._t[j] = seconds * NS + nanoseconds
        self._a[j] = severity << 8 | status & 0xFF  # a ValueError for a severity above 255
        self._c[j] = slot
        self.j = j = j + 1
        return j == self.size


try:
    from ._journal import Writer
except ImportError:  # not built: `make ext` builds it
    Writer = PyWriter  # type: ignore[misc,assignment]

# The flush and the fold into the tiers, compiled (`_journal.Rings` and `fold`; None where not
# built: the same in numpy and Python). At 2,000 channels a flush holds ~8 points of each: its
# numpy calls over the 16,384 points, a Python call per channel to move its ring's index on and
# ~15 numpy calls per fold of AGGREGATE_EVERY points were most of what recording cost: ~150 ns
# per point, ~42 compiled, fold included (in process, 2026-11-25).
_rings: Rings | None = None
_fold: Callable[..., list[tuple[int, float, float, float, float, int, int]]] | None = None
try:
    from ._journal import Rings, fold

    _rings = Rings(ChannelHistory, RAW_POINTS, AGGREGATE_EVERY)
    _fold = fold
except ImportError:
    pass


class Journal:
    """Every store-held channel's new points in arrival order, until `flush` writes them into
    the channels' rings (the module docstring says why). `writer` (compiled where built, or
    `PyWriter`) puts each point into the columns; `Channel.on_update` calls it directly."""

    __slots__ = ("_a", "_c", "_t", "_v", "store", "write", "writer")

    def __init__(self, store: HistoryStore, writer: type[Writer] | type[PyWriter] = Writer) -> None:
        self.store = store
        self._t = np.zeros(JOURNAL_POINTS, "<i8")
        self._v = np.zeros(JOURNAL_POINTS, "<f8")
        self._a = np.zeros(JOURNAL_POINTS, "<u2")
        self._c = np.zeros(JOURNAL_POINTS, "<i4")  # the channel's slot
        for column in (self._t, self._v, self._a, self._c):
            column.fill(0)  # mapped now, not page by page under the first 16,384 updates
        self.writer = writer(self._t, self._v, self._a, self._c)
        # The writer's `write`, bound once: every channel holds this one object (the tick's
        # batch finds the writer through it). A bound method of its own per channel
        # (`writer.write` makes a new one at each access) cost the update loop 0.08 us more per
        # update when each update called it (2,000 sim counters, same process, ticks
        # alternated, 2026-11-25): one more object to fetch, cold, at every update.
        self.write = self.writer.write

    @property
    def j(self) -> int:
        """Points waiting for the flush."""
        return self.writer.j

    def flush(self) -> None:
        """Every point into its channel's ring, in order, then each channel among them moves
        its index on (and folds its tiers when AGGREGATE_EVERY points wait). Compiled where
        built (`_journal.Rings.flush`); with numpy (one stable sort by slot, one scatter per
        column) where not, and when a channel has more points than may wait for the tiers."""
        writer = self.writer
        n = writer.j
        if not n:
            return
        writer.j = 0  # whatever happens below, these points are not written twice
        store = self.store
        if _rings is not None:
            due = _rings.flush(self._t, self._v, self._a, self._c, n, store.raw_t, store.raw_v,
                               store.raw_a, store.by_slot)  # fmt: skip
            if due is not None:
                for h in due:
                    h._aggregate()  # AGGREGATE_EVERY points of it wait for the tiers
                return
            # A channel with more points than may wait for the tiers: the path below.
        slots = self._c[:n]
        order = np.argsort(slots, kind="stable")
        c = slots[order]
        t, v, a = self._t[:n][order], self._v[:n][order], self._a[:n][order]
        starts = np.flatnonzero(np.concatenate(([True], c[1:] != c[:-1])))
        counts = np.diff(np.append(starts, n))
        held = store.by_slot
        histories = [held[k] for k in c[starts].tolist()]
        burst = counts > AGGREGATE_EVERY
        if burst.any():
            # A channel with more points than may wait for the tiers (one much faster than the
            # others, or alone): its points in chunks, folded between them.
            ends = starts + counts
            for k in np.flatnonzero(burst).tolist():
                h = histories[k]
                if h is not None:
                    run = slice(int(starts[k]), int(ends[k]))
                    h.write_points(t[run], v[run], a[run])
            keep = np.repeat(~burst, counts)
            c, t, v, a = c[keep], t[keep], v[keep], a[keep]
            counts = counts[~burst]
            histories = [h for h, b in zip(histories, burst.tolist(), strict=True) if not b]
            starts = np.cumsum(counts) - counts
        base = np.fromiter((h.i if h is not None else 0 for h in histories), np.int64,
                           len(histories))  # fmt: skip
        # Each point's place in its ring: its channel's index plus its rank among the channel's
        # points, as one index into the rows laid end to end. One repeat, a mask for the modulo
        # and a flat index took the flush from ~72 to ~35 ns per point at 1,000 channels
        # (against two repeats, % and a 2-D index; in process, 2026-11-25).
        pos = (np.repeat(base - starts, counts) + np.arange(len(c))) & (RAW_POINTS - 1)
        flat = c * np.int64(RAW_POINTS) + pos
        store.raw_t.reshape(-1)[flat] = t
        store.raw_v.reshape(-1)[flat] = v
        store.raw_a.reshape(-1)[flat] = a
        for h, k in zip(histories, counts.tolist(), strict=True):
            if h is not None:
                h.advance(k)


class NoHistory(PvwireError):
    code = "NO_HISTORY"


@dataclass(frozen=True, slots=True)
class HistoryStats:
    budget_bytes: int
    used_bytes: int
    channels: int  # histories held
    monitored: int  # of which their channel is monitored now
    refused: int  # channels (or arrays) given no history: the budget was full of monitored ones
    reclaimed: int  # histories of unmonitored channels dropped to make room


class HistoryStore:
    """Every channel's history under one memory budget (the policy: the module docstring)."""

    def __init__(self, budget_bytes: int, array_max: int = 0) -> None:
        if not 0 <= array_max <= HISTORY_ARRAY_LIMIT:
            raise ValueError(
                f"history_array_max must be between 0 and {HISTORY_ARRAY_LIMIT:,}, not {array_max}"
            )
        self.budget_bytes = budget_bytes
        self.array_max = array_max  # longest numeric array that gets a history; 0: none do
        self.used = 0  # bytes held by the histories in `_histories`
        # Every history's raw ring is a row of these (a slot), so that the journal's flush is
        # one scatter per column. As many rows as scalar histories fit the budget; untouched
        # rows cost no memory (calloc'd pages are mapped when first written).
        capacity = budget_bytes // CHANNEL_BYTES
        self.raw_t = np.zeros((capacity, RAW_POINTS), "<i8")
        self.raw_v = np.zeros((capacity, RAW_POINTS), "<f8")
        self.raw_a = np.zeros((capacity, RAW_POINTS), "<u2")
        self.by_slot: list[ChannelHistory | None] = [None] * capacity
        self._free = list(range(capacity - 1, -1, -1))  # the lowest slot is taken first
        self.journal = Journal(self)
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
        if h.arrays is None and not h.numeric and not h.n:
            raise NoHistory(f"no history of {channel_id}: {h.unkept}")
        return h.query(since, until, max_points)

    def attach(self, channel_id: str, pinned: bool = False) -> ChannelHistory | None:
        """The history to record `channel_id` into from now on, or None when the budget is full
        of monitored channels (counted)."""
        h = self._histories.pop(channel_id, None)
        if h is not None and h.failed:
            self._histories[channel_id] = h
            return None
        if h is None:
            if not self._room(CHANNEL_BYTES) or not self._free:
                self.refused += 1
                return None
            slot = self._free.pop()
            h = ChannelHistory(channel_id, self, slot)
            self.by_slot[slot] = h
            self.used += CHANNEL_BYTES
        h.attached = True
        h.no_room = False  # its arrays may find room now, as a refused channel's history may
        h.pinned = h.pinned or pinned
        self._histories[channel_id] = h
        return h

    def take_bytes(self, h: ChannelHistory, n: int) -> bool:
        """Room for `n` more bytes of `h` (its arrays), reclaiming released histories as a new
        channel would; False (counted in `refused`) when the budget is full of monitored ones.
        A history the store no longer holds gets none."""
        if self._histories.get(h.channel_id) is not h or not self._room(n, keep=h):
            self.refused += 1
            return False
        self.used += n
        return True

    def release_bytes(self, n: int) -> None:
        """A held history freed `n` bytes (its arrays, replaced)."""
        self.used -= n

    def detach(self, h: ChannelHistory) -> None:
        """Its channel is no longer monitored: the history ends with a gap and may be reclaimed."""
        if self._histories.get(h.channel_id) is not h:
            return
        h.mark_gap()
        h.attached = False
        del self._histories[h.channel_id]
        self._histories[h.channel_id] = h  # most recently released: last to be reclaimed

    def _room(self, n: int, keep: ChannelHistory | None = None) -> bool:
        """Reclaims released (or failed) histories, longest released first, until `n` more
        bytes fit; False if they cannot, and then reclaims nothing."""
        if self.used + n <= self.budget_bytes:
            return True
        victims = []
        freed = 0
        for h in self._histories.values():
            if h is not keep and (h.failed or (not h.attached and not h.pinned)):
                victims.append(h)
                freed += h.nbytes
                if self.used - freed + n <= self.budget_bytes:
                    break
        else:
            return False
        self.journal.flush()  # their points still held go to their rows before the rows go
        for h in victims:
            del self._histories[h.channel_id]
            self.used -= h.nbytes
            self.reclaimed += 1
            if h.slot >= 0:
                self.by_slot[h.slot] = None
                self._free.append(h.slot)
        return True

    def stats(self) -> HistoryStats:
        n = len(self._histories)
        return HistoryStats(
            budget_bytes=self.budget_bytes,
            used_bytes=self.used,
            channels=n,
            monitored=sum(1 for h in self._histories.values() if h.attached),
            refused=self.refused,
            reclaimed=self.reclaimed,
        )
