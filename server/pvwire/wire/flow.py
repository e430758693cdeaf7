"""One connection's flow control (PROTOCOL.md section 9), shared by the stream and pvws sessions.

Messages are queued in an `Outbox` while the bytes queued stay under `send_budget`. Past it the
connection is *behind*: its session stops queueing and merges what it would have sent (latest
state wins). When the writer has drained below half the budget, the session's `catch_up` runs
once and the connection queues again. A queue that makes no progress for `stall_timeout`, or a
client that keeps sending requests without reading the answers, closes the connection with 4008
SLOW. Nothing here waits for the client: a slow client cannot delay the tick or anyone else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic

from .codes import SLOW
from .outbox import Outbox, T

__all__ = ["FlowControl", "FlowView"]


class FlowControl(Generic[T]):
    def __init__(
        self,
        send_budget: int,
        stall_timeout: float,
        clock: Callable[[], float],
        wake: Callable[[], None],
        catch_up: Callable[[], None],
        size: Callable[[T], int] = len,
    ) -> None:
        self.send_budget = send_budget
        self.stall_timeout = stall_timeout
        self._out: Outbox[T] = Outbox(clock, wake, size)
        self._wake = wake
        self._catch_up = catch_up
        self.behind = False
        self.close_request: tuple[int, str] | None = None
        self.frames_sent = 0
        self.bytes_sent = 0

    @property
    def queued_bytes(self) -> int:
        return self._out.queued_bytes

    @property
    def last_send(self) -> float:
        return self._out.last_send

    def push(self, item: T) -> None:
        self._out.push(item)

    def extend(self, items: list[T], nbytes: int) -> None:
        """`push` for each of `items` (of `nbytes` in all), waking the writer once."""
        self._out.extend(items, nbytes)

    def pop(self) -> T | None:
        """The next item to send, or None; it stays counted as queued until `sent()`."""
        return self._out.pop()

    def pop_many(self, limit: int) -> tuple[list[T], int]:
        """Several items at once, about `limit` in size, and their size (`Outbox.pop_many`)."""
        return self._out.pop_many(limit)

    def merging(self) -> bool:
        """Whether this tick's changes must be merged instead of queued: from the moment the
        queue reaches the budget until the catch-up."""
        if not self.behind and self._out.queued_bytes >= self.send_budget:
            self.behind = True
        return self.behind

    def flooded(self) -> bool:
        """Every request queues an answer: a client that sends but does not read would grow the
        queue without bound. Past twice the budget it is closed; True then."""
        if self._out.queued_bytes > 2 * self.send_budget:
            self.request_close(SLOW, "client sends requests but does not read the answers")
            return True
        return False

    def sent(self, nbytes: int, items: int = 1) -> None:
        """The writer finished sending `items` items of `nbytes` in all; catch up once drained
        enough."""
        self._out.sent(nbytes)
        self.frames_sent += items
        self.bytes_sent += nbytes
        if self.behind and self._out.queued_bytes < self.send_budget // 2:
            self.behind = False
            self._catch_up()

    def closing_slow(self, now: float) -> bool:
        """Once a second: close a client whose queue made no progress for `stall_timeout`.
        True when the connection is closing (now or before)."""
        if self.close_request:
            return True
        stalled = self._out.stalled_for(now)
        if stalled > self.stall_timeout:
            self.request_close(
                SLOW,
                f"client read nothing for {stalled:.0f} s with {self.queued_bytes} bytes queued",
            )
            return True
        return False

    def request_close(self, code: int, reason: str) -> None:
        if self.close_request is None:
            # Close reasons are limited to 123 bytes by RFC 6455.
            self.close_request = (code, reason.encode()[:123].decode(errors="ignore"))
            self._wake()

    def clear(self) -> None:
        self._out.clear()


class FlowView(Generic[T]):
    """What a session shows of its flow control (stats, metrics and the socket pump read these);
    a base so the stream and pvws sessions do not each forward them."""

    _flow: FlowControl[T]

    @property
    def queued_bytes(self) -> int:
        return self._flow.queued_bytes

    @property
    def behind(self) -> bool:
        return self._flow.behind

    @property
    def frames_sent(self) -> int:
        return self._flow.frames_sent

    @property
    def bytes_sent(self) -> int:
        return self._flow.bytes_sent

    @property
    def close_request(self) -> tuple[int, str] | None:
        return self._flow.close_request

    def request_close(self, code: int, reason: str) -> None:
        self._flow.request_close(code, reason)
