"""PVA monitors whose updates reach Python in batches (_pvaingest.cpp; built by `make`).

A C++ failure inside any method is raised as RuntimeError (MemoryError when out of memory); a
handler's exception is reported as unraisable, never raised by drain().
"""

from collections.abc import Callable
from typing import Any

class Subscription:
    """One PVA monitor, from `Ingest.subscribe`."""

    @property
    def is_fast(self) -> bool:
        """Whether ordinary updates go straight to `on_update`."""

    @property
    def closed(self) -> bool: ...
    def close(self) -> None:
        """Cancel; nothing is delivered after this returns."""

    def fast(self, severity: int, status: int, message: str) -> None:
        """Deliver ordinary updates (only value and timeStamp changed, a plain scalar or array)
        straight to `on_update` with this alarm, until anything else arrives: that goes to
        `on_item`, and turns this off."""

class Ingest:
    """A pvxs client context (from EPICS_PVA_*) for monitors, each with pvRequest `request`."""

    def __init__(self, request: str) -> None: ...
    def subscribe(
        self,
        name: str,
        on_update: Callable[[Any, int, int, int, int, str], None],
        on_item: Callable[[Any], None],
        on_failure: Callable[[BaseException], None],
    ) -> Subscription:
        """Monitor `name`. drain() calls, on its thread: `on_update(value, seconds, nanoseconds,
        severity, status, message)` for an ordinary update while fast; `on_item(item)` for any
        other (p4p's Value, or p4p's Disconnected, Finished, RemoteError or a RuntimeError);
        `on_failure(exception)` when `on_update` raised."""

    def drain(self, max_pops: int) -> None:
        """Deliver the woken subscriptions' updates, at most `max_pops` each (one still busy
        waits for the next drain). MemoryError, once everything was delivered, if pvxs's thread
        could not queue a wake-up since the last drain."""

    def close(self) -> None:
        """Close the context: every subscription on it ends."""

    @property
    def request(self) -> Any:
        """The monitors' pvRequest, as p4p's Value."""
