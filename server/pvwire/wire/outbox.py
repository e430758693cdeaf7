"""One connection's outgoing queue, shared by the stream and pvws sessions: what is queued, how
many bytes, and when the client last made progress reading it (PROTOCOL.md section 9)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Outbox"]

T = TypeVar("T", bytes, str)


class Outbox(Generic[T]):
    def __init__(
        self,
        clock: Callable[[], float],
        wake: Callable[[], None],
        size: Callable[[T], int] = len,
    ) -> None:
        self._clock = clock
        # An item's bytes on the socket (pvws: a text's UTF-8 bytes, not its characters).
        self._size: Callable[[T], int] = size
        self._wake = wake
        self._items: deque[T] = deque()
        self.queued_bytes = 0  # includes the item being sent until `sent()` reports it
        self.last_progress = self.last_send = clock()

    def push(self, item: T) -> None:
        if not self.queued_bytes:
            self.last_progress = self._clock()  # a stall is measured from the first unsent item
        self._items.append(item)
        self.queued_bytes += self._size(item)
        self._wake()

    def extend(self, items: list[T], nbytes: int) -> None:
        """Queue `items`, of `nbytes` in all: `push` for each, with one wake-up."""
        if not self.queued_bytes:
            self.last_progress = self._clock()
        self._items.extend(items)
        self.queued_bytes += nbytes
        self._wake()

    def pop(self) -> T | None:
        """The next item to send, or None; it stays counted as queued until `sent()`."""
        return self._items.popleft() if self._items else None

    def pop_many(self, limit: int) -> tuple[list[T], int]:
        """Items from the front while their sizes add up to less than `limit` (at least one
        when any is queued), and their size; they stay counted as queued until `sent()`."""
        items = self._items
        if self.queued_bytes <= limit:  # everything queued fits: taken at once
            out = list(items)
            items.clear()
            return out, sum(map(self._size, out))
        out = []
        size = 0
        while items and size < limit:
            item = items.popleft()
            out.append(item)
            size += self._size(item)
        return out, size

    def sent(self, nbytes: int) -> None:
        self.queued_bytes -= nbytes
        self.last_progress = self.last_send = self._clock()

    def stalled_for(self, now: float) -> float:
        """Seconds without send progress while something is queued (0 when nothing is)."""
        return now - self.last_progress if self.queued_bytes else 0.0

    def clear(self) -> None:
        self._items.clear()
        self.queued_bytes = 0
