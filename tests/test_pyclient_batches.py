"""Client.monitor_batches against the real server: the same states as monitor, one Batch a frame.

Uses the session's server and test IOC (``server_url``), and servers of its own for a restart
and for a connection's channel limit.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import pytest
from pvwire_client import Batch, Client, TooManyChannels, Update
from pvwire_client.batch import BatchMerger
from pvwire_client.entry import CONN, CONNECTED, CONNECTING, DISCONNECTED, META, TIME, VALUE
from pvwire_client.state import ChannelState

from tests.server_process import ServerProcess

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]

COUNTERS = ["ca://PVW:COUNTER", "sim://counter/batches"]
CHANNELS = [*COUNTERS, "ca://PVW:AO", "ca://PVW:WF"]


async def batches_until(
    it: AsyncIterator[Batch], done: Callable[[Batch], bool], timeout: float = 20
) -> list[Batch]:
    """Batches up to the first one ``done`` accepts; fails after ``timeout`` seconds."""
    out: list[Batch] = []
    async with asyncio.timeout(timeout):
        async for b in it:
            out.append(Batch(b.states, dict(b.changed), b.snapshot))  # `changed` is per batch
            if done(b):
                return out
    raise AssertionError("the monitor ended")


def fields(s: ChannelState) -> str:
    """Everything a state holds, as text: NaN limits in the metadata compare equal."""
    value = s.value.tolist() if isinstance(s.value, np.ndarray) else s.value
    return repr((s.id, value, s.serial, s.conflated, s.time, s.severity, s.status, s.message,
                 s.metadata, s.state, s.reason))  # fmt: skip


# --- the pure merge ----------------------------------------------------------------------------


def test_a_cold_channel_is_first_shown_with_its_value_and_all_it_learnt_before() -> None:
    merger = BatchMerger([ChannelState("ca://A"), ChannelState("ca://B")])
    cold = merger.entries([[0, META | CONN, {"units": "mA"}, CONNECTING, ""]], snapshot=True)
    assert cold is None  # still connecting, no value: nothing to show yet
    warm = merger.entries([[0, VALUE | TIME | CONN, 2.5, 7, 1700000000, 0, CONNECTED, ""]])
    assert warm is not None and warm.changed == {0: VALUE | TIME | META | CONN}
    ((state, names),) = list(warm)
    assert names == {"value", "time", "metadata", "connection"}
    assert (state.value, state.units, state.connected) == (2.5, "mA", True)
    # Later entries name only what they changed; a repeat changes nothing but is still listed.
    later = merger.entries([[0, VALUE, 2.5, 8], [0, VALUE, 2.5, 8]])
    assert later is not None and later.changed == {0: VALUE} and len(later) == 1


def test_a_lost_connection_shows_each_connected_channel_disconnected_once() -> None:
    merger = BatchMerger([ChannelState("ca://A"), ChannelState("ca://B")])
    merger.entries([[0, VALUE | CONN, 1, 1, CONNECTED, ""]], snapshot=True)
    lost = merger.lost("stream closed: 1012")
    assert lost is not None and lost.sids == [0]  # B never connected: nothing to say
    assert (lost.states[0].state, lost.states[0].reason) == (DISCONNECTED, "stream closed: 1012")
    assert merger.lost("cannot connect") is None


# --- against the real server -------------------------------------------------------------------


async def test_batches_merge_to_the_states_monitor_yields(server_url: str) -> None:
    by_batch: dict[tuple[str, int | None], tuple[str, frozenset[str]]] = {}
    by_update: dict[tuple[str, int | None], tuple[str, frozenset[str]]] = {}
    arrays: list[np.ndarray[Any, Any]] = []

    def enough(seen: dict[tuple[str, int | None], Any]) -> bool:
        return all(sum(k[0] == c for k in seen) >= 8 for c in COUNTERS)

    async def read_batches(c: Client) -> None:
        async with asyncio.timeout(30):
            async for b in c.monitor_batches(CHANNELS):
                for state, names in b:
                    by_batch.setdefault((state.id, state.serial), (fields(state), names))
                    if isinstance(state.value, np.ndarray):
                        arrays.append(state.value)
                if enough(by_batch) and enough(by_update):
                    return

    async def read_updates(c: Client) -> None:
        async with asyncio.timeout(30):
            u: Update
            async for u in c.monitor(CHANNELS):
                by_update.setdefault(
                    (u.channel.id, u.channel.serial), (fields(u.channel), u.changed)
                )
                if enough(by_batch) and enough(by_update):
                    return

    async with Client(server_url) as a, Client(server_url) as b:
        await asyncio.gather(read_batches(a), read_updates(b))
    firsts = {
        min((k for k in d if k[0] == c), key=lambda k: k[1] or 0)
        for d in (by_batch, by_update)
        for c in CHANNELS
    }
    common = (by_batch.keys() & by_update.keys()) - firsts
    assert all(sum(k[0] == c for k in common) >= 5 for c in COUNTERS), sorted(common)
    for key in common:
        assert by_batch[key] == by_update[key], key
    # Arrays are read-only views over the received bytes, not copies.
    assert arrays and all(not a.flags.writeable and a.base is not None for a in arrays)


async def value_batches(it: AsyncIterator[Batch], n: int) -> list[tuple[int, int, int]]:
    """(serial, value, conflated) of channel 0 after each of the next ``n`` batches that changed
    its value (a counter: its value is an int)."""
    out: list[tuple[int, int, int]] = []
    async with asyncio.timeout(30):
        async for b in it:
            s = b.states[0]
            if b.changed.get(0, 0) & VALUE:
                assert s.serial is not None
                out.append((s.serial, int(s.value), s.conflated))
                if len(out) == n:
                    return out
    raise AssertionError("the monitor ended")


async def test_conflated_updates_are_counted_from_the_serials(server_url: str) -> None:
    async with Client(server_url) as c:
        # 2 Hz of a 10 Hz counter: the server merges ~4 updates of 5 and says so in the serial.
        got = await value_batches(c.monitor_batches("ca://PVW:COUNTER", max_rate=2), 6)
    skipped = sum(b[0] - a[0] - 1 for a, b in itertools.pairwise(got))
    assert skipped > 0 and got[-1][2] - got[0][2] == skipped
    assert got[-1][1] - got[0][1] == got[-1][0] - got[0][0]


async def test_all_mode_batches_merge_every_entry_of_a_frame_and_lose_none(
    server_url: str,
) -> None:
    async with Client(server_url) as c:
        # ALL mode at 2 Hz: every update arrives, ~5 per frame, merged into one batch.
        it = c.monitor_batches("ca://PVW:COUNTER", max_rate=2, mode="ALL")
        got = await value_batches(it, 6)
    steps = [b[0] - a[0] for a, b in itertools.pairwise(got)]
    assert max(steps) > 1
    # Every counter step is in the serial. Not asserted: no conflation at all, because a server
    # loop stalled for 100 ms or more (load average 8 on a 2-core machine) lets the CA backend
    # merge two updates of the IOC, which is counted as conflated and is correct.
    assert got[-1][1] - got[0][1] == sum(steps)


@pytest.fixture
def own_server() -> Iterator[ServerProcess]:
    with ServerProcess("--log-level", "warning") as s:
        yield s


async def test_a_restarted_server_shows_disconnected_then_a_fresh_snapshot(
    own_server: ServerProcess,
) -> None:
    ids = [f"sim://counter/restart{i}" for i in range(3)]
    async with Client(own_server.url, reconnect_base=0.05, reconnect_max=0.5) as c:
        it = c.monitor_batches(ids)
        # New sim channels start cold: their snapshot is held back, the first DATA shows them.
        (first,) = await batches_until(it, lambda b: True)
        assert first.sids == [0, 1, 2]
        assert all(s.connected for s in first.states)
        await batches_until(it, lambda b: not b.snapshot)  # streaming
        # The same port and token key: the monitor's token is valid on the new process.
        stop = asyncio.create_task(asyncio.to_thread(own_server.stop))
        down = await batches_until(it, lambda b: any(not s.connected for s in b.states))
        await stop
        assert down[-1].sids == [0, 1, 2] and not down[-1].snapshot
        assert all(bits & CONN for bits in down[-1].changed.values())
        # The server stopped with SIGTERM: it drained (4012), as the test servers do, at once.
        assert all(s.state == DISCONNECTED and "4012" in s.reason for s in down[-1].states)
        await asyncio.to_thread(own_server.start)
        back = await batches_until(it, lambda b: b.snapshot)
        snap = back[-1]
        # The new process's channels start cold: connecting, the last value kept until theirs.
        assert snap.sids == [0, 1, 2] and all(bits & CONN for bits in snap.changed.values())
        assert not any(s.state == DISCONNECTED for s in snap.states)
        live = await batches_until(it, lambda b: all(s.connected for s in b.states))
        # The new process counts from its own start: a new baseline, no conflation counted.
        assert all(s.conflated == 0 and s.serial is not None for s in live[-1].states)


async def test_an_attachment_over_the_connection_limit_fails_alone() -> None:
    env = {"PVWIRE_MAX_CHANNELS_PER_CONNECTION": "4"}
    with ServerProcess("--log-level", "warning", env=env) as server:
        async with Client(server.url) as c:
            ok = c.monitor_batches([f"sim://counter/limit{i}" for i in range(3)])
            await batches_until(ok, lambda b: True)
            refused = c.monitor_batches([f"sim://counter/over{i}" for i in range(3)])
            with pytest.raises(TooManyChannels, match="4413"):
                await batches_until(refused, lambda b: True)
            # The first attachment goes on streaming on the same connection.
            more = await batches_until(ok, lambda b: not b.snapshot)
            assert more[-1].states[0].connected
