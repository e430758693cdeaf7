"""What pvws's inspection pages show of one `/pvws/pv` connection, copied out of its session.

The pages (`/pvws/summary`, `/pvws/socket`, `/pvws/pool`) read these frozen copies, never the live
session: a page is built while the tick goes on changing the session.
"""

from __future__ import annotations

from dataclasses import dataclass

from .session import PvwsSession

__all__ = ["PvSnapshot", "PvwsSocketSnapshot", "snapshot"]


@dataclass(frozen=True, slots=True)
class PvSnapshot:
    name: str  # as the client subscribed to it
    count: int  # elements of its current value: above 1 for an array
    shown: str  # the value for people: the value itself, or type and size of an array


@dataclass(frozen=True, slots=True)
class PvwsSocketSnapshot:
    id: str  # pvws's socket id
    created_ms: int  # POSIX milliseconds
    last_client_message_ms: int
    client_messages: int  # received so far: a millisecond clock cannot tell "one arrived"
    last_message_sent_ms: int
    queued_bytes: int
    pvs: tuple[PvSnapshot, ...]  # in subscription order


def snapshot(session: PvwsSession) -> PvwsSocketSnapshot:
    pvs = []
    for name, pv in list(session.pvs.items()):
        ch = pv.view.channels[0]
        value = ch.value
        size = getattr(value, "size", None)
        shown = f"{type(value).__name__}, size {size}" if size is not None else str(value)
        pvs.append(PvSnapshot(name, ch.meta.count or 0, shown))
    return PvwsSocketSnapshot(
        id=session.id,
        created_ms=session.created_ms,
        last_client_message_ms=session.last_client_message_ms,
        client_messages=session.client_messages,
        last_message_sent_ms=session.last_message_sent_ms,
        queued_bytes=session.queued_bytes,
        pvs=tuple(pvs),
    )
