"""One attachment's backfill reaching into the archive (PROTOCOL.md section 2.8): each channel's
part older than the server's oldest kept row comes first, a channel at a time, as the backfill
reaches it (core/backfill.py asks `step`).

A channel's read starts when its turn comes, with the next PREFETCH channels' started behind
it, so an attachment holds at most that many channels' archive parts (each at most
`archive_backfill_rows` rows, bins wide enough to fit): what it costs does not grow with what
it asks. Until a read answers, the backfill waits (its session sends nothing of that attachment
meanwhile, as for any backfill) and is resumed when it does; every read of the attachment shares
one deadline (`archive_timeout_s`), after which each part not read is a gap row with the reason.

A channel that has no value yet when its part is ready is waited for (within the deadline) so
that its part ends before the value the snapshot will carry: its first update, whose time the
archive may hold too, is never a row as well as the snapshot's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...aa.operators import Series
from ...limits import HISTORY_MESSAGE_ROWS, integer
from ...model import ConnState
from ...wire import codec as wire
from ..channel import Channel
from ..history.reading import oldest, take
from ..history.slices import HistorySlice
from . import Archive
from .fetch import ArchiveMissing
from .join import past
from .plan import Plan, plan
from .routes import pv_name
from .series import ArchiveRefused, gap_row

__all__ = ["WAIT", "ArchivePast", "Past"]

ROWS = integer("archive_backfill_rows")
# Channels whose reads run ahead of the one being sent.
PREFETCH = 2
# How often a channel without a value yet is looked at again (within the deadline).
_COLD_POLL_S = 0.05
NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Past:
    """HISTORY messages of one channel's archive part; its backfill goes on from `lower`."""

    frames: list[bytes]
    lower: int


WAIT = Past([], -1)  # not ready: the session is resumed when it is


@dataclass(slots=True)
class _Read:
    plan: Plan
    task: asyncio.Task[Series]
    kept: bool  # the server held rows of the channel when the read was planned


class ArchivePast:
    def __init__(self, archive: Archive, att: int, channels: Sequence[Channel],
                 lowers: Sequence[int], who: str, resume: Callable[[], None]) -> None:  # fmt: skip
        """`lowers`: the backfill's cursors, per channel (read, never written, here)."""
        self.archive = archive
        self.att = att
        self.channels = channels
        self.lowers = lowers
        self.reach = archive.reach(who)
        self._resume = resume
        self._reads: dict[int, _Read] = {}
        self._done: set[int] = set()

    def close(self) -> None:
        """The attachment is gone: its reads under way are given up (fetch.py ends those that
        nobody else waits for), not left to run to their deadline."""
        for read in self._reads.values():
            read.task.cancel()
        self._reads.clear()

    def step(self, sid: int, lower: int) -> Past | None:
        """Channel `sid`'s archive part from `lower` on: its messages, WAIT, or None when it
        has none (no archiver holds it, the server's rows reach back, or it was sent)."""
        if sid in self._done:
            return None
        read = self._reads.get(sid) or self._start(sid, lower)
        if read is None:
            self._done.add(sid)
            return None
        for ahead in range(sid + 1, min(sid + 1 + PREFETCH, len(self.channels))):
            idle = ahead not in self._reads and ahead not in self._done
            if idle and self._start(ahead, self.lowers[ahead]) is None:
                self._done.add(ahead)
        if not read.task.done():
            return WAIT
        ch = self.channels[sid]
        if ch.state == ConnState.CONNECTING and not self.reach.expired():
            asyncio.get_running_loop().call_later(_COLD_POLL_S, self._resume)
            return WAIT
        self._done.add(sid)
        del self._reads[sid]
        return self._past(sid, read, lower)

    def _start(self, sid: int, lower: int) -> _Read | None:
        """Channel `sid`'s read, started; None when it needs none."""
        ch = self.channels[sid]
        archiver = self.archive.route(ch.id)
        client = self.archive.client
        if archiver is None or client is None:
            return None
        kept, own = _kept(ch)
        current = _current(ch)
        first = min(t for t in (kept, current, time.time_ns()) if t)
        if lower >= first:
            return None
        p = plan(lower, first, own if first == kept else 0, ROWS)
        task = asyncio.ensure_future(client.read(archiver, ch.id, p.operator, p.start, p.end,
                                                 self.reach, p.points + 3))  # fmt: skip
        task.add_done_callback(lambda _: self._resume())
        read = self._reads[sid] = _Read(p, task, kept > 0)
        return read

    def _past(self, sid: int, read: _Read, lower: int) -> Past:
        ch = self.channels[sid]
        kept, _ = _kept(ch)
        # The archive's part ends before the value the snapshot carries, whatever the seam.
        cut = _current(ch) or read.plan.end
        # Rows the server held when the read began and no longer holds (its rings moved on).
        dropped = read.kept and kept > read.plan.oldest
        try:
            got = read.task.result()
            rows, at = past(read.plan, got, lower, cut, dropped)
            reason = ""
            if len(rows) == 1 and rows.gap[0] and int(rows.t[0]) == lower:
                reason = (f"the archive holds no data of {pv_name(ch.id)} before "
                          f"{at / NS:.3f} (POSIX s)")  # fmt: skip
        except (ArchiveMissing, ArchiveRefused) as exc:
            rows, at, reason = gap_row(lower, kind=wire.GapKind.ARCHIVE), lower, str(exc)
        except asyncio.CancelledError:
            rows, at = gap_row(lower, kind=wire.GapKind.ARCHIVE), lower
            reason = "the archive read was cancelled"
        return Past(self._encode(sid, rows, reason), max(at, lower))

    def _encode(self, sid: int, rows: HistorySlice, reason: str) -> list[bytes]:
        frames = []
        start = 0
        while start < len(rows):
            n = take(rows.t[start:], HISTORY_MESSAGE_ROWS)
            part = slice(start, start + n)
            columns = (rows.t[part], rows.value[part], rows.min[part], rows.max[part],
                       rows.severity[part], rows.status[part], rows.gap[part])  # fmt: skip
            last = start + n >= len(rows)
            frames.append(wire.encode_history(self.att, sid, rows.resolution, columns,
                                              reason if last and reason else None))  # fmt: skip
            start += n
        return frames


def _kept(ch: Channel) -> tuple[int, int]:
    """(ns, resolution) of the oldest row the server keeps of `ch`; (0, 0): none."""
    rec = ch.recorder
    if rec is None or rec.failed:
        return 0, 0
    return oldest(rec.rings())


def _current(ch: Channel) -> int:
    """The time (ns) of the value the snapshot of `ch` carries; 0: none yet."""
    if ch.state != ConnState.CONNECTED:
        return 0
    return ch.seconds * NS + ch.nanoseconds
