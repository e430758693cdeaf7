"""pytest-benchmark micro-benchmarks of the hot path (run by `make bench`; `make test` runs each
once with --benchmark-disable).

- one tick of the server's Ticker over K changed channels (upstream callbacks, one view's emit
  and one attached session's DATA frame), K = 100, 1,000, 10,000;
- one tick's frames for 100 clients sharing a view of 1,000 channels;
- the Python client decoding one DATA frame of 1,000 entries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from pvwire.core.channel import Channel
from pvwire.core.tick import Ticker
from pvwire.core.view import View, ViewKey
from pvwire.model import ConnState, Metadata
from pvwire.wire import codec as wire
from pvwire.wire.session import Session, SessionLimits
from pvwire_client import wire as client_wire


class _Host:
    pass


@pytest.fixture
def ticker() -> Iterator[Ticker]:
    """The server's own tick, on a loop that never runs: the benchmark calls `tick()` itself."""
    loop = asyncio.new_event_loop()
    try:
        yield Ticker(20.0, loop)
    finally:
        loop.close()


def _session(number: int) -> Session:
    return Session(number, "bench", _Host(), b"hello", SessionLimits(), lambda: None)  # type: ignore[arg-type]


def _setup(ticker: Ticker, k: int) -> tuple[list[Channel], View, Session]:
    """K connected channels in one view with one attached session, after a first tick."""
    channels = []
    for i in range(k):
        ch = Channel(f"ca://BENCH:C{i}", None, f"BENCH:C{i}", ticker)  # type: ignore[arg-type]
        ch.on_meta(Metadata("float64", 1, "", "", 0))
        ch.on_connection(ConnState.CONNECTED)
        ch.on_update(0.0, 1_700_000_000, 0, 0, 0, "NO_ALARM")
        channels.append(ch)
    view = View(ViewKey(tuple(c.id for c in channels), "LATEST", 0.0), channels)
    view.link()
    session = _session(0)
    view.attachments[(session, 1)] = None  # type: ignore[arg-type]
    _tick(ticker, session)
    return channels, view, session


def _tick(ticker: Ticker, session: Session) -> None:
    """One tick, then the session's frames handed to its (absent) socket."""
    ticker.tick()
    while (frame := session.next_frame()) is not None:
        session.sent(len(frame))


def _updates(channels: list[Channel], value: float) -> None:
    for ch in channels:
        ch.on_update(value, 1_700_000_000, 123_456_789, 0, 0, "NO_ALARM")


@pytest.mark.parametrize("k", [100, 1_000, 10_000])
def test_encode_tick(benchmark: Any, ticker: Ticker, k: int) -> None:
    """Upstream callbacks for K channels, then one tick encoding them (per tick, all K)."""
    channels, view, session = _setup(ticker, k)
    state = {"v": 1.0}

    def one_tick() -> None:
        state["v"] += 1.0
        _updates(channels, state["v"])
        _tick(ticker, session)

    benchmark(one_tick)
    assert view.tick_entries and session.frames_sent > 1


def test_frames_100_clients(benchmark: Any, ticker: Ticker) -> None:
    """One tick's DATA frame for each of 100 sessions attached to one 1,000-channel view."""
    channels, view, session = _setup(ticker, 1_000)
    sessions = [_session(i) for i in range(1, 101)]
    _updates(channels, 2.0)
    _tick(ticker, session)

    def frames() -> None:
        for s in sessions:
            s.collect(1, view)
            s.flush_tick()
            while (frame := s.next_frame()) is not None:
                s.sent(len(frame))

    benchmark(frames)
    assert sessions[0].frames_sent > 1


def test_client_decode_frame(benchmark: Any, ticker: Ticker) -> None:
    """The Python client decoding one DATA frame of 1,000 value+time entries."""
    channels, view, session = _setup(ticker, 1_000)
    _updates(channels, 3.0)
    _tick(ticker, session)
    frame = wire.encode_data(7, [(1, view.tick_entries)])
    msg = benchmark(client_wire.decode_message, frame)
    assert isinstance(msg, client_wire.Data)
