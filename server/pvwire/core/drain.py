"""The drain after SIGTERM: a replica leaves without its clients arriving elsewhere all at once.

1. At once `/readyz` answers 503, so load balancers (Kubernetes endpoints, haproxy's check) stop
   sending new connections here; serving goes on unchanged for `drain_delay_s`, the time they
   take to notice.
2. Then every WebSocket is closed, paced evenly over `drain_window_s`: stream clients with 4012
   DRAINING and a reason saying within how long to reconnect (the time between two closes, at
   most `drain_jitter_max_s`), which they do at once, without backoff; pvws clients with 1012,
   on which cs-web-lib reconnects after 500 ms and pvws.js after its `reconnect_ms`. New
   WebSockets arriving meanwhile are refused (1013) before HELLO: their clients back off.
3. Then the process exits (the caller stops the server), well within the grace period.

A second SIGTERM closes what is left at once. The order is by client number, oldest first.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
from collections.abc import Callable, Iterable

from ..limits import number
from ..wire.codes import DRAINING, RESTART
from .clients import Client

__all__ = ["Drain", "DrainState", "draining_reason", "reconnect_within"]

log = logging.getLogger("pvwire.drain")

JITTER_MAX = number("drain_jitter_max_s")
# Wake-ups of the paced closes are at least this far apart: each closes every client due.
_PACE_S = 0.01


class DrainState(enum.Enum):
    SERVING = "serving"
    DELAYING = "delaying"  # not ready, serving on
    CLOSING = "closing"  # closing paced, refusing new connections
    DONE = "done"


def reconnect_within(window: float, clients: int) -> float:
    """Seconds a closed stream client is told to spread its reconnect over: the time between two
    closes of the drain, at most JITTER_MAX; JITTER_MAX when they are all closed at once."""
    step = window / clients if clients > 0 else 0.0
    return min(step, JITTER_MAX) if step > 0 else JITTER_MAX


def draining_reason(within_s: float) -> str:
    """The close reason of 4012 DRAINING: clients read the number (PROTOCOL.md section 8)."""
    return f"reconnect within {math.ceil(within_s * 1000)} ms"


class Drain:
    """One process's drain: `begin()` on SIGTERM, then `run()`; `on_done` when it is over."""

    def __init__(
        self,
        sessions: Callable[[], Iterable[Client]],
        delay_s: float,
        window_s: float,
    ) -> None:
        self._sessions = sessions
        self.delay_s, self.window_s = delay_s, window_s
        self.state = DrainState.SERVING
        self.closed = 0  # clients the drain closed
        self._hurry = asyncio.Event()

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
            self._hurry.set()
            return False
        self.state = DrainState.DELAYING
        log.info(
            "SIGTERM: not ready; serving %d clients on for %g s, then closing them over %g s",
            len(list(self._sessions())), self.delay_s, self.window_s,
        )  # fmt: skip
        return True

    async def run(self) -> None:
        """The delay, then the paced closes; returns when every client was asked to close."""
        loop = asyncio.get_running_loop()
        await self._wait(self.delay_s)
        self.state = DrainState.CLOSING
        due = sorted(self._sessions(), key=lambda s: s.number)
        step = self.window_s / len(due) if due else 0.0
        reason = draining_reason(reconnect_within(self.window_s, len(due)))
        start, i = loop.time(), 0
        while i < len(due):
            end = len(due)
            if step and not self._hurry.is_set():
                end = min(end, math.floor((loop.time() - start) / step) + 1)
            for session in due[i:end]:
                self._close(
                    session, draining_reason(JITTER_MAX) if self._hurry.is_set() else reason
                )
            i = end
            if i < len(due):
                await self._wait(max(_PACE_S, start + i * step - loop.time()))
        # Any the admission let in just before the closes began.
        for session in list(self._sessions()):
            self._close(session, draining_reason(JITTER_MAX))
        self.state = DrainState.DONE
        log.info("drain done: %d clients closed in %.1f s", self.closed, loop.time() - start)

    def _close(self, session: Client, reason: str) -> None:
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
        """Sleep, or less when a second SIGTERM says to hurry."""
        if seconds <= 0 or self._hurry.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), seconds)
