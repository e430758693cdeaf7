"""pytest-benchmark micro-benchmarks of the hot path (run by `make bench`; `make test` runs each
once with --benchmark-disable).

- one tick's encoding of K changed channels (upstream callbacks + one view's emit), K = 100,
  1,000, 10,000;
- one tick's frames for 100 clients sharing a view of 1,000 channels;
- the Python client decoding one DATA frame of 1,000 entries.
"""

from __future__ import annotations

from typing import Any

import pytest
from pvwire.core.channel import Channel, DirtyListener
from pvwire.core.view import View, ViewKey
from pvwire.model import ConnState, Metadata
from pvwire.wire import codec as wire
from pvwire.wire.session import Session, SessionLimits
from pvwire_client import wire as client_wire


class _Listener(DirtyListener):
    def __init__(self) -> None:
        self.dirty: list[Channel] = []

    def mark_dirty(self, channel: Channel) -> None:
        self.dirty.append(channel)


def _setup(k: int) -> tuple[_Listener, list[Channel], View]:
    listener = _Listener()
    channels = []
    for i in range(k):
        ch = Channel(f"ca://BENCH:C{i}", None, f"BENCH:C{i}", listener)  # type: ignore[arg-type]
        ch.on_meta(Metadata("float64", 1, "", "", 0))
        ch.on_connection(ConnState.CONNECTED)
        ch.on_update(0.0, 1_700_000_000, 0, 0, 0, "NO_ALARM")
        channels.append(ch)
    view = View(ViewKey(tuple(c.id for c in channels), "LATEST", 0.0), channels)
    for sid, ch in enumerate(channels):
        ch.views.append((view, sid))
    _tick(listener, view)
    return listener, channels, view


def _tick(listener: _Listener, view: View) -> None:
    """What Hub.tick does for one view: hand changes to the view, encode once."""
    dirty, listener.dirty = listener.dirty, []
    for ch in dirty:
        mask, ch.dirty = ch.dirty, 0
        for v, sid in ch.views:
            v.add_change(sid, mask, ch)
    view.emit(0.0)


def _updates(channels: list[Channel], value: float) -> None:
    for ch in channels:
        ch.on_update(value, 1_700_000_000, 123_456_789, 0, 0, "NO_ALARM")


@pytest.mark.parametrize("k", [100, 1_000, 10_000])
def test_encode_tick(benchmark: Any, k: int) -> None:
    """Upstream callbacks for K channels, then one tick encoding them (per tick, all K)."""
    listener, channels, view = _setup(k)
    state = {"v": 1.0}

    def one_tick() -> None:
        state["v"] += 1.0
        _updates(channels, state["v"])
        _tick(listener, view)

    benchmark(one_tick)
    assert view.tick_entries


class _Host:
    pass


def test_frames_100_clients(benchmark: Any) -> None:
    """One tick's DATA frame for each of 100 sessions attached to one 1,000-channel view."""
    listener, channels, view = _setup(1_000)
    sessions = [
        Session(i, "bench", _Host(), b"hello", SessionLimits(), lambda: None)  # type: ignore[arg-type]
        for i in range(100)
    ]
    _updates(channels, 2.0)
    _tick(listener, view)

    def frames() -> None:
        for s in sessions:
            s.collect(1, view)
            s.flush_tick()
            while (frame := s.next_frame()) is not None:
                s.sent(len(frame))

    benchmark(frames)
    assert sessions[0].frames_sent > 1


def test_client_decode_frame(benchmark: Any) -> None:
    """The Python client decoding one DATA frame of 1,000 value+time entries."""
    listener, channels, view = _setup(1_000)
    _updates(channels, 3.0)
    _tick(listener, view)
    frame = wire.encode_data(7, [(1, view.tick_entries)])
    msg = benchmark(client_wire.decode_message, frame)
    assert isinstance(msg, client_wire.Data)
