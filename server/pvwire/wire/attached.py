"""What both endpoints' sessions share: `Session` (session.py, `/stream`) and `PvwsSession`
(pvws/session.py, `/pvws/pv`).

Each is a client of the hub (core/clients.py) whose attachments are numbered as they are made,
one record per attachment holding the view it reads and the claims it was opened for (the hub
reads both, as `attachments` and `claims`, to show the client and to check it again when the
rules change), and one flow control whose catch-up sends what was merged while behind. What a
record holds besides, what is merged and how it is encoded are the protocol's, in the subclass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .flow import FlowControl, FlowView
from .outbox import T
from .tokens import Claims

if TYPE_CHECKING:
    from .session import SessionLimits

__all__ = ["AttachedSession", "Record"]


class Record(Protocol):
    """A session's record of one attachment."""

    @property
    def view(self) -> object: ...

    @property
    def claims(self) -> Claims: ...


R = TypeVar("R", bound=Record)
V = TypeVar("V")


class AttachedSession(FlowView[T], Generic[T, R]):
    endpoint: str

    def __init__(
        self,
        number: int,
        address: str,
        limits: SessionLimits,
        wake: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        size: Callable[[T], int] = len,
    ) -> None:
        self.number = number
        self.address = address
        self.limits = limits
        self._clock = clock
        self.connected_at = clock()
        self._records: dict[int, R] = {}  # att -> its record, in the order attached
        self.attachments: Mapping[int, object] = _Field(self._records, _view)
        self.claims: Mapping[int, Claims] = _Field(self._records, _claims)
        self._next_att = 1
        self._flow: FlowControl[T] = FlowControl(
            limits.send_budget, limits.stall_timeout, clock, wake, self._catch_up, size
        )
        self.conflated = 0  # changes merged away while behind (`server` stats, metrics)
        self.deliveries = 0  # channel updates queued for the client (metrics, status PVs)

    def _catch_up(self) -> None:
        """Queue what was merged while behind, from the current state: the flow control calls
        this once, when the writer has drained below half the budget."""
        raise NotImplementedError

    def _release(self, record: R) -> None:
        """Forget `record`'s attachment and close its view."""
        raise NotImplementedError

    def _idle(self, now: float) -> None:
        """The protocol's own once-a-second work (`housekeeping`)."""

    def housekeeping(self, now: float) -> None:
        """Once a second: close a stalled client, else the protocol's idle work."""
        if not self._flow.closing_slow(now):
            self._idle(now)

    def close(self) -> None:
        """The connection is gone: release every attachment. Idempotent."""
        for record in list(self._records.values()):
            self._release(record)
        self._flow.clear()


def _view(record: Record) -> object:
    return record.view


def _claims(record: Record) -> Claims:
    return record.claims


class _Field(Mapping[int, V]):
    """One field of a session's records by attachment number: read through, nothing copied, so
    what the hub reads cannot drift from what the session holds."""

    __slots__ = ("_get", "_records")

    def __init__(self, records: Mapping[int, Any], get: Callable[[Any], V]) -> None:
        self._records = records
        self._get = get

    def __getitem__(self, att: int) -> V:
        return self._get(self._records[att])

    def __iter__(self) -> Iterator[int]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)
