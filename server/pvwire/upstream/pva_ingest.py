"""Batched PVA ingest: pvxs subscriptions (_pvaingest.cpp), drained on the event loop.

pvxs calls a subscription's wake-up callback on its own worker thread when the subscription's
FIFO goes from empty to non-empty (and again only after a pop found it empty). Through p4p that
callback runs Python under the GIL, and p4p's pop releases and re-takes the GIL for every update.
Here the callback is C++ that queues the subscription and never takes the GIL, and the loop
drains the queued subscriptions every POLL_PERIOD_S while any monitor is open: pvxs's thread
never wakes the loop, and the loop never waits on the GIL for a callback. An ordinary update
(only value and time changed) goes from the FIFO to the channel's `on_update` in C++; anything
else reaches pva.py as p4p's Value or exception. Cost: an update reaches its channel up to
POLL_PERIOD_S later, and the loop runs one timer per POLL_PERIOD_S while monitors are open.

Measured at 1,000 PVs at 10 Hz (bench/README.md, "Per-update cost, fourth pass"): see there.

The subscribe-time loss of p4p's *thread* client (DESIGN.md section 9) came from its wake-up
callback using the subscription object before `monitor()` had returned and stored it. Here the
callback only queues, and the FIFO is popped on the loop thread, which is the thread that stored
the subscription: that race cannot happen (tests/test_pva_ingest.py subscribes to 5,000 PVs).

The monitors have a pvxs client context of their own (the same EPICS_PVA_* settings as p4p's,
read when the first monitor opens): gets and puts stay on p4p's, so a server sees two client
connections from one pvwire process, and still one subscription per monitored PV.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import p4p._p4p  # noqa: F401  # loads libpvxs, and p4p's C API that _pvaingest imports

from ..limits import integer

# Why PVA monitors cannot run here, or None. Without the compiled module (a source checkout
# installed without `make ext`, or a wheel built for another platform) the server still serves
# CA and sim: pva.py reports every pva:// channel as unavailable with this text instead.
UNAVAILABLE: str | None
try:
    from ._pvaingest import Ingest, Subscription
except ImportError as e:
    UNAVAILABLE = (
        f"pvwire's PVA module is not built ({e}): run `make ext`, or "
        "`python scripts/build_ext.py` with g++ and this environment's Python, "
        "or install pvwire's wheel built for this platform"
    )
else:
    UNAVAILABLE = None

__all__ = ["MAX_POPS", "POLL_PERIOD_S", "QUEUE_SIZE", "UNAVAILABLE", "PvaIngest", "Subscription"]

log = logging.getLogger(__name__)

# How often the loop drains woken subscriptions. 5 ms: an update waits 2.5 ms on average
# before its channel sees it (the tick then adds its own 0-20 ms), and an idle server with PVA
# monitors open runs 200 short timer callbacks a second.
POLL_PERIOD_S = 0.005

# Updates popped from one subscription per drain before the others get their turn.
MAX_POPS = integer("pva_max_pops")

# Updates pvxs queues per subscription, at the IOC and here, before it merges the newest into the
# last one (a missing update). pvxs's default is 4: 400 ms of a 10 Hz PV, less than a loaded
# loop fell behind at 2,000 PVs (loop lag 0.5 s: 8,550 missing of 280,000 with 4; 0 in five runs
# with 16 up to a load average of 6, bench/README.md). The queue holds Values only while the loop
# is behind; pvxs frees their arrays once popped. An IOC keeps as many per slow subscription
# (setting `pva_queue_size`: a site whose PVA images are large may want fewer).
QUEUE_SIZE = integer("pva_queue_size")

OnUpdate = Callable[[Any, int, int, int, int, str], None]


class PvaIngest:
    """The monitors' pvxs context and the loop's drain timer, which runs while any is open."""

    __slots__ = ("_handle", "_ingest", "_loop", "_open")

    def __init__(self, loop: asyncio.AbstractEventLoop, queue_size: int = QUEUE_SIZE) -> None:
        if queue_size < 1:
            raise ValueError(f"PVA queue size must be at least 1, got {queue_size}")
        if UNAVAILABLE is not None:
            raise RuntimeError(UNAVAILABLE)
        self._loop = loop
        self._ingest = Ingest(f"record[queueSize={queue_size}]field()")
        self._open = 0
        self._handle: asyncio.TimerHandle | None = None

    def subscribe(
        self,
        name: str,
        on_update: OnUpdate,
        on_item: Callable[[Any], None],
        on_failure: Callable[[BaseException], None],
    ) -> Subscription:
        """Monitor `name`; pair with `closed()`. See _pvaingest.pyi for the three callbacks."""
        sub = self._ingest.subscribe(name, on_update, on_item, on_failure)
        self._open += 1
        if self._handle is None:
            self._handle = self._loop.call_later(POLL_PERIOD_S, self._poll)
        return sub

    def closed(self) -> None:
        """One subscription from `subscribe` was closed; the timer stops with the last."""
        self._open -= 1
        if self._open <= 0 and self._handle is not None:
            self._handle.cancel()
            self._handle = None

    @property
    def polling(self) -> bool:
        """Whether the drain timer runs (it does exactly while subscriptions are open)."""
        return self._handle is not None

    @property
    def request(self) -> Any:
        """Every monitor's pvRequest, as p4p's Value."""
        return self._ingest.request

    def close(self) -> None:
        """Close the context: every subscription on it ends."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._ingest.close()

    def _poll(self) -> None:
        self._handle = None  # a drain that opens a subscription may arm the timer itself
        try:
            self._ingest.drain(MAX_POPS)
        except Exception:  # the callbacks contain their own failures; this keeps the timer
            log.exception("draining PVA subscriptions failed")
        finally:
            if self._open > 0 and self._handle is None:
                self._handle = self._loop.call_later(POLL_PERIOD_S, self._poll)
