"""What a subscription with ``backfill`` holds of its channels' past (PROTOCOL.md section 2.8),
without I/O: which rows of a HISTORY it lacks, and the ``since`` of its next ATTACH.

Per channel: ``newest``, the latest time (ns) the client has, from HISTORY rows and entries;
and its *holes*, spans ``[lo, hi)`` it lacks though it has later rows. A hole opens where a slow
backfill left rows out: from that channel's gap row of status 1 (*left out*) to its snapshot
entry's time. The next ATTACH's ``since`` for the channel is then just before its oldest hole,
so the server sends the rows from there on; of those, the client keeps the rows in a hole and
the rows later than ``newest``, and drops the ones it has (those between the snapshot and
``newest``). A row kept in a hole shrinks it; a backfill that ends without leaving that channel
out closes its holes (it sent every row from ``since`` on). The TypeScript client's
``held.ts`` is the same machine.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["LEFT_OUT", "MAX_HOLES", "Held"]

LEFT_OUT = 1  # a gap row's status: the backfill left out this channel's rows from here on
# Holes kept per channel: a backfill cut short again while it filled one adds at most one more;
# beyond this many, the oldest is given up (its rows are not asked for again).
MAX_HOLES = 4


class Held:
    __slots__ = ("_before", "_cut", "holes", "newest")

    def __init__(self, count: int) -> None:
        self.newest = [0] * count
        self.holes: list[list[list[int]]] = [[] for _ in range(count)]
        self._before = [0] * count  # `newest` when the attachment was made
        self._cut: list[int | None] = [None] * count  # its left-out gap row's time, if any

    def __len__(self) -> int:
        return len(self.newest)

    def attached(self) -> None:
        """A new attachment: its backfill starts from what is held now."""
        self._before = list(self.newest)
        self._cut = [None] * len(self.newest)

    def since(self) -> list[int] | None:
        """The ATTACH's `since`: per channel, the time after which the client lacks rows (0:
        it has none); None when it has no row of any channel."""
        since = [h[0][0] - 1 if h else t for h, t in zip(self.holes, self.newest, strict=True)]
        return since if any(since) else None

    def history(
        self,
        sid: int,
        t: Sequence[int],
        gap: Sequence[int],
        status: Sequence[int],
        resolution: int,
    ) -> list[tuple[int, int]]:
        """One HISTORY of channel `sid` (its rows' times, gap flags and statuses): the runs
        [start, stop) of its rows the client lacks, in order."""
        newest, holes = self.newest[sid], self.holes[sid]
        reached = [-1] * len(holes)  # per hole: the latest time kept in it
        runs: list[tuple[int, int]] = []
        start: int | None = None
        for i, ti in enumerate(t):
            # A left-out row brings nothing of its time on: the rows left out start there.
            left_out = gap[i] and status[i] == LEFT_OUT
            if left_out:
                self._cut[sid] = ti
            lacked = ti > newest
            for k, (lo, hi) in enumerate(holes):
                if lo <= ti < hi:
                    lacked = True
                    if not left_out:
                        reached[k] = ti
            if lacked and start is None:
                start = i
            elif not lacked and start is not None:
                runs.append((start, i))
                start = None
            if ti > self.newest[sid]:
                self.newest[sid] = ti
        if start is not None:
            runs.append((start, len(t)))
        step = max(resolution, 1)  # a bucket at t covers [t, t + resolution)
        for k, last in enumerate(reached):
            if last >= 0:
                holes[k][0] = max(holes[k][0], last + step)
        self.holes[sid] = [h for h in holes if h[0] < h[1]]
        return runs

    def entry(self, sid: int, t: int) -> None:
        """An entry of channel `sid` with this time (ns)."""
        if t > self.newest[sid]:
            self.newest[sid] = t

    def snapshot(self, sid: int, t: int | None) -> None:
        """The attachment's snapshot entry of channel `sid`, with its time (None: it has none).
        Its backfill is over: if it left the channel's rows out from some time on, what the
        client did not have of them before is a hole; the rest of its holes are filled."""
        cut = self._cut[sid]
        if cut is None:
            self.holes[sid] = []
            return
        holes = [[max(lo, cut), hi] for lo, hi in self.holes[sid] if max(lo, cut) < hi]
        start = max(cut, self._before[sid] + 1)
        if t is not None and start < t:
            holes.append([start, t])
        self.holes[sid] = holes[-MAX_HOLES:]
