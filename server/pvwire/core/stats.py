"""Statistics as plain snapshots: `/metrics` and the `server` query read these, never the live
registries, so no endpoint reaches into the hub's dicts or holds a reference to its state."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import ConnState
from .control import ControlStats

__all__ = ["ChannelSnapshot", "ClientSnapshot", "HubSnapshot"]


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


@dataclass(frozen=True, slots=True)
class ChannelSnapshot:
    id: str
    subscribers: int
    updates: int
    update_rate: float
    state: ConnState


@dataclass(frozen=True, slots=True)
class HubSnapshot:
    uptime: float
    loop_lag: float  # seconds, worst in the last 10 s
    views: int
    ticks: int
    tick_seconds: float
    tick_buckets: tuple[int, ...]
    failures: dict[str, int]  # contained failures by unit: channel, view, session
    closes_by_code: dict[int, int]
    control: ControlStats
    # Totals over the process's life: never decreasing.
    updates_in: int
    frames_out: int
    bytes_out: int
    conflated: int
    queued_bytes: int
    clients: tuple[ClientSnapshot, ...]
    channels: tuple[ChannelSnapshot, ...]
    # Channels the upstream libraries hold open, by scheme then state (e.g. ca: searching).
    upstream_channels: dict[str, dict[str, int]]
