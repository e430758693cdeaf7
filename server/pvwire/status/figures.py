"""The status PVs' values, from the hub's snapshots (the ones `/metrics` reads): counters become
rates and the tick histogram a 99th percentile, both over the last `window` seconds of
snapshots, so a single event stays visible for that long and an archiver sampling once a
second sees no holes. I/O-free: snapshots in, figures out."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.stats import HubSnapshot
from ..core.tick import TICK_BUCKETS_MS

__all__ = ["Figures", "Window", "quantile"]

Figures = dict[str, float | int | str]


@dataclass(frozen=True, slots=True)
class _Counters:
    at: float  # monotonic seconds the snapshot was taken
    updates: int
    deliveries: int
    bytes: int
    conflated: int
    dropped: int
    refusals: int
    tick_buckets: tuple[int, ...]

    @classmethod
    def of(cls, at: float, s: HubSnapshot) -> _Counters:
        refusals = (
            sum(s.auth_refusals.values())
            + sum(s.put_refusals.values())
            + sum(n for counts in s.peer_refusals.values() for n in counts.values())
        )  # a hostile peer's replies are trouble too
        return cls(at, s.updates_in, s.deliveries, s.bytes_out, s.conflated, s.dropped,
                   refusals, s.tick_buckets)  # fmt: skip


class Window:
    """The last `seconds` of snapshots' counters, and the figures they give."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._held: deque[_Counters] = deque()

    def figures(self, at: float, s: HubSnapshot, ready: bool, version: str) -> Figures:
        """The figures of snapshot `s`, taken at monotonic time `at`, with the window's rates."""
        now = _Counters.of(at, s)
        held = self._held
        held.append(now)
        while len(held) > 1 and now.at - held[1].at >= self.seconds:
            held.popleft()
        first = held[0]
        span = now.at - first.at

        def rate(new: int, old: int) -> float:
            if span <= 0:
                return 0.0  # the first snapshot: nothing to compare it with yet
            return max(0, new - old) / span

        ticks = [max(0, b - a) for a, b in zip(first.tick_buckets, now.tick_buckets, strict=True)]
        return {
            "clients": s.client_count,
            "channels": s.channel_count,
            "updatesPerSec": rate(now.updates, first.updates),
            "deliveriesPerSec": rate(now.deliveries, first.deliveries),
            "bytesPerSec": rate(now.bytes, first.bytes),
            "conflatedPerSec": rate(now.conflated, first.conflated),
            "droppedPerSec": rate(now.dropped, first.dropped),
            "refusalsPerSec": rate(now.refusals, first.refusals),
            "loopLag": s.loop_lag,
            "tickP99": quantile(0.99, TICK_BUCKETS_MS, ticks),
            "queuedBytes": s.queued_bytes,
            "uptime": s.uptime,
            "ready": int(ready),
            "version": version,
        }


def quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float:
    """The `q` quantile of a histogram, as Prometheus's `histogram_quantile` reads it, so the PV
    and a dashboard agree: linear within the bucket that holds it, the highest finite bound when
    it falls in the last (unbounded) bucket. `counts` holds one more bucket than `bounds` (the
    overflow); 0 when the histogram is empty (nothing took any time)."""
    total = sum(counts)
    if total == 0:
        return 0.0
    rank = q * total
    below = 0
    for i, count in enumerate(counts):
        if below + count >= rank:  # the first bucket whose cumulative count reaches the rank
            if i == len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            if count == 0:  # only for q = 0 before the first sample
                return lower
            return lower + (bounds[i] - lower) * (rank - below) / count
        below += count
    return bounds[-1]  # not reached: the counts add up to `total`
