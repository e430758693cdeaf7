"""An archiver's answer as columns, and as the history's rows (pure: bytes and columns in,
columns out).

`Collected` reads a `getData.raw` answer through aa/pb.py's bounded `PbReader` into a
`Series` (aa/operators.py's columns: what the Archiver Appliance API writes), numbers only:
a string or a bytes value is refused with the reason. `rows_of` reads a Series as the history
reads its own rows (`HistorySlice`): the archive's samples as points (its disconnects, the
`cnxlostepsecs` field of the sample after one, as gap rows), or `optimized`'s bins
([mean, std, min, max, count] at each bin's middle) as buckets from the bin's start, their value
the mean (the archive keeps no last value of a bin). `rebin` folds points or buckets into wider
buckets, exactly as the tiers fold them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ...aa.operators import Series
from ...aa.pb import Chunk, PayloadType, PbReader, Sample, year_start
from ...wire.codec import GapKind
from ..history.layout import INVALID
from ..history.slices import HistorySlice

__all__ = [
    "ArchiveRefused",
    "Collected",
    "binned",
    "concat",
    "gap_row",
    "rebin",
    "rows_of",
]

NS = 1_000_000_000
_NUMERIC_VECTORS = {PayloadType.WAVEFORM_SHORT, PayloadType.WAVEFORM_FLOAT,
                    PayloadType.WAVEFORM_ENUM, PayloadType.WAVEFORM_INT,
                    PayloadType.WAVEFORM_DOUBLE, PayloadType.WAVEFORM_BYTE}  # fmt: skip
_BIN_COLUMNS = 5  # optimized's [mean, std, min, max, count]
_EPOCH_DIGITS = 10  # of a POSIX second whose nanoseconds an int64 holds


class ArchiveRefused(ValueError):
    """An answer in the format that pvwire cannot use (strings, a type that changes shape)."""


class Collected:
    """A `getData.raw` answer read as its bytes arrive: `feed`, then `close` and `series`."""

    def __init__(self, reader: PbReader) -> None:
        self.reader = reader
        self.ptype: PayloadType | None = None
        self.elements = 1
        self._t: list[int] = []
        self._v: list[Any] = []
        self._sev: list[int] = []
        self._stat: list[int] = []
        self._fields: dict[int, tuple[tuple[str, str], ...]] = {}
        self.headers: tuple[tuple[str, str], ...] = ()
        self._base = 0  # POSIX seconds of the current chunk's year

    def feed(self, data: bytes) -> None:
        self._take(self.reader.feed(data))

    def close(self) -> None:
        self._take(self.reader.close())

    def _take(self, events: Sequence[Chunk | Sample]) -> None:
        t, v, sev, stat, number = self._t, self._v, self._sev, self._stat, self._number
        for e in events:
            if isinstance(e, Chunk):
                self._chunk(e)
                continue
            if e.fields:
                self._fields[len(t)] = e.fields
            # Sample.time_ns, with its chunk's year start computed once, not per sample.
            t.append((self._base + e.secondsintoyear) * NS + e.nano)
            v.append(number(e.value))
            sev.append(e.severity)
            stat.append(e.status)

    def _chunk(self, c: Chunk) -> None:
        self._base = year_start(c.year)
        vector = c.type in _NUMERIC_VECTORS
        if not vector and c.type not in _SCALARS:
            raise ArchiveRefused(f"the archive holds {c.type.name} values of {c.pvname}, "
                                 "not numbers")  # fmt: skip
        if self.ptype is not None and self.ptype.vector != vector:
            raise ArchiveRefused(f"{c.pvname} changes from scalar to array in the archive")
        self.ptype = c.type
        self.headers = c.headers

    def _number(self, v: Any) -> Any:
        assert self.ptype is not None  # a Sample follows its Chunk (PbReader)
        if self.ptype.vector:
            row = np.frombuffer(v, np.int8) if isinstance(v, bytes) else np.asarray(v)
            if self._v and len(row) != len(self._v[0]):
                raise ArchiveRefused("an array changes length in the archive")
            return row.astype(np.float64)
        if isinstance(v, bytes):  # SCALAR_BYTE: one signed byte
            return float(int.from_bytes(v[:1], "little", signed=True))
        return float(v)

    def series(self) -> Series:
        ptype = self.ptype or PayloadType.SCALAR_DOUBLE
        n = len(self._t)
        if ptype.vector:
            width = len(self._v[0]) if n else 0
            value: Any = np.array(self._v, np.float64).reshape(n, width)
        else:
            width, value = 1, np.array(self._v, np.float64)
        t = np.array(self._t, np.int64)
        sev, stat = np.array(self._sev, np.int64), np.array(self._stat, np.int64)
        fields = self._fields
        if n and np.any(np.diff(t) < 0):  # chunks come a year at a time, in order: be sure
            order = np.argsort(t, kind="stable")
            value, t, sev, stat = value[order], t[order], sev[order], stat[order]
            where = np.empty(n, np.intp)
            where[order] = np.arange(n)
            fields = {int(where[i]): f for i, f in fields.items()}
        return Series(ptype, t, value, sev, stat, width, fields)


_SCALARS = {PayloadType.SCALAR_SHORT, PayloadType.SCALAR_FLOAT, PayloadType.SCALAR_ENUM,
            PayloadType.SCALAR_BYTE, PayloadType.SCALAR_INT, PayloadType.SCALAR_DOUBLE}  # fmt: skip


def _middle(width: int) -> int:
    """Where in its bin the Archiver Appliance stamps a bin (aa/operators.py `_times`)."""
    seconds = width // NS
    return (seconds // 2) * NS + (NS // 2 if seconds % 2 else 0)


def binned(s: Series, width: int) -> bool:
    """Whether `s` is `optimized`'s bins of `width` ns (not the samples it sends when it holds
    at most the points asked): 5-element double rows, each at its bin's middle."""
    if s.ptype != PayloadType.WAVEFORM_DOUBLE or s.elements != _BIN_COLUMNS or not len(s):
        return False
    offsets = s.t % width
    return bool(np.all(offsets == _middle(width)) or np.all(offsets == width // 2))


def _slice(resolution: int, t: Any, value: Any, lo: Any, hi: Any, mean: Any, count: Any,
           severity: Any, status: Any, gap: Any, since: int) -> HistorySlice:  # fmt: skip
    return HistorySlice(resolution, np.asarray(t, np.int64), np.asarray(value, np.float64),
                        np.asarray(lo, np.float64), np.asarray(hi, np.float64),
                        np.asarray(mean, np.float64), np.asarray(count, np.int64),
                        np.asarray(severity, np.int64), np.asarray(status, np.int64),
                        np.asarray(gap, np.bool_), False, since)  # fmt: skip


def gap_row(t: int, resolution: int = 0, kind: int = GapKind.AWAY) -> HistorySlice:
    """One gap row at `t`: nothing is known from there to the next row; `kind` says why."""
    nan = np.full(1, math.nan)
    return _slice(resolution, [t], nan, nan, nan, nan, [0], [INVALID], [kind], [True], t)


def rows_of(s: Series, width: int) -> HistorySlice:
    """`s` as the history's rows: bins of `width` ns when it is `optimized`'s bins, else its
    samples as points, with a gap row where the archive's engine says it lost the channel."""
    since = int(s.t[0]) if len(s) else 0
    if binned(s, width):
        v = s.value
        start = s.t // width * width
        gap = np.array([i in s.fields and any(k == "connectionChange" for k, _ in s.fields[i])
                        for i in range(len(s))], np.bool_)  # fmt: skip
        count = np.nan_to_num(v[:, 4]).astype(np.int64)
        return _slice(width, start, v[:, 0], v[:, 2], v[:, 3], v[:, 0], count, s.severity,
                      np.zeros(len(s), np.int64), gap, since)  # fmt: skip
    if s.ptype.vector:
        raise ArchiveRefused("the archive holds arrays of it; pvwire reads only scalars' past")
    v = s.value
    points = _slice(0, s.t, v, v, v, v, np.where(np.isnan(v), 0, 1), s.severity, s.status,
                    np.zeros(len(s), np.bool_), since)  # fmt: skip
    parts = []
    at = 0
    for i, f in sorted(s.fields.items()):
        t = _lost_at(f)
        before = int(s.t[i - 1]) if i else -1
        if t is not None and before < t < int(s.t[i]):
            parts += [_take(points, at, i), gap_row(t)]
            at = i
    if not parts:
        return points
    return concat([*parts, _take(points, at, len(points))])


def _lost_at(fields: tuple[tuple[str, str], ...]) -> int | None:
    """When (ns) the archive's engine says it lost the channel before this sample, from its
    `cnxlostepsecs`; None without one, or for one that is no count of seconds (the archiver's
    words: `isdigit` holds for "²" too, and int() refuses more than 4,300 digits)."""
    text = dict(fields).get("cnxlostepsecs", "")
    if not (text.isascii() and text.isdigit()) or len(text) > _EPOCH_DIGITS:
        return None
    return int(text) * NS


def _take(s: HistorySlice, lo: int, hi: int) -> HistorySlice:
    return HistorySlice(s.resolution, s.t[lo:hi], s.value[lo:hi], s.min[lo:hi], s.max[lo:hi],
                        s.mean[lo:hi], s.count[lo:hi], s.severity[lo:hi], s.status[lo:hi],
                        s.gap[lo:hi], s.truncated, s.since)  # fmt: skip


def select(s: HistorySlice, keep: npt.NDArray[np.bool_]) -> HistorySlice:
    """The rows of `s` where `keep` is set."""
    return HistorySlice(s.resolution, s.t[keep], s.value[keep], s.min[keep], s.max[keep],
                        s.mean[keep], s.count[keep], s.severity[keep], s.status[keep],
                        s.gap[keep], s.truncated, s.since)  # fmt: skip


def concat(parts: Sequence[HistorySlice], resolution: int | None = None) -> HistorySlice:
    """The rows of `parts` one after the other (their resolution, or `resolution`); `since` and
    `truncated` of the first."""
    first = parts[0]
    cat = np.concatenate
    return HistorySlice(
        first.resolution if resolution is None else resolution,
        cat([p.t for p in parts]), cat([p.value for p in parts]), cat([p.min for p in parts]),
        cat([p.max for p in parts]), cat([p.mean for p in parts]), cat([p.count for p in parts]),
        cat([p.severity for p in parts]), cat([p.status for p in parts]),
        cat([p.gap for p in parts]), first.truncated, first.since,
    )  # fmt: skip


def rebin(s: HistorySlice, width: int) -> HistorySlice:
    """Points, or buckets of a width that divides `width`, folded into buckets of `width` ns
    as a tier folds them: min, max, mean over the values held, the last value, the count, the
    highest severity, and a gap where any row was one. A bin of gaps alone is a gap row."""
    if s.resolution == width or not len(s):
        return HistorySlice(width, s.t, s.value, s.min, s.max, s.mean, s.count, s.severity,
                            s.status, s.gap, s.truncated, s.since)  # fmt: skip
    if s.resolution and width % s.resolution:
        raise ValueError(f"buckets of {s.resolution} ns do not fold into {width} ns")
    key = s.t // width
    starts = np.concatenate(([0], np.flatnonzero(np.diff(key)) + 1))
    held = (s.count > 0) & ~s.gap & ~np.isnan(s.mean if s.resolution else s.value)
    count = np.where(held, s.count, 0)
    total = np.where(held, (s.mean if s.resolution else s.value) * count, 0.0)
    n = np.add.reduceat(count, starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.add.reduceat(total, starts) / np.maximum(n, 1), math.nan)
    lo = np.minimum.reduceat(np.where(held, s.min, np.inf), starts)
    hi = np.maximum.reduceat(np.where(held, s.max, -np.inf), starts)
    lo[n == 0], hi[n == 0] = math.nan, math.nan
    # The last value held in each bin: the index of the latest held row at or before each row.
    latest = np.maximum.accumulate(np.where(held, np.arange(len(s)), -1))
    ends = np.append(starts[1:], len(s)) - 1
    last_at = latest[ends]
    last = np.where((last_at >= starts) & (n > 0), s.value[np.maximum(last_at, 0)], math.nan)
    return _slice(width, key[starts] * width, last, lo, hi, mean, n,
                  np.maximum.reduceat(s.severity, starts), np.zeros(len(starts), np.int64),
                  np.logical_or.reduceat(s.gap, starts), s.since)  # fmt: skip
