"""One attachment's backfill (PROTOCOL.md section 2.8), produced a message at a time under its
session's send budget, as catch-up is (DESIGN.md section 7d: a client that stops reading costs
at most its budget, not its whole past).

The session calls `fill(room)` when the attachment is made and again whenever its writer has
drained; each call produces HISTORY messages until they hold `room` bytes (one message more at
most, of at most HISTORY_MESSAGE_ROWS values). Each channel has a cursor: the lowest time its
next row may have. A *pass* sends every channel's rows from its cursor on, oldest first, and
leaves out each channel's newest update, its current value, which the snapshot carries.

The join: the session holds the attachment's live data until the backfill is done, then queues
the snapshot, built from the channels' current state, in the same call as the last rows. Rows
recorded while a pass was being read come in the next pass. A pass produced whole within one
call is the last: no update can land during a call, so its rows reach each channel's current
value and the snapshot carries that, with no gap and no duplicate. A reader faster than its
channels record needs two or three passes. A reader slower than its channels never catches up,
so after BACKFILL_PASSES passes (each made under the budget, as every other) the backfill ends
with walks that close it: each channel with rows not sent gets one gap row where its rows stop
(GapKind.LEFT_OUT: nothing more of it until the snapshot), made under the budget like the rest;
a walk over the channels not closed yet that is made whole within one call is the last, and
the snapshot follows it. Each channel knows what it lacks, and the reader never costs more
than its budget.

With an archiver behind the history (`archive`, core/archive/past.py), each channel's part older
than the server's oldest kept row comes first, in the first pass; while it is being read the
backfill waits (`fill` returns, the session resumes it when the read answers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ..limits import BACKFILL_PASSES, HISTORY_MESSAGE_ROWS, MAX_BACKFILL_S
from ..wire import codec as wire
from ..wire.codec import GapKind
from .archive.past import WAIT, ArchivePast
from .channel import Channel
from .history import HistorySlice

__all__ = ["Backfill"]

log = logging.getLogger("pvwire.view")


class Backfill:
    __slots__ = ("_begun", "_closed", "_closing", "_failed", "_lower", "_sid", "archive", "att",
                 "channels", "passes")  # fmt: skip

    def __init__(
        self,
        att: int,
        channels: Sequence[Channel],
        seconds: float,
        held: Sequence[int] | None = None,
    ) -> None:
        """`seconds`: the subscription's `backfill`; `held`: per channel, the time (ns) of the
        time after which the client lacks rows (ATTACH `since`, 0: none; its newest, or just
        before the rows a slow backfill left out), so only later ones are sent."""
        self.att = att
        self.channels = channels
        since = time.time_ns() - int(min(seconds, MAX_BACKFILL_S) * 1e9)
        # Per channel: the lowest time (ns) its next row may have.
        self._lower = [since] * len(channels)
        if held is not None:
            self._lower = [max(since, h + 1) for h in held]
        self._sid = 0  # the channel this pass is at
        self._begun = False  # this pass has produced (or passed) something
        self._failed: set[int] = set()  # sids whose past could not be read: skipped
        self.passes = 1
        self._closing = False  # the passes are over: walks give each channel its gap row
        self._closed: set[int] = set()  # sids whose gap row is sent: nothing more of them
        self.archive: ArchivePast | None = None  # set to reach into an archive (`with_archive`)

    @property
    def cursors(self) -> list[int]:
        """Per channel, the lowest time (ns) its next row may have."""
        return self._lower

    def close(self) -> None:
        """The attachment is gone before its backfill was done: what it reads is given up."""
        if self.archive is not None:
            self.archive.close()

    def fill(self, room: int) -> tuple[list[bytes], bool]:
        """HISTORY messages until they hold `room` bytes (one more at most), and whether the
        backfill is done: then the caller queues the snapshot before anything else happens."""
        frames: list[bytes] = []
        size = 0
        whole = not self._begun  # the pass under way started in this call
        n = len(self.channels)
        while True:
            if self._sid >= n:
                if whole:
                    return frames, True
                if self.passes >= BACKFILL_PASSES:
                    self._closing = True
                else:
                    self.passes += 1
                self._sid, self._begun, whole = 0, False, True
                continue
            if size >= room:
                return frames, False
            self._begun = True
            more: bool | None
            if self._closing:
                produced, more = self._left_out(self._sid), False
            else:
                produced, more = self._next(self._sid)
                if more is None:  # an archive part being read: resumed when it answers
                    return frames, False
            if not more:
                self._sid += 1
            frames += produced
            size += sum(len(f) for f in produced)

    def _next(self, sid: int) -> tuple[list[bytes], bool | None]:
        """The next message(s) of channel `sid`'s rows from its cursor on (at most
        HISTORY_MESSAGE_ROWS values in all), moving the cursor past them, and whether it has
        more (None: its archive part is being read). A failure skips that channel's past for
        good: counted, logged once."""
        if sid in self._failed:
            return [], False
        ch = self.channels[sid]
        if self.archive is not None and self.passes == 1:
            try:
                past = self.archive.step(sid, self._lower[sid])
            except Exception:  # not a read's miss (a gap row says those): the join's own
                self._fail(sid, ch)
                return [], False
            if past is WAIT:
                return [], None
            if past is not None:
                self._lower[sid] = past.lower
                return past.frames, True
        recorder = ch.recorder
        if recorder is None:
            return [], False
        try:
            # An idle channel costs O(1), not a read of its ring: the pass visits every one.
            if not recorder.backfills_from(self._lower[sid]):
                return [], False
            parts = recorder.backfill(self._lower[sid], HISTORY_MESSAGE_ROWS)
            frames = [self._encode(sid, part) for part in parts]
        except Exception:
            self._fail(sid, ch)
            return [], False
        if not parts:
            return [], False
        last = parts[-1]
        # A bucket covers [t, t + resolution): the next row starts after it.
        self._lower[sid] = int(last.t[-1]) + max(last.resolution, 1)
        return frames, last.truncated

    def _left_out(self, sid: int) -> list[bytes]:
        """A reader slower than its channels, after the last pass: the gap row of channel
        `sid`, if it has rows not sent, at its cursor (PROTOCOL.md section 2.8), once: its plot
        breaks there, and its rows from there to the snapshot are the ones a re-attach's
        `since` asks for again."""
        ch = self.channels[sid]
        recorder = ch.recorder
        if recorder is None or sid in self._failed or sid in self._closed:
            return []
        lower = self._lower[sid]
        try:
            if not recorder.backfills_from(lower):
                return []
        except Exception:
            self._fail(sid, ch)
            return []
        self._closed.add(sid)
        return [self._encode(sid, HistorySlice.gap_row(lower, recorder.row_shape,
                                                       GapKind.LEFT_OUT, 0))]  # fmt: skip

    def _fail(self, sid: int, ch: Channel) -> None:
        """Channel `sid`'s past failed: skipped for good, counted, logged (called in `except`)."""
        log.exception("backfill of %s failed; its past is not sent", ch.id)
        ch.listener.count_failure("history")
        self._failed.add(sid)

    def _encode(self, sid: int, part: HistorySlice) -> bytes:
        columns = (part.t, part.value, part.min, part.max, part.severity, part.status, part.gap)
        return wire.encode_history(self.att, sid, part.resolution, columns)
