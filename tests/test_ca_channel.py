"""ca_channel.py against the real test IOC: the polled libca context, the scalar DBR_TIME unpacking
and the Python thread states kept for libca's threads."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from aioca import DBE_ALARM, DBE_VALUE, FORMAT_TIME
from epicscorelibs.ca import cadef
from pvwire.upstream import ca_channel
from pvwire.upstream.ca_channel import CaChannel
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually_async

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]

TIMEOUT = 10.0


async def _first_update(chan: CaChannel) -> Any:
    got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def on_value(update: Any) -> None:
        if not got.done():
            got.set_result(update)

    sub = chan.subscribe(on_value, DBE_VALUE | DBE_ALARM, FORMAT_TIME, 0)
    try:
        return await asyncio.wait_for(got, TIMEOUT)
    finally:
        sub.close()


@pytest.mark.parametrize(
    ("name", "dbf", "kind"),
    [
        ("PVW:AO", 6, float),  # DBR_TIME_DOUBLE
        ("PVW:FLOAT1", 2, float),  # DBR_TIME_FLOAT, a one-element waveform
        ("PVW:LONG", 5, int),  # DBR_TIME_LONG
        ("PVW:MBBO", 3, int),  # DBR_TIME_ENUM: the index
        ("PVW:AO.PREC", 1, int),  # DBR_TIME_SHORT
        ("PVW:AO.PACT", 4, int),  # DBR_TIME_CHAR (DBF_UCHAR)
    ],
)
async def test_scalar_updates_unpack_as_aioca_converts_them(
    name: str, dbf: int, kind: type
) -> None:
    chan = CaChannel(name)
    try:
        assert await chan.wait_connected(TIMEOUT)
        assert chan.field_type == dbf and chan.element_count == 1
        value, secs, nsec, severity, status = await _first_update(chan)
        # aioca's own DBR conversion of the same record (these records do not change).
        ref = await chan.get(None, FORMAT_TIME, 0, TIMEOUT)
    finally:
        chan.close()
    assert type(value) is kind
    assert value == ref
    assert (secs, nsec) == ref.raw_stamp
    assert (severity, status) == (ref.severity, ref.status)


async def test_other_updates_carry_aiocas_value_and_its_time() -> None:
    for name in ("PVW:STR", "PVW:WF"):
        chan = CaChannel(name)
        try:
            assert await chan.wait_connected(TIMEOUT)
            value, secs, nsec, severity, status = await _first_update(chan)
        finally:
            chan.close()
        assert (secs, nsec) == value.raw_stamp
        assert (severity, status) == (value.severity, value.status)
        assert secs > 1_600_000_000


async def test_the_loop_thread_polls_its_own_context() -> None:
    chan = CaChannel("PVW:COUNTER")
    try:
        assert await chan.wait_connected(TIMEOUT)
        await _first_update(chan)
    finally:
        chan.close()
    driver = ca_channel._driver()
    assert driver.polled
    assert ca_channel._local.fds  # libca named its wake-up socket


async def test_updates_that_arrive_while_the_loop_is_busy_all_reach_it_in_order() -> None:
    """A loop that runs late gets every update libca held for it meanwhile, not only the newest:
    the 10 Hz counter's values stay consecutive across a stall of 0.5 s (~5 updates). An `ALL`
    subscription and the recorded history need each one (a replica holding 1,000 clients lost
    some in bench/drain.py when only the newest was kept)."""
    values: list[int] = []
    chan = CaChannel("PVW:COUNTER")
    try:
        assert await chan.wait_connected(TIMEOUT)
        sub = chan.subscribe(lambda u: values.append(int(u[0])), DBE_VALUE, FORMAT_TIME, 0)
        await eventually_async(lambda: len(values) >= 2, "the counter's first updates")
        time.sleep(0.5)  # the loop busy, as under load: the stall is what is tested
        held = len(values)
        await eventually_async(lambda: len(values) >= held + 10, "updates after the stall")
        sub.close()
    finally:
        chan.close()
    assert values == list(range(values[0], values[0] + len(values))), values
    assert sub.dropped_callbacks == 0


async def test_what_one_loop_pass_asks_of_libca_goes_out_in_one_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Channels, subscriptions, requests and clears made in one pass are flushed once, after
    it: a flush per call was two thirds of the CPU of 2,000 monitors opening at once."""
    flushes: list[str] = []
    real_flush = cadef.ca_flush_io

    def counted_flush() -> None:
        flushes.append("flush")
        real_flush()

    monkeypatch.setattr(cadef, "ca_flush_io", counted_flush)
    names = ["PVW:AO", "PVW:LONG", "PVW:MBBO", "PVW:COUNTER"]
    channels = [CaChannel(name) for name in names]
    try:
        assert flushes == []  # nothing sent in the middle of the pass
        await asyncio.sleep(0)
        assert flushes == ["flush"]
        for chan in channels:
            assert await chan.wait_connected(TIMEOUT)
        flushes.clear()
        got: list[Any] = []
        subs = [c.subscribe(got.append, DBE_VALUE, FORMAT_TIME, 0) for c in channels]
        assert flushes == []
        await asyncio.sleep(0)
        assert flushes == ["flush"]
        flushes.clear()
        # The four requests are made in one pass, by the gather's tasks.
        values = await asyncio.gather(*(c.get(None, FORMAT_TIME, 0, TIMEOUT) for c in channels))
        assert flushes == ["flush"]
        await eventually_async(lambda: len(got) >= len(channels), "each subscription's first")
        flushes.clear()
        for sub in subs:
            sub.close()
    finally:
        for chan in channels:
            chan.close()
    assert flushes == []
    await asyncio.sleep(0)
    assert flushes == ["flush"]  # the pass's clears, together
    assert [v.name for v in values] == names


# Two held: by count, or by bytes (the counter is a double, 8 bytes a value).
@pytest.mark.parametrize(("bound", "value"), [("QUEUE_SIZE", 2), ("QUEUE_BYTES", 16)])
async def test_past_the_queue_the_oldest_held_updates_are_dropped_and_counted(
    monkeypatch: pytest.MonkeyPatch, bound: str, value: int
) -> None:
    monkeypatch.setattr(ca_channel, bound, value)
    values: list[int] = []
    chan = CaChannel("PVW:COUNTER")
    try:
        assert await chan.wait_connected(TIMEOUT)
        sub = chan.subscribe(lambda u: values.append(int(u[0])), DBE_VALUE, FORMAT_TIME, 0)
        await eventually_async(lambda: len(values) >= 2, "the counter's first updates")
        before = values[-1]
        time.sleep(0.6)  # ~6 updates arrive; 2 are kept
        await eventually_async(lambda: values[-1] >= before + 8, "updates after the stall")
        sub.close()
    finally:
        chan.close()
    # Every value either reached the loop or was counted as dropped, none twice; those that
    # were dropped are the oldest of the stall, the newest reach the loop.
    assert values == sorted(set(values))
    seen = values[-1] - values[0] + 1
    assert sub.dropped_callbacks >= 1 and len(values) + sub.dropped_callbacks == seen


def test_a_thread_whose_context_is_preemptive_keeps_it() -> None:
    """A thread where aioca (or anyone) made a preemptive context first: results are posted."""
    result: list[Any] = []

    async def use_it() -> None:
        chan = CaChannel("PVW:LONG")
        try:
            assert await chan.wait_connected(TIMEOUT)
            result.append((ca_channel._driver().polled, await _first_update(chan)))
        finally:
            chan.close()

    def thread() -> None:
        cadef.ca_context_create(1)  # ca_enable_preemptive_callback
        try:
            asyncio.run(use_it())
        finally:
            cadef.ca_context_destroy()

    t = threading.Thread(target=thread)
    t.start()
    t.join(60)
    assert not t.is_alive() and result
    polled, (value, secs, _nsec, _severity, _status) = result[0]
    assert polled is False
    assert type(value) is int and secs > 1_600_000_000


async def test_a_libca_thread_that_ends_gives_its_thread_state_back(
    epics_env: IocProcess,
) -> None:
    loop = asyncio.get_running_loop()
    chan = CaChannel("PVW:COUNTER")
    try:
        assert await chan.wait_connected(TIMEOUT)
        await _first_update(chan)
        kept = set(ca_channel._pinned)
        assert kept  # the circuit's receive thread keeps its thread state between callbacks
        await loop.run_in_executor(None, epics_env.stop)
        # The circuit to the IOC closes and its receive thread ends, giving its state back.
        await eventually_async(
            lambda: not kept <= ca_channel._pinned, "the receive thread's state given back"
        )
    finally:
        chan.close()
        if not epics_env.running:
            await loop.run_in_executor(None, epics_env.start)
