"""What to ask an archiver for, and where its part ends (pure: times in, a plan out).

The part of a span older than the server's oldest kept point (`oldest`, kept at resolution
`own`: 0 for points, else a tier's bucket width) comes from the archive, asked as
`optimizedSample_K(PV)`: the archive's samples when it holds at most K of them, else bins of
[mean, std, min, max, count] of `width` seconds (the Archiver Appliance's bins: POSIX seconds
divided by the width, no bin for a span without samples). The width comes from LADDER, whose
steps divide or are multiples of the tiers' widths (10 s, 5 min), so that the archive's bins
and the server's buckets share their edges; `start` and `end` are on those edges, so the same
plot asked again within a bin asks the same thing (the cache's key).

The seam (`seam`): the archive's part ends where the server's begins, on an edge both sides
share: the archive's samples before `oldest` (its bins before `oldest` rounded up to the edge),
the server's rows from there on. No row twice, none missing."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LADDER_S", "Plan", "plan", "seam", "width_for"]

NS = 1_000_000_000
# Bin widths in seconds; past a day, whole days.
LADDER_S = (1, 2, 5, 10, 30, 60, 300, 600, 1800, 3600, 10_800, 21_600, 43_200, 86_400)


@dataclass(frozen=True, slots=True)
class Plan:
    """One read of an archiver: `optimizedSample_{points}` from `start` to `end` (ns, whole
    seconds), bins of `width` ns; the server's own rows begin at `oldest`, at resolution
    `own`."""

    start: int
    end: int
    width: int
    points: int
    oldest: int
    own: int

    @property
    def operator(self) -> str:
        return f"optimizedSample_{self.points}"


def width_for(span: int, points: int, own: int = 0) -> int:
    """The narrowest LADDER width (ns) holding `span` ns in at most `points` bins, at least 1 s
    and at least `own` (a tier's width, which LADDER's widths from it are multiples of)."""
    need = max(-(-span // max(points, 1)), NS, own)
    for w in LADDER_S:
        if w * NS >= need:
            return w * NS
    day = LADDER_S[-1] * NS
    return -(-need // day) * day


def _up(t: int, unit: int) -> int:
    return -(-t // unit) * unit


def plan(since: int, oldest: int, own: int, points: int, until: int | None = None) -> Plan:
    """The read of the archive's part of [since, oldest), joined to the server's rows of
    resolution `own` (ns; 0: points) that begin at `oldest`, for an answer of about `points`
    rows from `since` to `until` (default: `oldest`, the archive's part alone)."""
    span = (oldest if until is None else max(until, oldest)) - since
    width = width_for(span, points, own)
    end = _up(oldest, max(width, own))
    if width == NS and span < points * NS:
        # Finer than a second is asked: the samples themselves when they are at most `points`
        # (the archive's interval, (end - start) // K seconds, is then 1, its least).
        start = since // NS * NS
        return Plan(start, end, width, max(points, (end - start) // NS), oldest, own)
    start = since // width * width
    return Plan(start, end, width, (end - start) // width, oldest, own)


def seam(p: Plan, binned: bool) -> int:
    """Where the archive's part ends and the server's rows begin (ns): at `oldest` itself when
    both are samples; else at the first edge at or after it that the archive's bins (when
    `binned`) and the server's buckets share."""
    if not binned and not p.own:
        return p.oldest
    return _up(p.oldest, max(p.width, p.own) if binned else p.own)
