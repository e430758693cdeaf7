"""The drain after SIGTERM: a replica leaves without its clients arriving elsewhere all at once.

1. At once `/readyz` answers 503, so load balancers (Kubernetes endpoints, haproxy's check) stop
   sending new connections here; serving goes on unchanged for `drain_delay_s`, the time they
   take to notice.
2. Then every WebSocket is closed, paced evenly over `drain_window_s` by the clock, a bounded
   number per pass however late the loop runs (`Pacer`): stream clients with 4012 DRAINING and
   a reason saying within how long to reconnect (the time between two closes times the number
   closed in that pass, at most `drain_jitter_max_s`), which they do at once, without backoff,
   so that a pass that closed several spreads them again; pvws clients with 1012,
   on which cs-web-lib reconnects after 500 ms and pvws.js after its `reconnect_ms`. New
   WebSockets arriving meanwhile are refused (1013) before HELLO: their clients back off.
3. Then the process exits (the caller stops the server), well within the grace period.

A second SIGTERM closes what is left at once. The order is by client number, oldest first.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from ..limits import number
from ..wire.codes import DRAINING, RESTART

__all__ = ["Drain", "DrainState", "Pacer", "draining_reason", "reconnect_within"]

log = logging.getLogger("pvwire.drain")

JITTER_MAX = number("drain_jitter_max_s")
CLOSE_WAIT = number("drain_close_wait_s")
# Wake-ups of the paced closes are at least this far apart: each closes every client due.
_PACE_S = 0.01
# One pass closes at most this much of the schedule, and a drain behind it catches up at most
# this many times the even pace: a stall of 2 s no longer closes 100 clients in one pass. Half a
# second covers the passes of a loop running late under load (~0.35 s apart, bench/JOURNAL.md).
_BURST_S = 0.5
_CATCH_UP = 2.0


class Closable(Protocol):
    """What the drain needs of a client (core/clients.py's `Client` is one)."""

    number: int
    endpoint: str  # "stream" or "pvws"

    @property
    def close_request(self) -> tuple[int, str] | None: ...

    def request_close(self, code: int, reason: str) -> None: ...


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


class DrainState(enum.Enum):
    SERVING = "serving"
    DELAYING = "delaying"  # not ready, serving on
    CLOSING = "closing"  # closing paced, refusing new connections
    DONE = "done"


def reconnect_within(step: float, closed: int = 1) -> float:
    """Seconds a stream client is told to spread its reconnect over: the part of the schedule its
    pass closed (`closed` clients `step` apart), so that a pass closing several does not bring
    them back together; at most JITTER_MAX, and JITTER_MAX when there is no schedule."""
    span = step * closed
    return min(span, JITTER_MAX) if span > 0 else JITTER_MAX


def draining_reason(within_s: float) -> str:
    """The close reason of 4012 DRAINING: clients read the number (PROTOCOL.md section 8)."""
    return f"reconnect within {math.ceil(within_s * 1000)} ms"


class Pacer:
    """The schedule of a drain's closes, without I/O: `count` closes evenly over `window` seconds
    from `start`, the first at once. Each pass (`take`) closes what the clock says is due, within
    a budget: at most `bound` at once (_BURST_S of the schedule), and over time at most
    _CATCH_UP times the even pace. A loop that runs late closes a few per pass and keeps the
    schedule; one that stalled catches up at that pace, not in one burst. Past the window's end
    the bound doubles at every pass, so that even a loop far behind ends within a few passes of
    it (the grace period allows 10 s more)."""

    def __init__(self, count: int, window: float, start: float) -> None:
        self.count, self.start = count, start
        self.step = window / count if count else 0.0
        self.end = start + window
        self.bound = max(1, math.ceil(_BURST_S / self.step)) if self.step else max(count, 1)
        self.closed = 0
        # Measured as it goes, for the log and the bench: passes, the most in one, how far
        # behind the schedule a pass began.
        self.passes = 0
        self.most = 0
        self.behind_s = 0.0
        self._budget = 1.0  # closes allowed now: the first at once
        self._last = start
        self._limit = self.bound  # past the window's end

    @property
    def left(self) -> int:
        return self.count - self.closed

    def due(self, now: float) -> int:
        """Closes the schedule wants done by `now` (from 1, at `start`, to `count`)."""
        if not self.step:
            return self.count
        # A pass woken exactly on time may read the clock a rounding error early.
        return min(self.count, math.floor((now - self.start) / self.step + 1e-9) + 1)

    def take(self, now: float) -> int:
        """A pass at `now`: how many to close in it (0 when none is due, or none allowed yet)."""
        if self.step:
            refill = max(0.0, now - self._last) * _CATCH_UP / self.step
            self._budget = min(float(self.bound), self._budget + refill)
        self._last = now
        late = self.due(now) - self.closed
        if late <= 0:
            return 0
        if not self.step:
            n = late  # no window: all at once
        elif now >= self.end and self.passes:
            self._limit *= 2
            n = min(late, self._limit)
        else:
            n = min(late, math.floor(self._budget + 1e-9))
            self._budget -= n
        if n <= 0:
            return 0
        self.behind_s = max(self.behind_s, now - (self.start + self.closed * self.step))
        self.closed += n
        self.passes += 1
        self.most = max(self.most, n)
        return n

    def wait(self, now: float) -> float | None:
        """Seconds from `now` to the next pass (at least _PACE_S); None when all are closed."""
        if not self.left:
            return None
        return max(_PACE_S, self.start + self.closed * self.step - now)


class Drain:
    """One process's drain: `begin()` on SIGTERM, then `run()`; `on_done` when it is over."""

    def __init__(
        self,
        sessions: Callable[[], Iterable[Closable]],
        delay_s: float,
        window_s: float,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self._sessions = sessions
        self.delay_s, self.window_s = delay_s, window_s
        # The loop's clock and a sleep that a second SIGTERM cuts short, unless given (tests).
        self._clock = clock
        self._sleep = sleep or self._wait
        self.state = DrainState.SERVING
        self.closed = 0  # clients the drain closed
        self._hurried = False  # a second SIGTERM
        self._woken: asyncio.Future[None] | None = None  # what `_wait` waits on
        self.pacer: Pacer | None = None  # once the closes began

    @property
    def ready(self) -> bool:
        """False from SIGTERM on: `/readyz` answers 503."""
        return self.state is DrainState.SERVING

    @property
    def refuses_new(self) -> bool:
        """New WebSockets are refused once the closes began."""
        return self.state in (DrainState.CLOSING, DrainState.DONE)

    def begin(self) -> bool:
        """SIGTERM: False if a drain already runs, which then closes what is left at once."""
        if self.state is not DrainState.SERVING:
            self._hurried = True
            if self._woken is not None:
                _wake(self._woken)
            return False
        self.state = DrainState.DELAYING
        log.info(
            "SIGTERM: not ready; serving %d clients on for %g s, then closing them over %g s",
            len(list(self._sessions())), self.delay_s, self.window_s,
        )  # fmt: skip
        return True

    async def run(self) -> None:
        """The delay, then the paced closes; returns once every client was asked to close and
        their closes went out (at most CLOSE_WAIT later)."""
        clock = self._clock or asyncio.get_running_loop().time
        await self._sleep(self.delay_s)
        self.state = DrainState.CLOSING
        due = sorted(self._sessions(), key=lambda s: s.number)
        pacer = self.pacer = Pacer(len(due), self.window_s, clock())
        while pacer.left:
            if self._hurried:
                for session in due[pacer.closed :]:
                    self._close(session, draining_reason(JITTER_MAX))
                break
            i = pacer.closed
            n = pacer.take(clock())
            reason = draining_reason(reconnect_within(pacer.step, n))
            for session in due[i : i + n]:
                self._close(session, reason)
            wait = pacer.wait(clock())
            if wait is not None:
                await self._sleep(wait)
        # Any the admission let in just before the closes began.
        for session in list(self._sessions()):
            self._close(session, draining_reason(JITTER_MAX))
        spent = clock() - pacer.start
        # Each close goes out through its connection's pump: the server's shutdown would close
        # those still waiting with 1012 (89 of 1,000 when a busy loop left the last passes large).
        deadline = clock() + CLOSE_WAIT
        while not self._hurried and any(True for _ in self._sessions()) and clock() < deadline:
            await self._sleep(_PACE_S)
        self.state = DrainState.DONE
        log.info(
            "drain done: %d clients closed in %.1f s, in %d passes of at most %d; "
            "at most %.2f s behind the schedule; %d connections left",
            self.closed, spent, pacer.passes, pacer.most, pacer.behind_s,
            sum(1 for _ in self._sessions()),
        )  # fmt: skip

    def _close(self, session: Closable, reason: str) -> None:
        if session.close_request is not None:
            return  # closing already, for its own reason
        if session.endpoint == "stream":
            session.request_close(DRAINING, reason)
        else:
            # pvws clients reconnect on any code (cs-web-lib but for its own 3001); 1012 says
            # what happens, as pvwire said it to them before.
            session.request_close(RESTART, "server draining: reconnect")
        self.closed += 1

    async def _wait(self, seconds: float) -> None:
        """Sleep, or less when a second SIGTERM says to hurry. One timer and one future: a pass
        costs two turns of a busy loop, where `wait_for` on the event took four or five."""
        if seconds <= 0 or self._hurried:
            return
        loop = asyncio.get_running_loop()
        woken = self._woken = loop.create_future()
        timer = loop.call_later(seconds, _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()
            self._woken = None
