"""Statistics as plain snapshots: `/metrics` and the `server` query read these, never the live
registries, so no endpoint reaches into the hub's dicts or holds a reference to its state."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model import ConnState
from .channel import FAILURE_UNITS
from .control import ControlStats
from .history import HistoryStats

__all__ = ["FAILURE_UNITS", "ChannelSnapshot", "ClientSnapshot", "HubSnapshot"]


@dataclass(frozen=True, slots=True)
class ClientSnapshot:
    number: int
    address: str
    attachments: int
    channels: int
    queued_bytes: int
    conflated: int
    frames_sent: int
    bytes_sent: int
    connected_seconds: float
    endpoint: str = "stream"  # or "pvws"
    identity: str = ""  # who the client's subscriptions were made by
    deliveries: int = 0  # channel updates queued for it (Client.deliveries)


@dataclass(frozen=True, slots=True)
class ChannelSnapshot:
    id: str
    subscribers: int
    updates: int
    update_rate: float
    state: ConnState
    last_update: float | None = None  # POSIX seconds of the latest value's timestamp


@dataclass(frozen=True, slots=True)
class HubSnapshot:
    uptime: float
    loop_lag: float  # seconds, worst in the last 10 s
    views: int
    ticks: int
    tick_seconds: float
    tick_buckets: tuple[int, ...]
    failures: dict[str, int]  # contained failures by unit (FAILURE_UNITS)
    closes_by_code: dict[int, int]
    control: ControlStats
    # Totals over the process's life: never decreasing.
    updates_in: int
    frames_out: int
    bytes_out: int
    conflated: int
    deliveries: int  # channel updates queued for clients, both endpoints
    dropped: int  # `ALL` mode updates dropped at its bounds
    queued_bytes: int
    clients: tuple[ClientSnapshot, ...]  # empty unless asked for in detail
    channels: tuple[ChannelSnapshot, ...]  # likewise
    client_count: int  # connected clients of both endpoints, in detail or not
    channel_count: int  # open upstream channels, likewise
    # Channels the upstream libraries hold open, by scheme then state (e.g. ca: searching).
    upstream_channels: dict[str, dict[str, int]]
    history: HistoryStats
    auth_refusals: dict[str, int]  # refused authentications by reason (access/refusals.py)
    put_refusals: dict[str, int]  # puts refused by pvwire by reason (refusals.PUT_REASONS)
    # What pvwire's own clients refused from upstream servers, by scheme then reason.
    peer_refusals: dict[str, dict[str, int]] = field(default_factory=dict)
    # Reads of the archive behind the history, by outcome (core/archive/fetch.py OUTCOMES),
    # and the bytes its cache holds.
    archive_reads: dict[str, int] = field(default_factory=dict)
    archive_cache_bytes: int = 0
