"""Upstream backends: one per channel-id scheme (ca, pva, sim)."""

from .base import Backend, ChannelSink, Monitor

__all__ = ["Backend", "ChannelSink", "Monitor"]
