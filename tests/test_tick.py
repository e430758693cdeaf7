"""The tick's timer (core/tick.py), on a real event loop: no sockets, no IOC."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pvwire.core.channel import Channel
from pvwire.core.tick import LOGGED_ONCE, Ticker

from .hub_doubles import FakeBackend


async def test_an_overdue_tick_is_armed_once_not_once_per_change() -> None:
    """Changes arriving while the tick is overdue join it; they never cancel and re-arm it.

    Storing `max(when, now)` as the due time made every later change of a late tick cancel the
    timer and arm a new one at a later `now`: a timer per update while the loop was behind.
    """
    loop = asyncio.get_running_loop()
    ticker = Ticker(20.0, loop)
    backend = FakeBackend()
    channels = [Channel(f"fake://c{i}", backend, f"c{i}", ticker) for i in range(3)]
    ticker._last_tick = loop.time() - 1.0  # the last tick was long ago: the next one is overdue
    channels[0].on_update(1.0, 1, 0, 0, 0, "")
    armed = ticker._handle
    assert armed is not None
    for ch in channels[1:]:
        ch.on_update(2.0, 2, 0, 0, 0, "")
    assert ticker._handle is armed and not armed.cancelled()
    for _ in range(100):  # a past timer runs on the loop's next iterations
        if ticker.stats.ticks:
            break
        await asyncio.sleep(0)
    assert ticker.stats.ticks == 1
    assert all(ch.dirty == 0 for ch in channels)  # the one tick took every change


def test_failures_are_logged_once_each_up_to_the_table_s_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`failures_logged_once`: each failing unit is logged once while the memory of them has
    room; beyond it, a further unit is logged each time (never silenced, never unbounded)."""
    ticker = Ticker(20.0)
    with caplog.at_level(logging.ERROR, logger="pvwire.tick"):
        for unit in range(LOGGED_ONCE):
            ticker._once(unit, "unit %d failed", unit)
            ticker._once(unit, "unit %d failed", unit)  # remembered: not logged again
        assert len(caplog.records) == LOGGED_ONCE
        for _ in range(3):
            ticker._once("one more", "one more failed")  # no room left: logged each time
        assert len(caplog.records) == LOGGED_ONCE + 3
