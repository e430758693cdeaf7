"""Opening channels for a time per event-loop pass, over every connection of both endpoints.

A `/stream` ATTACH opens its token's channels and a `/pvws/pv` subscribe its names; each new
channel is an upstream monitor and its history, and a token of 10,000 names, or a subscribe of
20,000, opened in one step held the loop for every client (the hoard attack's loop lag reached
1.89 s). The opener gives all of them together at most `budget_s` of each pass, in turns of
`turn` channels a connection, so one that opens thousands does not make a smaller one wait for
all of it. A time, not a count: when many screens open at once (after a restart), a count of 50
a pass made them wait for hundreds of passes of everything else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from ..limits import number
from ..wire.codes import INTERNAL

__all__ = ["Opener", "Opening"]

log = logging.getLogger(__name__)

OPEN_S_PER_PASS = number("open_ms_per_pass") / 1000.0
# Channels one connection opens before the next connection's turn within a pass.
TURN = 10


class Opening(Protocol):
    """A connection with channels to open (a `/stream` or `/pvws/pv` session)."""

    number: int

    @property
    def opening(self) -> int:
        """Something is still to open (a count of what is left, or of what waits for it)."""

    @property
    def close_request(self) -> tuple[int, str] | None: ...

    def open_pending(self, limit: int) -> int:
        """Open up to `limit` channels of what waits, in the order asked; how many were tried."""

    def request_close(self, code: int, reason: str) -> None: ...


class Opener:
    def __init__(
        self,
        budget_s: float = OPEN_S_PER_PASS,
        turn: int = TURN,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.budget_s, self.turn, self._clock = budget_s, turn, clock
        self._waiting: deque[Opening] = deque()
        self._queued: set[int] = set()  # session numbers in `_waiting`
        self._task: asyncio.Task[None] | None = None

    def __call__(self, session: Opening) -> None:
        """`session` has channels to open."""
        if session.number not in self._queued:
            self._queued.add(session.number)
            self._waiting.append(session)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while self._waiting:
                self.one_pass()
                await asyncio.sleep(0)  # one pass of the event loop for everything else
        finally:
            self._task = None

    def one_pass(self) -> None:
        clock = self._clock
        deadline = clock() + self.budget_s
        turns = 0  # one at least, whatever the clock says: every pass makes progress
        while self._waiting and (turns == 0 or clock() < deadline):
            turns += 1
            session = self._waiting.popleft()
            try:
                session.open_pending(self.turn)
            except Exception:
                # One connection's fault is its own: it is closed, the others go on opening.
                log.exception("client %s: opening its channels failed", session.number)
                session.request_close(INTERNAL, "internal error; reconnect to resume")
            if session.opening and not session.close_request:
                self._waiting.append(session)
            else:
                self._queued.discard(session.number)
