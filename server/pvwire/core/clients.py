"""What the tick and the hub need from one client connection, whatever its protocol.

Two endpoints attach to the same views: `/stream` (`wire/session.py`, MessagePack) and `/pvws/pv`
(`pvws/session.py`, pvws's JSON). Both are driven the same way, so one upstream monitor and one
encoding per tick serve the clients of both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..wire.tokens import Claims
    from .view import View

__all__ = ["Client"]


class Client(Protocol):
    number: int
    address: str
    endpoint: str  # "stream" or "pvws"

    @property
    def channel_count(self) -> int: ...

    @property
    def queued_bytes(self) -> int: ...

    conflated: int
    deliveries: int  # channel updates queued: `/stream` DATA entries, pvws update messages
    connected_at: float

    @property
    def frames_sent(self) -> int: ...

    @property
    def bytes_sent(self) -> int: ...

    @property
    def close_request(self) -> tuple[int, str] | None: ...

    @property
    def attachments(self) -> Mapping[int, object]: ...

    @property
    def claims(self) -> Mapping[int, Claims]: ...

    # The tick: a view that emitted hands itself to each attached client, then each client
    # touched flushes once.
    def collect(self, att: int, view: View) -> bool: ...
    def flush_tick(self) -> None: ...

    def housekeeping(self, now: float) -> None: ...
    def request_close(self, code: int, reason: str) -> None: ...
    def end_attachment(self, att: int, code: int, message: str) -> None: ...
    def close(self) -> None: ...
