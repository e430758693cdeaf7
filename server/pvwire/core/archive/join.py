"""The archive's part and the server's own rows as one answer (pure: plans and columns in).

`span` is GraphQL `history`'s answer across the seam: one resolution for every row, the
finest that holds the span in the points asked (plan.py), both parts folded into it where
they are finer (`series.rebin`, exact), or the samples of both when they are few enough.
`past` is a backfill's archive part, sent before the server's own rows at their own
resolution. Either starts with the archive's last row before `since` when it has one (the
value a plot starts with, as the Archiver Appliance answers); where the archive holds nothing
a gap row stands at `since`, and where it could not be read a gap row says why (`Note`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ...aa.operators import Series
from ...aa.times import iso
from ...wire.codec import GapKind
from ..history.slices import HistorySlice
from .plan import Plan, seam
from .series import binned, concat, gap_row, rebin, rows_of, select

__all__ = ["EMPTY", "JOINED", "MISSING", "NOT_NEEDED", "Note", "empty", "missing", "past", "span"]

JOINED = "JOINED"  # the archive's rows come first, up to the seam
EMPTY = "EMPTY"  # the archive holds nothing there: a gap row at `since`
MISSING = "MISSING"  # the archive could not be read: a gap row at `since`, the reason
NOT_NEEDED = "NOT_NEEDED"  # the server's own history reaches back to `since`


@dataclass(frozen=True, slots=True)
class Note:
    """What became of an answer's archive part."""

    state: str
    reason: str = ""
    rows: int = 0  # the answer's first rows that came from the archive
    seam: int = 0  # ns: the archive's rows end before it, the server's begin at it


def _from(rows: HistorySlice, since: int) -> HistorySlice:
    """Rows reaching past `since` (a bucket's end after it), and the last one before."""
    end = rows.t + max(rows.resolution, 1)
    before = np.flatnonzero(end <= since)
    keep = end > since
    if len(before):
        keep[before[-1]] = True
    return select(rows, keep)


def empty(resolution: int, since: int) -> HistorySlice:
    """No rows."""
    return select(gap_row(since, resolution), np.zeros(1, np.bool_))


def span(p: Plan, own: HistorySlice | None, archived: Series, since: int, until: int,
         points: int, pv: str) -> tuple[HistorySlice, Note]:  # fmt: skip
    """GraphQL `history` from `since` to `until` (ns) in about `points` rows: the archive's
    answer to `p` joined to the server's rows `own` (None: it holds none)."""
    mine = own if own is not None else empty(p.own, since)
    arch = rows_of(archived, p.width)
    if not len(arch):
        why = f"the archive holds no data of {pv} before {iso(p.oldest)}"
        return concat([gap_row(since, mine.resolution), mine]), Note(EMPTY, why, 0, p.oldest)
    if not binned(archived, p.width) and not mine.resolution:
        cut = min(p.oldest, until + 1)
        a = _from(select(arch, arch.t < cut), since)
        if len(a) + len(mine) <= points:  # the samples of both
            return _since(concat([a, mine], 0), a), Note(JOINED, "", len(a), cut)
    width = max(p.width, mine.resolution)
    cut = min(seam(p, True), -(-(until + 1) // width) * width)
    folded = rebin(arch, width)
    a = _from(select(folded, folded.t < cut), since)
    o = rebin(mine, width)
    joined = concat([a, select(o, o.t >= cut)], width)
    if len(joined) > points:  # as `query` does: the newest are kept
        newest = np.arange(len(joined)) >= len(joined) - points
        joined = dataclasses.replace(select(joined, newest), truncated=True)
    return _since(joined, a), Note(JOINED, "", int(np.count_nonzero(joined.t < cut)), cut)


def _since(joined: HistorySlice, archived: HistorySlice) -> HistorySlice:
    """`since`: the oldest time the answer holds, the archive's first row's when it has one."""
    if not len(archived):
        return joined
    return dataclasses.replace(joined, since=int(archived.t[0]))


def missing(own: HistorySlice | None, since: int, reason: str, resolution: int = 0
            ) -> tuple[HistorySlice, Note]:  # fmt: skip
    """The server's rows, after a gap row at `since`: the archive part is missing."""
    mine = own if own is not None else empty(resolution, since)
    gap = gap_row(since, mine.resolution, GapKind.ARCHIVE)
    return concat([gap, mine]), Note(MISSING, reason)


def past(p: Plan, archived: Series, since: int, cut: int, dropped: bool = False
         ) -> tuple[HistorySlice, int]:  # fmt: skip
    """A backfill's archive part of `p`, and where the server's rows go on from (ns): the
    seam; or, when `cut` (the time of the value the snapshot carries, which no row may reach)
    comes first, the bin edge before the server's oldest row (or `cut` itself). An archived bin
    not sent that holds samples from before the server's rows begin is a gap row at its start
    (its samples are in no row), as the seam is when the server `dropped` rows it held when the
    read began. An archive with nothing there gives a gap row at `since`."""
    arch = rows_of(archived, p.width)
    bins = binned(archived, p.width)
    at = seam(p, bins)
    if at > cut:
        at = min(p.oldest // p.width * p.width if bins else p.oldest, cut)
    if bins:
        keep = arch.t + p.width <= at
        rows = _from(select(arch, keep), since)
        later = arch.t[~keep]
        if len(later) and int(later[0]) < min(p.oldest, cut):
            hole = gap_row(int(later[0]), p.width)
            rows = concat([rows, hole]) if len(rows) else hole
    else:
        rows = _from(select(arch, arch.t < at), since)
    if not len(rows):
        return gap_row(since, arch.resolution), at
    if dropped:
        rows = concat([rows, gap_row(max(at, int(rows.t[-1]) + 1), rows.resolution)])
    return rows, at
