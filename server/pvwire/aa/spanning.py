"""The Archiver Appliance API reaching past the history into the facility's archive (--archiver;
core/archive/): a PV's answer older than the server's oldest kept row comes from its archiver,
the rest from the server's own rows, joined at a seam both share.

Where the seam is (`plan`): the server's oldest kept point for samples as they were (on a
tier's edge when its oldest rows are buckets); for a post-processor of N s bins, the first edge
at or after it that N s bins and the server's buckets share. The archive is asked for the same
operator up to the seam, and its answer older than the seam is the answer's first part (each
bin from one side only, so no sample counts twice); the server computes the rest from the
seam on. `optimized_N` and `optimLastSample_N`, whose bins depend on the whole range, are
computed by the server over both parts' rows: the archive's samples, or its bins of the same
width (`optimizedSample_N` over the whole range), read as buckets. `ncount` adds both counts;
`nth_N` takes every N-th sample of each part."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.archive.series import rows_of
from ..core.history.reading import Held, oldest
from . import source
from .operators import Operator, Rows, Series, bin_seconds, compute
from .pb import PayloadType

__all__ = ["Part", "Wanted", "join", "plan", "seam_of"]

NS = 1_000_000_000
_OPTIMIZED = ("optimized", "optimLastSample")


@dataclass(frozen=True, slots=True)
class Wanted:
    """One archive read: `operator` ("" for none) from `start` to `end` (ns), joined at `seam`."""

    operator: str
    start: int
    end: int
    seam: int


@dataclass(frozen=True, slots=True)
class Part:
    """What the archive gave for one PV of a request: its answer, or None and why not."""

    seam: int
    series: Series | None
    reason: str = ""


def _up(t: int, unit: int) -> int:
    return -(-t // unit) * unit


def seam_of(rings: Held | None, until: int) -> tuple[int, int]:
    """(ns, resolution) where the server's own rows begin; past `until` when it holds none."""
    if rings is None:
        return until + 1, 0
    first, own = oldest(rings)
    return (first, own) if first else (until + 1, 0)


def plan(op: Operator | None, since: int, until: int, first: int, own: int) -> Wanted:
    """The archive read of a request for `op` from `since` to `until`, whose server rows begin
    at `first`, at resolution `own` (ns)."""
    if op is None or op.name in ("nth", "ncount"):
        at = _up(first, own) if own else first
        return Wanted(op.spelled if op is not None else "", since, at, at)
    width = bin_seconds(op, since, until) * NS
    at = _up(first, math.lcm(width, own) if own else width)
    if op.name in _OPTIMIZED:
        # Over the whole range, so that the archive answers its samples when it holds at most
        # N of them there, else bins of the same width (its interval: range / N); what lies
        # past the seam is dropped.
        start = since // NS * NS
        return Wanted(f"optimizedSample_{op.n}", start, start + op.n * width, at)
    return Wanted(op.spelled, since, at, at)


def _take(s: Series, keep: np.ndarray) -> Series:
    idx = np.flatnonzero(keep)
    value = [s.value[i] for i in idx] if isinstance(s.value, list) else s.value[idx]
    fields = {j: s.fields[i] for j, i in enumerate(idx.tolist()) if i in s.fields}
    return Series(s.ptype, s.t[idx], value, s.severity[idx], s.status[idx], s.elements, fields)


def _concat(a: Series, b: Series, ptype: PayloadType) -> Series:
    if not len(a):
        return Series(ptype, b.t, b.value, b.severity, b.status, b.elements, b.fields)
    if not len(b):
        return Series(ptype, a.t, a.value, a.severity, a.status, a.elements, a.fields)
    fields = {**a.fields, **{len(a) + i: f for i, f in b.fields.items()}}
    value = np.concatenate((np.asarray(a.value, np.float64), np.asarray(b.value, np.float64)))
    return Series(ptype, np.concatenate((a.t, b.t)), value,
                  np.concatenate((a.severity, b.severity)), np.concatenate((a.status, b.status)),
                  b.elements, fields)  # fmt: skip


def _aggregate(r: Rows, width: int) -> Rows:
    """Points as the buckets they are of themselves (a NaN holds nothing)."""
    if r.width:
        return r
    held = ~np.isnan(r.value) & ~r.gap
    return Rows(r.t, r.value, np.where(held, r.value, np.inf), np.where(held, r.value, -np.inf),
                np.where(held, r.value, 0.0), np.where(held, 1, 0).astype(np.int64), r.severity,
                r.status, r.gap, width)  # fmt: skip


def _joined(a: Rows, b: Rows) -> Rows:
    if a.width or b.width:
        width = max(a.width, b.width)
        a, b = _aggregate(a, width), _aggregate(b, width)
    cat = np.concatenate
    return Rows(cat((a.t, b.t)), cat((a.value, b.value)), cat((a.lo, b.lo)), cat((a.hi, b.hi)),
                cat((a.total, b.total)), cat((a.count, b.count)), cat((a.severity, b.severity)),
                cat((a.status, b.status)), cat((a.gap, b.gap)), max(a.width, b.width))  # fmt: skip


def join(op: Operator | None, part: Part, own: Rows, ptype: PayloadType, since: int,
         until: int) -> Series:  # fmt: skip
    """The answer to `op` from `since` to `until`: the archive's `part` before its seam, the
    server's rows `own` (every row up to `until`, as `source.rows_of` reads them from the seam)
    after it. `ptype`: the channel's own type, which samples as they were are answered as."""
    at, archived = part.seam, part.series
    if op is not None and op.name in _OPTIMIZED:
        mine = own.take(own.t >= at)
        if archived is None or not len(archived):
            return compute(op, mine, ptype, since, until)
        width = bin_seconds(op, since, until) * NS
        theirs = source.as_rows(rows_of(archived, width))
        theirs = theirs.take(theirs.t + theirs.width <= at if theirs.width else theirs.t < at)
        return compute(op, _joined(theirs, mine), ptype, since, until)
    answer = compute(op, own, ptype, at, until)
    if op is not None and op.name == "ncount":
        total = float(np.sum(answer.value)) + (float(np.sum(archived.value)) if archived else 0.0)
        return Series(answer.ptype, np.array([since // 1_000_000 * 1_000_000]),
                      np.array([total]), np.zeros(1, np.int64), np.zeros(1, np.int64))  # fmt: skip
    answer = _take(answer, answer.t >= at)
    if archived is None:
        return answer
    # Samples as they were come as the channel's type; the archive's alone, as its own.
    kind = answer.ptype if len(own) or op is not None else archived.ptype
    return _concat(_take(archived, archived.t < at), answer, kind)
