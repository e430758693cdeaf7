"""Small arrays' history, opt-in (`--history-array-max N`, 0 = off): a 1-D numeric array
channel of at most N elements gets an `ArrayHistory` on its first array, which
`ChannelHistory.record` hands every frame to (an ndarray is never the scalar fast path's type):
- a raw ring of whole frames (IOC time, the elements as float64, alarm);
- the same tiers as a scalar channel's, each bucket holding its last frame and the element-wise
  min and max, count, highest severity and gap flag (no mean: `HistorySlice` says why).
Frames are folded into the finest tier as they come, one element-wise min and max per frame: an
array update already costs its encoding, and no ring of waiting frames is kept.

One channel's rings are held under HISTORY_ARRAY_BYTES (limits.py): half for the raw ring, a
quarter per tier; an array too wide for RAW_POINTS frames or a tier's buckets in its share gets
fewer (1,024 elements: 255 frames and 42 buckets per tier, so the tiers cover 7 min and 3.5 h).
The width is the first frame's: a frame of another length starts the array history again (one
answer has one width)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from ...limits import HISTORY_ARRAY_BYTES
from . import reading
from .layout import GAP_ALARM, RAW_POINTS, TIERS
from .slices import HistorySlice, RawRows
from .tiers import ArrayTier

__all__ = ["ArrayHistory", "array_bytes", "array_sizes"]


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


class ArrayHistory:
    """One array channel's frames: a raw ring of whole frames and tiers of array buckets.
    `ChannelHistory` owns it and hands it every frame of its width."""

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

    def raw(self) -> RawRows:
        """The frames held, oldest first."""
        idx = np.arange(self.i - self.n, self.i) % len(self._t)
        return RawRows(self._t[idx], self._a[idx], idx, self._v)

    def query(self, since: int, until: int, max_points: int) -> HistorySlice:
        """As ChannelHistory.query, with rows of frames."""
        return reading.query(self, since, until, max_points)

    def backfill(self, since: int, limit: int | None = None) -> list[HistorySlice]:
        """As ChannelHistory.backfill. `limit` counts values: a row of frames is `elements` of
        them (at least one row is given)."""
        rows = None if limit is None else max(1, limit // self.elements)
        return reading.backfill(self, since, rows)

    def backfills_from(self, since: int) -> bool:
        """As ChannelHistory.backfills_from."""
        return reading.backfills_from(self._t, self._a, self.i, self.n, since)
