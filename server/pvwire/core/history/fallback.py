"""What core/_journal.c does, in Python and numpy, where it is not built (a checkout before
`make ext`): the journal's writer (`PyWriter`), its flush into the rings (`flush`) and the fold
of a ring's points into buckets (`fold`). tests/test_journal.py runs the same cases through both
and checks they give the same columns and buckets, to the bit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .layout import AGGREGATE_EVERY, NS, RAW_POINTS, FoldedBucket

if TYPE_CHECKING:
    from .store import HistoryStore

__all__ = ["PyWriter", "flush", "fold"]


class PyWriter:
    """The journal's writer in Python: the same columns, checks and errors as `_journal.Writer`.

    `write(value, seconds, nanoseconds, severity, status, slot)` puts one point at `j` and
    answers whether the columns are full. TypeError for a value that is not a number, ValueError
    for anything out of its column's range (a severity above 255, a time past 2262); a point
    that raises is not counted."""

    __slots__ = ("_a", "_c", "_t", "_v", "j", "size")

    def __init__(self, t: npt.NDArray[np.int64], v: npt.NDArray[np.float64],
                 a: npt.NDArray[np.uint16], c: npt.NDArray[np.int32]) -> None:  # fmt: skip
        if not len(t) == len(v) == len(a) == len(c):
            raise ValueError("Writer: the four columns must be of one length")
        # Written through memoryviews (typed Any: a "d" view takes floats), which refuse what
        # the columns cannot hold as the compiled writer does.
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


def fold(t: npt.NDArray[np.int64], v: npt.NDArray[np.float64], a: npt.NDArray[np.uint16],
         start: int, k: int, width: int) -> list[FoldedBucket]:  # fmt: skip
    """As `_journal.fold`: the k points of a ring from `start` on (across its end) as buckets
    of `width` ns, (start, min, max, sum, last, count, highest severity) per run of one
    t // width."""
    idx = (start + np.arange(k)) % len(t)
    t, v, a = t[idx], v[idx], a[idx]
    keys = t // width
    cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [k]))
    low = np.minimum.reduceat(v, starts)
    high = np.maximum.reduceat(v, starts)
    total = np.add.reduceat(v, starts)
    sev = np.maximum.reduceat(a >> 8, starts)
    return [
        (int(keys[s]) * width, float(low[j]), float(high[j]), float(total[j]), float(v[e - 1]),
         e - s, int(sev[j]))
        for j, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True))
    ]  # fmt: skip


def flush(t: npt.NDArray[np.int64], v: npt.NDArray[np.float64], a: npt.NDArray[np.uint16],
          c: npt.NDArray[np.int32], store: HistoryStore) -> None:  # fmt: skip
    """As `_journal.Rings.flush`: the journal's points (columns of its n points, c their slots)
    into their channels' rings, in order, with one stable sort by slot and one scatter per
    column; then each channel among them moves its index on. A channel with more points than
    may wait for the tiers (one much faster than the others, or alone) gets its points in
    chunks, folded between them."""
    n = len(c)
    order = np.argsort(c, kind="stable")
    c = c[order]
    t, v, a = t[order], v[order], a[order]
    starts = np.flatnonzero(np.concatenate(([True], c[1:] != c[:-1])))
    counts = np.diff(np.append(starts, n))
    held = store.by_slot
    histories = [held[k] for k in c[starts].tolist()]
    burst = counts > AGGREGATE_EVERY
    if burst.any():
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
    # points, as one index into the rows laid end to end (one repeat, a mask for the modulo
    # and a flat index: half the time of two repeats, % and a 2-D index).
    pos = (np.repeat(base - starts, counts) + np.arange(len(c))) & (RAW_POINTS - 1)
    flat = c * np.int64(RAW_POINTS) + pos
    store.raw_t.reshape(-1)[flat] = t
    store.raw_v.reshape(-1)[flat] = v
    store.raw_a.reshape(-1)[flat] = a
    for h, k in zip(histories, counts.tolist(), strict=True):
        if h is not None:
            h.advance(k)
