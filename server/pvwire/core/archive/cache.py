"""Archivers' answers kept for repeated reads, bounded in bytes (least recently used first out);
an entry may expire (an answer whose range ends near its read: the archive may still be
receiving those samples)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["ByteCache"]

V = TypeVar("V")


class ByteCache(Generic[V]):
    def __init__(self, budget: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self.used = 0
        self._clock = clock
        self._items: OrderedDict[Hashable, tuple[V, int, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[2] <= self._clock():
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: Hashable, value: V, nbytes: int, ttl: float = float("inf")) -> None:
        """Keep `value` (of `nbytes`) for at most `ttl` s; one larger than the budget is not
        kept at all."""
        if key in self._items:
            self._drop(key)
        if nbytes > self.budget:
            return
        while self.used + nbytes > self.budget:
            self._drop(next(iter(self._items)))
        self._items[key] = (value, nbytes, self._clock() + ttl)
        self.used += nbytes

    def _drop(self, key: Hashable) -> None:
        self.used -= self._items.pop(key)[1]
