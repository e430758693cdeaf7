"""Batched PVA ingest: p4p's raw subscription FIFOs, polled on the event loop.

A p4p subscription is a FIFO plus a wake-up callback that pvxs calls on its own worker thread,
holding the GIL, only when the FIFO goes from empty to non-empty (and again only after a `pop()`
found it empty). p4p's asyncio client turns each wake-up into `call_soon_threadsafe` and each
update into a coroutine step. Measured at 1,000 PVs at 10 Hz (bench/pva_ingest.py, bench/README.md),
most of that floor was not on the loop thread at all but on pvxs's thread: running Python code
under a contended GIL and waking the loop for every update.

Here the wake-up callback is `deque.append` bound to the subscription (a C call: no bytecode, the
GIL held for well under a microsecond), and the loop polls that deque every POLL_PERIOD_S while
any subscription is open, popping each woken FIFO until it is empty. pvxs's thread never wakes
the loop; the loop never waits on the GIL for a callback. Cost: an update reaches its channel up
to POLL_PERIOD_S later, and the loop runs one timer per POLL_PERIOD_S while monitors are open.

The subscribe-time loss of p4p's *thread* client (DESIGN.md section 9) came from its wake-up
callback using the subscription object before `monitor()` had returned and stored it: the
callback failed, the FIFO was never popped, and pvxs never called it again. Here the callback
only appends, and the FIFO is popped on the loop thread, which is the thread that stored the
subscription: that race cannot happen (tests/test_pva_ingest.py subscribes to 5,000 PVs).

p4p's public `raw.Context.monitor` wraps the callback in a Python function (with a debug-log
call), which is exactly the per-update bytecode this avoids; hence `_p4p.ClientMonitor` and the
context's `_ctxt` (p4p 4.3.0; `raw.Subscription` is a thin subclass of the same class).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from functools import partial
from typing import Protocol

from p4p._p4p import ClientMonitor
from p4p.client.raw import Context as RawContext

__all__ = ["POLL_PERIOD_S", "QUEUE_SIZE", "Drainable", "WokenQueue", "pop"]

log = logging.getLogger(__name__)

# How often the loop looks for woken subscriptions. 5 ms: an update waits 2.5 ms on average
# before its channel sees it (the tick then adds its own 0-20 ms), and an idle server with PVA
# monitors open runs 200 short timer callbacks a second.
POLL_PERIOD_S = 0.005

# The FIFO's own pop: `raw.Subscription.pop` adds a debug log call, an assert and an NT unwrap
# that `nt=False` makes a no-op (1.3 µs against 0.3 µs per pop, measured).
pop = ClientMonitor.pop

# Updates pvxs queues per subscription, at the IOC and here, before it merges the newest into the
# last one (a missing update). pvxs's default is 4: 400 ms of a 10 Hz PV, less than a loaded
# loop fell behind at 2,000 PVs (loop lag 0.5 s: 8,550 missing of 280,000 with 4; 0 in five runs
# with 16 up to a load average of 6, bench/README.md). The queue holds Values only while the loop
# is behind; pvxs frees their arrays once popped. An IOC keeps as many per slow subscription
# (setting `pva_queue_size`: a site whose PVA images are large may want fewer).
QUEUE_SIZE = 16


class Drainable(Protocol):
    def drain(self) -> None:
        """Pop this subscription's FIFO (on the loop thread); never raises."""


class WokenQueue:
    """Subscriptions whose FIFO has something, appended by pvxs's threads, drained on the loop."""

    __slots__ = ("_handle", "_loop", "_open", "_request", "_woken")

    def __init__(self, loop: asyncio.AbstractEventLoop, queue_size: int = QUEUE_SIZE) -> None:
        if queue_size < 1:
            raise ValueError(f"PVA queue size must be at least 1, got {queue_size}")
        self._loop = loop
        self._request = RawContext.makeRequest(f"record[queueSize={queue_size}]field()")
        self._woken: deque[Drainable] = deque()  # append and popleft are atomic under the GIL
        self._open = 0
        self._handle: asyncio.TimerHandle | None = None

    def subscribe(self, ctx: RawContext, name: str, sub: Drainable) -> ClientMonitor:
        """Open a raw subscription whose wake-ups queue `sub`. Pair with `closed()`."""
        mon = ClientMonitor(
            ctx._ctxt, name, handler=partial(self._woken.append, sub), pvRequest=self._request
        )
        self._open += 1
        if self._handle is None:
            self._handle = self._loop.call_later(POLL_PERIOD_S, self._poll)
        return mon

    def closed(self) -> None:
        """One subscription from `subscribe` was closed; the timer stops with the last."""
        self._open -= 1
        if self._open <= 0 and self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._woken.clear()

    @property
    def polling(self) -> bool:
        """Whether the poll timer runs (it does exactly while subscriptions are open)."""
        return self._handle is not None

    def again(self, sub: Drainable) -> None:
        """`sub` stopped before its FIFO was empty: pvxs will not wake it, so queue it here."""
        self._woken.append(sub)

    def _poll(self) -> None:
        self._handle = None  # a drain that opens a subscription may arm the timer itself
        woken = self._woken
        try:
            # Only those woken so far: one queued again by `again` waits for the next poll.
            # (`woken` may empty meanwhile: closing the last subscription clears it.)
            for _ in range(len(woken)):
                if not woken:
                    break
                sub = woken.popleft()
                try:
                    sub.drain()
                except Exception:  # drain contains its own failures; this keeps the rest going
                    log.exception("draining a PVA subscription failed")
        finally:
            if self._open > 0 and self._handle is None:
                self._handle = self._loop.call_later(POLL_PERIOD_S, self._poll)
