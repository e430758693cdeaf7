"""Tiers of buckets: each bucket the min, max, last value, count, highest severity and a gap
flag of its span (a scalar tier also its sum, for the mean). Each tier's open bucket is kept
apart and written to its ring when it closes; a closed bucket is merged into the next tier's
open bucket. `tier_for` is the one walk from the finest tier to the coarsest that every read
uses, for scalar and array tiers alike."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Self, TypeVar

import numpy as np
import numpy.typing as npt

from .layout import BUCKET_DTYPE, INVALID
from .slices import BucketRows

__all__ = ["ArrayTier", "Buckets", "Tier", "tier_for"]


class Buckets:
    """What both kinds of tier share: one bucket open at a time, keyed by `t // width`, closed
    when a point or bucket of a later one comes; a ring of `size` closed ones, `n` closed so far;
    the next (coarser) tier that each closed bucket is merged into."""

    __slots__ = ("key", "n", "next", "width")
    key: int  # t // width of the open bucket; -1: none open
    n: int  # buckets closed so far; the next goes to n % size
    next: Self | None
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

    @property
    def size(self) -> int:
        raise NotImplementedError

    @property
    def wrapped(self) -> bool:
        return self.n >= self.size

    def rows(self, finer: list[Self]) -> BucketRows:
        """Every bucket held, oldest first, the open one last (copies). `finer`: the tiers before
        this one, coarsest first, whose open buckets are not merged into this one yet."""
        raise NotImplementedError


B = TypeVar("B", bound=Buckets)


def tier_for(
    finest: B,
    since: int,
    select: Callable[[B, BucketRows], BucketRows] | None = None,
    most: int | None = None,
) -> tuple[B, BucketRows]:
    """The finest tier that reaches back to `since`, else the coarsest, with its rows (each
    tier's with the open buckets of the finer ones merged). With `select`, a tier's selected
    rows, and only a tier with at most `most` of them will do."""
    tier = finest
    finer: list[B] = []
    while True:
        rows = tier.rows(finer)
        finer.insert(0, tier)
        reaches = not tier.wrapped or (len(rows) and rows.t[0] <= since)
        if select is not None:
            rows = select(tier, rows)
        if (reaches and (most is None or len(rows) <= most)) or tier.next is None:
            return tier, rows
        tier = tier.next


class Tier(Buckets):
    """One ring of scalar buckets (BUCKET_DTYPE rows), with its open bucket in plain attributes."""

    __slots__ = ("count", "data", "gap", "last", "max", "min", "sev", "sum")

    def __init__(self, width: int, size: int, following: Self | None) -> None:
        self.width = width
        self.data = np.zeros(size, BUCKET_DTYPE)
        self.n = 0
        self.next = following
        self.key = -1
        self.min = self.max = self.sum = self.last = math.nan
        self.count = self.sev = self.gap = 0

    @property
    def size(self) -> int:
        return len(self.data)

    def add_bucket(
        self, t: int, mn: float, mx: float, s: float, last: float, count: int, sev: int, gap: int
    ) -> None:
        """Merge a closed bucket of the tier before (whose start is `t`), or a fold's."""
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

    def rows(self, finer: list[Tier]) -> BucketRows:
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
        return BucketRows.of(np.concatenate((closed, tail)))


class ArrayTier(Buckets):
    """A tier of array buckets: the last frame and the element-wise min and max of each (NaN
    elements ignored), its open bucket in `o_*`."""

    __slots__ = ("count", "gap", "hi", "last", "lo", "o_count", "o_gap", "o_hi", "o_last", "o_lo",
                 "o_sev", "sev", "t")  # fmt: skip

    def __init__(self, width: int, size: int, elements: int, following: Self | None) -> None:
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
        self.o_last = np.full(elements, math.nan)
        self.o_lo = np.full(elements, math.nan)
        self.o_hi = np.full(elements, math.nan)
        self.o_count = self.o_sev = self.o_gap = 0

    @property
    def size(self) -> int:
        return len(self.t)

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

    def rows(self, finer: list[ArrayTier]) -> BucketRows:
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
        return BucketRows(
            t=np.concatenate((self.t[order], scratch.t[tail])),
            last=np.concatenate((self.last[order], scratch.last[tail])),
            lo=np.concatenate((self.lo[order], scratch.lo[tail])),
            hi=np.concatenate((self.hi[order], scratch.hi[tail])),
            total=None,
            count=np.concatenate((self.count[order], scratch.count[tail])).astype(np.int64),
            sev=np.concatenate((self.sev[order], scratch.sev[tail])).astype(np.int64),
            gap=np.concatenate((self.gap[order], scratch.gap[tail])) != 0,
        )
