"""What the Archiver Appliance API (pvwire/aa/) reads of one channel: its history's rings, and
what the channel holds now when it is open (its type, metadata and current value: a string
channel has no history, only its current value)."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import ConnState, Metadata, Value
from .channel import Channel
from .history import ChannelHistory
from .history.reading import Held

__all__ = ["Recorded", "recorded"]


@dataclass(frozen=True, slots=True)
class Recorded:
    id: str  # canonical
    rings: Held | None  # its history, written and folded; None: none held (or it failed)
    unkept: str  # why values of it were not recorded ("" if all were)
    open: bool  # the channel is open (monitored, or lingering)
    meta: Metadata  # its metadata while open; empty otherwise
    value: Value  # its current value while open and connected, else None
    seconds: int
    nanoseconds: int
    severity: int
    status: int
    connected: bool
    updates: int  # updates since it was opened


def recorded(cid: str, channel: Channel | None, history: ChannelHistory | None) -> Recorded:
    rings = history.rings() if history is not None and not history.failed else None
    unkept = history.unkept if history is not None else ""
    if channel is None:
        return Recorded(cid, rings, unkept, False, Metadata(), None, 0, 0, 0, 0, False, 0)
    connected = channel.state == ConnState.CONNECTED
    return Recorded(
        cid,
        rings,
        unkept,
        True,
        channel.meta,
        channel.value if connected and not channel.fault else None,
        channel.seconds,
        channel.nanoseconds,
        channel.severity,
        channel.status,
        connected,
        channel.updates,
    )
