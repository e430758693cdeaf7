"""What a history answers (`HistorySlice`), and the two kinds of rows it is made from: raw
points (`RawRows`) and buckets (`BucketRows`). A scalar channel's rows hold one value per row,
an array channel's a row of elements (ndim 2); everything else is the same for both."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .layout import GAP_ALARM, INVALID


@dataclass(frozen=True, slots=True)
class HistorySlice:
    """What `ChannelHistory.query` returns: points or buckets, oldest first, as columns.

    For points (`resolution` 0) min = max = mean = value and count = 1. A gap is a row of its own
    with `gap` set and value NaN (buckets: `gap` set if the channel was away in that span).
    An array channel's `value`, `min` and `max` have a row of elements per row (ndim 2) and its
    `mean` is NaN (not kept for arrays: a sum per element would cost a fourth frame per bucket
    for a figure a strip chart of arrays does not draw)."""

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

    @classmethod
    def gap_row(cls, t: int, elements: tuple[int, ...], status: int, oldest: int) -> HistorySlice:
        """One gap row at `t` (a point): value NaN (a row of `elements` NaN for an array
        channel), severity INVALID, and `status` the protocol's GapKind, why it is there."""
        nan = np.full((1, *elements), math.nan)
        return cls(
            resolution=0, t=np.array([t], np.int64), value=nan, min=nan, max=nan,
            mean=np.full(1, math.nan), count=np.zeros(1, np.int64),
            severity=np.full(1, INVALID, np.int64), status=np.full(1, status, np.int64),
            gap=np.ones(1, np.bool_), truncated=False, since=oldest,
        )  # fmt: skip

    def then(self, after: HistorySlice) -> HistorySlice:
        """These rows, then `after`'s (both of one resolution), as one answer."""
        assert self.resolution == after.resolution

        def join(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return np.concatenate((a, b))

        return HistorySlice(
            resolution=self.resolution, t=join(self.t, after.t),
            value=join(self.value, after.value), min=join(self.min, after.min),
            max=join(self.max, after.max), mean=join(self.mean, after.mean),
            count=join(self.count, after.count), severity=join(self.severity, after.severity),
            status=join(self.status, after.status), gap=join(self.gap, after.gap),
            truncated=after.truncated, since=self.since,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RawRows:
    """Points of a raw ring, oldest first: their IOC times and alarms (severity << 8 | status;
    GAP_ALARM for a gap) as copies, and where they lie in the ring, whose values (a frame each,
    for arrays) are copied only for the rows an answer keeps."""

    t: npt.NDArray[np.int64]
    a: npt.NDArray[np.uint16]
    idx: npt.NDArray[np.intp]
    ring: npt.NDArray[np.float64]  # the ring's value column (rows of frames for arrays)

    def __getitem__(self, sel: Any) -> RawRows:
        return RawRows(self.t[sel], self.a[sel], self.idx[sel], self.ring)

    def __len__(self) -> int:
        return len(self.t)

    @property
    def v(self) -> npt.NDArray[np.float64]:
        return self.ring[self.idx]

    @property
    def gap(self) -> npt.NDArray[np.bool_]:
        gap: npt.NDArray[np.bool_] = self.a == GAP_ALARM
        return gap

    def slice(self, oldest: int, truncated: bool) -> HistorySlice:
        gap = self.gap
        v = self.v
        return HistorySlice(
            resolution=0,
            t=self.t.astype(np.int64),
            value=v,
            min=v,
            max=v,
            mean=v if v.ndim == 1 else np.full(len(v), math.nan),
            count=np.where(gap, 0, 1).astype(np.int64),
            severity=np.where(gap, INVALID, self.a >> 8).astype(np.int64),
            status=np.where(gap, 0, self.a & 0xFF).astype(np.int64),
            gap=gap,
            truncated=truncated,
            since=oldest,
        )


@dataclass(frozen=True, slots=True)
class BucketRows:
    """Buckets of a tier (copies), as columns. `total`: the sum of each bucket's values, for
    its mean; None for arrays, which keep no mean."""

    t: npt.NDArray[np.int64]  # the bucket's start
    last: npt.NDArray[np.float64]
    lo: npt.NDArray[np.float64]
    hi: npt.NDArray[np.float64]
    total: npt.NDArray[np.float64] | None
    count: npt.NDArray[np.int64]
    sev: npt.NDArray[np.int64]
    gap: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, rows: npt.NDArray[Any]) -> BucketRows:
        """The columns of BUCKET_DTYPE rows."""
        return cls(
            t=rows["t"].astype(np.int64),
            last=rows["last"].astype(np.float64),
            lo=rows["min"].astype(np.float64),
            hi=rows["max"].astype(np.float64),
            total=rows["sum"].astype(np.float64),
            count=rows["count"].astype(np.int64),
            sev=rows["sev"].astype(np.int64),
            gap=rows["gap"] != 0,
        )

    def __getitem__(self, sel: Any) -> BucketRows:
        total = None if self.total is None else self.total[sel]
        return BucketRows(self.t[sel], self.last[sel], self.lo[sel], self.hi[sel], total,
                          self.count[sel], self.sev[sel], self.gap[sel])  # fmt: skip

    def __len__(self) -> int:
        return len(self.t)

    def slice(self, width: int, truncated: bool, oldest: int) -> HistorySlice:
        n = len(self.t)
        if self.total is None:
            mean = np.full(n, math.nan)
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(self.count > 0, self.total / np.maximum(self.count, 1), np.nan)
        return HistorySlice(
            resolution=width, t=self.t, value=self.last, min=self.lo, max=self.hi,
            mean=mean.astype(np.float64), count=self.count, severity=self.sev,
            status=np.zeros(n, np.int64), gap=self.gap, truncated=truncated, since=oldest,
        )  # fmt: skip
