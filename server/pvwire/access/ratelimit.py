"""Per-identity rate limits: token buckets keyed by who asks (user, else client address)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from ..limits import integer

__all__ = ["RateLimiter"]

MAX_KEYS = integer("rate_limited_identities")  # the least recently seen is forgotten first


class RateLimiter:
    """`rate` units per second with bursts of `burst`, per key. rate <= 0 means no limit."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = max(burst, rate)
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (level, at)

    def take(self, key: str, cost: float = 1.0) -> bool:
        """Spend `cost` for `key`; False (and nothing spent) if it has not enough left."""
        if self.rate <= 0:
            return True
        now = self._clock()
        level, at = self._buckets.pop(key, (self.burst, now))
        level = min(self.burst, level + (now - at) * self.rate)
        allowed = level >= cost
        self._buckets[key] = (level - cost if allowed else level, now)
        if len(self._buckets) > MAX_KEYS:
            self._buckets.popitem(last=False)
        return allowed
