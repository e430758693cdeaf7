"""One channel's history: its raw ring of the last RAW_POINTS updates, its tiers, and (an array
channel) its `ArrayHistory`. A store's history is written through the store's journal into its
row of the store's rings; a bare one (no store: tests, benchmarks) into rings of its own."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from .. import history as package  # its compiled parts, read at each use (the package says why)
from . import fallback, reading
from .arrays import ArrayHistory, array_bytes
from .layout import (
    AGGREGATE_EVERY,
    CHANNEL_BYTES,
    GAP_ALARM,
    INVALID,
    NS,
    RAW_DTYPE,
    RAW_POINTS,
    TIERS,
)
from .slices import HistorySlice, RawRows
from .tiers import Tier

if TYPE_CHECKING:
    from .journal import Journal
    from .store import HistoryStore

__all__ = ["JOURNAL_SLOTS", "ChannelHistory", "PendingSource"]

_NUMBERS = (int, float, bool)
_LAST = RAW_POINTS - 1


class PendingSource(Protocol):
    """A channel holding an update not yet written (`Channel.on_update`)."""

    history_pending: bool

    def write_pending(self) -> None: ...


# The slots core/_journal.c's `Rings` reads and moves on at each flush by member offset: each a
# writable slot of ChannelHistory itself, `i` and `folded` ints in 0..RAW_POINTS-1, `wrapped` a
# bool. The package checks this against the C side's list at import, where `Rings` is made.
JOURNAL_SLOTS = ("i", "folded", "wrapped")


class ChannelHistory:
    """One channel's buffers. `record` and `mark_gap` are called by its Channel."""

    # Three of these are read and written by core/_journal.c by member offset: JOURNAL_SLOTS.
    __slots__ = ("_a", "_t", "_v", "arrays", "attached", "channel_id", "failed", "first",
                 "folded", "i", "journal", "kind", "no_room", "numeric", "pinned", "ring_a",
                 "ring_t", "ring_v", "slot", "source", "store", "tier", "unkept",
                 "wrapped")  # fmt: skip

    def __init__(self, channel_id: str, store: HistoryStore | None = None, slot: int = -1) -> None:
        self.channel_id = channel_id
        # Where its arrays' bytes are asked for; None: arrays are not kept (a bare history).
        self.store = store
        self.slot = slot  # its row of the store's rings; -1: rings of its own
        self.journal: Journal | None = store.journal if store is not None and slot >= 0 else None
        # The channel recording into it (set by `Channel.record_into`), whose last update may
        # still wait for the tick: written before any read, gap or reclaim (`_sync`).
        self.source: PendingSource | None = None
        self.arrays: ArrayHistory | None = None  # an array channel's frames
        self.unkept = ""  # why the last value that was not a number was not kept
        self.no_room = False  # the store refused its arrays since it was last attached (opened)
        # The raw ring as three columns: IOC time (ns), value, and alarm (severity << 8 |
        # status; GAP_ALARM for a gap). A bare history writes them through memoryviews
        # (`ring_*`): about half the cost of numpy's item assignment, nothing allocated, and a
        # "d" view refuses anything but a number with a TypeError. A store's history is written
        # by the journal's flush only, and has no views.
        # (typed Any: typeshed's memoryview takes ints only, a "d" view takes floats too)
        self.ring_t: Any
        self.ring_v: Any
        self.ring_a: Any
        if self.journal is not None and store is not None:
            self._t, self._v, self._a = store.raw_t[slot], store.raw_v[slot], store.raw_a[slot]
            self.ring_t = self.ring_v = self.ring_a = None
            # Its row's pages are mapped now, when its channel is opened, not all at once at a
            # journal flush after many channels opened (tens of ms on the event loop at 1,000).
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
        were about half of what recording cost. tests/test_history.py checks that both record
        the same."""
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

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of one row's value: () for a number, (elements,) for an array frame."""
        return (self.arrays.elements,) if self.arrays is not None else ()

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
        fold = package._fold or fallback.fold
        for row in fold(self._t, self._v, self._a, start, k, tier.width):
            tier.add_bucket(*row, 0)  # start, min, max, sum, last, count, severity; no gap

    # --- reading ------------------------------------------------------------------------------

    def raw(self) -> RawRows:
        """The raw ring, oldest first (the journal flushed first)."""
        n = self.n
        idx = np.arange(self.i - n, self.i) % RAW_POINTS
        return RawRows(self._t[idx], self._a[idx], idx, self._v)

    def points(self) -> npt.NDArray[Any]:
        """The raw ring, oldest first, as RAW_DTYPE rows (a copy)."""
        raw = self.raw()
        gap = raw.gap
        out = np.empty(len(raw), RAW_DTYPE)
        out["t"] = raw.t
        out["v"] = raw.v
        out["sev"] = np.where(gap, INVALID, raw.a >> 8)
        out["stat"] = np.where(gap, 0, raw.a & 0xFF)
        out["gap"] = gap
        return out

    def query(self, since: int, until: int, max_points: int) -> HistorySlice:
        """Rows with since <= t <= until (ns), points or buckets (`reading.query` chooses). An
        array channel answers with its frames."""
        self._sync()
        if self.arrays is not None:
            return self.arrays.query(since, until, max_points)
        self._aggregate()
        return reading.query(self, since, until, max_points)

    def backfill(self, since: int, limit: int | None = None) -> list[HistorySlice]:
        """What a subscription's `backfill` sends before its snapshot (PROTOCOL.md section 2.8,
        `reading.backfill`): `limit` rows at most, for a backfill sent a message at a time. An
        array channel sends its frames the same way."""
        self._sync()
        if self.arrays is not None:
            return self.arrays.backfill(since, limit)
        self._aggregate()
        return reading.backfill(self, since, limit)

    def rings(self) -> reading.Held:
        """Its rings as a reader of them sees them (the Archiver Appliance API, pvwire/aa/):
        every update written and folded into the tiers first. An array channel's frames."""
        self._sync()
        if self.arrays is not None:
            return self.arrays
        self._aggregate()
        return self

    def backfills_from(self, since: int) -> bool:
        """Whether `backfill(since)` has a row to give, in O(1) (`reading.backfills_from`), so
        that a backfill passes over an idle channel without reading it. Its points still in its
        channel or the journal are written first, as for a read: an idle store's journal is
        flushed once, not at every channel."""
        self._sync()
        if self.arrays is not None:
            return self.arrays.backfills_from(since)
        n = RAW_POINTS if self.wrapped else self.i  # `n`, synced once
        return reading.backfills_from(self._t, self._a, self.i, n, since)
