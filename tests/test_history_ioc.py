"""Recent history over a real IOC and the real server: `history` over GraphQL, gaps where the IOC
went away, and the memory budget's policy with many channels."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil
import pytest
from pvwire.core.history import CHANNEL_BYTES, array_bytes
from pvwire.limits import HISTORY_MESSAGE_ROWS
from pvwire_client import Client, wire
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually_async
from tests.server_process import ServerProcess, server_args_for_tests
from tests.stream_client import RawStream
from tests.test_metrics import samples

DB = Path(__file__).parent / "dbs" / "test.db"
COUNTER = "ca://PVW:COUNTER"
HISTORY = """query($id: String!, $since: Float, $max: Int! = 1000) {
  history(id: $id, since: $since, maxPoints: $max) {
    id resolution truncated seconds nanoseconds value severity gap count
  }
}"""


def history(server: ServerProcess, cid: str, since: float | None = None) -> dict[str, Any]:
    doc = server.graphql(HISTORY, {"id": cid, "since": since})
    assert "errors" not in doc, doc
    got: dict[str, Any] = doc["data"]["history"]
    return got


async def collect(
    client: Client, ids: list[str], done: Callable[[list[tuple[int, Any, int, int]]], bool]
) -> list[tuple[int, Any, int, int]]:
    """(state, value, seconds, nanoseconds) of every update until `done` says so."""
    seen: list[tuple[int, Any, int, int]] = []
    updates = client.monitor(ids)
    try:
        async with asyncio.timeout(60):
            async for u in updates:
                c = u.channel
                seen.append((c.state, c.value, c.seconds or 0, c.nanoseconds or 0))
                if done(seen):
                    return seen
    finally:
        await updates.aclose()
    raise AssertionError("unreachable")


async def test_a_10hz_counter_comes_back_with_every_step_and_the_ioc_times(
    server: ServerProcess,
) -> None:
    async with Client(server.url) as client:
        seen = await collect(
            client, [COUNTER], lambda s: sum(v is not None for _, v, _, _ in s) > 30
        )
    values = [(v, s, ns) for st, v, s, ns in seen if st == 1 and v is not None]
    first, last = values[0], values[-1]
    got = history(server, COUNTER, since=first[1] + first[2] * 1e-9 - 0.001)
    assert got["resolution"] == 0 and not got["truncated"]
    rows = list(zip(got["value"], got["seconds"], got["nanoseconds"], got["gap"], strict=True))
    start = rows.index((first[0], first[1], first[2], False))
    end = rows.index((last[0], last[1], last[2], False))
    span = rows[start : end + 1]
    # Every step of the counter, none missing, none twice, with the IOC's own timestamps.
    assert [r[0] for r in span] == [float(x) for x in range(int(first[0]), int(last[0]) + 1)]
    assert all((v, s, ns, False) in span for v, s, ns in values)
    assert [(r[1], r[2]) for r in span] == sorted((r[1], r[2]) for r in span)


SUBSCRIBE = """mutation($ids: [String!]!, $backfill: Float!) {
  subscribe(ids: $ids, options: {backfill: $backfill}) { token }
}"""


def token(server: ServerProcess, ids: list[str], backfill: float = 0) -> str:
    doc = server.graphql(SUBSCRIBE, {"ids": ids, "backfill": backfill})
    assert "errors" not in doc, doc
    return str(doc["data"]["subscribe"]["token"])


Seen = list[tuple[int, Any]]  # (IOC time in ns, value) of each update an attachment got


async def backfill_after_30(
    stream: RawStream, server: ServerProcess, cid: str
) -> tuple[wire.Attached, list[wire.History], wire.Snapshot, Seen]:
    """Attach `cid` (it records from then on), and once 30 values came, attach it again with
    a minute of backfill: that attachment's ATTACHED, its HISTORY messages and its SNAPSHOT,
    and the values the first attachment got. Only entries with a value count: a busy server
    may send the connection and the metadata in ticks of their own before the first value."""
    await stream.attach(token(server, [cid]))
    seen: Seen = []
    while len(seen) < 30:
        data = await stream.next_data(timeout=30)
        for e in (e for g in data.groups for e in g.entries if e.value is not None):
            assert e.seconds is not None and e.nanoseconds is not None  # a value has its time
            seen.append((e.seconds * 10**9 + e.nanoseconds, e.value))
    stream.req += 1
    await stream.send(16, stream.req, token(server, [cid], backfill=60))
    attached = await stream.recv()
    while isinstance(attached, wire.Data):  # the first attachment's updates go on
        attached = await stream.recv()
    assert isinstance(attached, wire.Attached), attached
    histories: list[wire.History] = []
    while True:
        msg = await stream.recv()
        if isinstance(msg, wire.History):
            histories.append(msg)
        elif isinstance(msg, wire.Snapshot):
            return attached, histories, msg, seen


def assert_seen_are_recorded(t: npt.NDArray[np.int64], value: Any, seen: Seen, upto: int) -> None:
    """Every value the first attachment got before the snapshot's time `upto` is a row at its
    IOC time, and the rows go forward in time and value (a counter). Not every IOC step is
    there: the IOC's server merges updates for a client that falls behind, which a busy
    machine causes."""
    rows = {int(ti): v for ti, v in zip(t, value, strict=True)}
    for ti, v in seen:
        if ti < upto:
            np.testing.assert_array_equal(rows[ti], v)
    assert len(rows) >= sum(ti < upto for ti, _ in seen) >= 29
    assert all(np.diff(t) > 0)
    newest = value if value.ndim == 1 else value[:, -1]  # a frame ends with the counter's step
    assert all(np.diff(newest) > 0)


async def test_backfill_then_live_with_no_gap_or_duplicate_at_the_join(
    server: ServerProcess,
) -> None:
    stream = await RawStream.connect(server.ws_url)
    try:
        attached, histories, snapshot, seen = await backfill_after_30(stream, server, COUNTER)
        assert histories and all(h.att == attached.att for h in histories)
        points = histories[-1]
        assert points.resolution == 0
        after_gap = int(np.flatnonzero(points.gap)[-1]) + 1 if points.gap.any() else 0
        (entry,) = snapshot.entries
        assert entry.value is not None and entry.serial is not None
        assert entry.seconds is not None and entry.nanoseconds is not None
        snapshot_t = entry.seconds * 1_000_000_000 + entry.nanoseconds
        steps = points.value[after_gap:]
        assert_seen_are_recorded(points.t[after_gap:], steps, seen, snapshot_t)
        # The join: the snapshot is the newest value, after the last HISTORY row, not one of them.
        assert entry.value > steps[-1] and points.t[-1] < snapshot_t
        # Then live: DATA continues from the snapshot (a counter's steps are its serials).
        while True:
            data = await stream.next_data(timeout=30)
            mine = [e for g in data.groups if g.att == attached.att for e in g.entries]
            if mine:
                first = mine[0]
                break
        assert first.value is not None and first.serial is not None
        assert first.value - entry.value == first.serial - entry.serial >= 1
    finally:
        await stream.close()


@pytest.fixture
async def own_stack() -> AsyncIterator[tuple[IocProcess, ServerProcess]]:
    ioc = IocProcess([DB])
    ioc.start()
    server = ServerProcess(*server_args_for_tests(), env=ioc.ports.client_env())
    server.start()
    try:
        yield ioc, server
    finally:
        server.stop()
        ioc.stop()


async def test_an_ioc_restart_is_a_gap_in_the_history(
    own_stack: tuple[IocProcess, ServerProcess],
) -> None:
    ioc, server = own_stack
    async with Client(server.url) as client:
        updates = client.monitor([COUNTER])
        states: list[tuple[int, Any]] = []

        async def upto(predicate: Callable[[], bool], timeout: float) -> None:
            async with asyncio.timeout(timeout):
                async for u in updates:
                    states.append((u.channel.state, u.channel.value))
                    if predicate():
                        return

        await upto(lambda: sum(st == 1 for st, _ in states) > 5, 30)
        ioc.stop()
        await upto(lambda: states[-1][0] == 2, 30)
        mark = len(states)
        restarted = time.time()  # the new IOC's counter starts after this, at 10 Hz at most
        ioc.start()
        await upto(lambda: sum(st == 1 for st, _ in states[mark:]) > 5, 30)
        await updates.aclose()
    got = history(server, COUNTER)
    gaps = [i for i, g in enumerate(got["gap"]) if g]
    assert gaps, got
    g = gaps[0]
    before, after = got["value"][:g], got["value"][g + 1 :]
    assert before and after and None not in before and None not in after
    assert got["value"][g] is None and got["count"][g] == 0
    # The restarted IOC counts from its start again: the line must not join the two. Bounded
    # by the time since the restart (the IOC's own timestamps), not by the first IOC's last
    # count, which a slow reconnect (CA's search back-off, up to ~9 s here) lets the new count
    # pass. Scans may come late, never early.
    since = got["seconds"][g + 1] + got["nanoseconds"][g + 1] * 1e-9 - restarted
    assert after[0] <= 10 * since + 2, (after[0], since, before[-1])


async def test_the_budget_holds_with_many_channels_and_reclaims_released_ones() -> None:
    capacity = 4
    budget_mb = capacity * CHANNEL_BYTES / 2**20
    first = [f"sim://counter/a{i}?rate=10" for i in range(10)]
    second = [f"sim://counter/b{i}?rate=10" for i in range(capacity)]
    args = server_args_for_tests(["--history-mb", repr(budget_mb)])
    with ServerProcess(*args) as server:

        def metric(name: str) -> dict[str, str]:
            return samples(server.metrics(), name)

        async with Client(server.url) as client:
            await collect(client, first, lambda s: sum(v is not None for _, v, _, _ in s) > 20)
            m = metric("pvwire_history_bytes")
            assert m == {"": str(capacity * CHANNEL_BYTES)}
            assert metric("pvwire_history_refused_total") == {"": str(len(first) - capacity)}
            kept = [cid for cid in first if "errors" not in server.graphql(HISTORY, {"id": cid})]
            assert len(kept) == capacity
            refused = server.graphql(HISTORY, {"id": next(c for c in first if c not in kept)})
            assert refused["errors"][0]["extensions"]["code"] == "NO_HISTORY"
            # Released (after the linger): kept while nothing needs the room...
            await eventually_async(
                lambda: metric("pvwire_history_channels")['monitored="false"'] == "4"
            )
            assert "errors" not in server.graphql(HISTORY, {"id": kept[0]})
            # ...and reclaimed, oldest release first, when new channels need it.
            await collect(client, second, lambda s: sum(v is not None for _, v, _, _ in s) > 8)
            assert metric("pvwire_history_reclaimed_total") == {"": str(capacity)}
            assert metric("pvwire_history_bytes") == {"": str(capacity * CHANNEL_BYTES)}
            assert all("errors" not in server.graphql(HISTORY, {"id": c}) for c in second)


# What 2,000 sim channels cost the server without history, per channel: 3.5-4 KiB of RSS measured
# (--history-mb 0 and 1, 2026-11-24); four times that is allowed, still a third of a history's
# CHANNEL_BYTES (47 KiB), so histories past the budget (~100 MB for 2,000 channels) cannot fit.
CHANNEL_ALLOWANCE = 16 * 1024


async def test_the_budget_bounds_rss_with_thousands_of_channels() -> None:
    n = 2000
    capacity = 20
    budget = capacity * CHANNEL_BYTES
    args = server_args_for_tests(["--history-mb", repr(budget / 2**20)])
    with ServerProcess(*args) as server:
        assert server.pid is not None
        proc = psutil.Process(server.pid)

        def rss() -> int:
            return int(proc.memory_info().rss)

        def metric(name: str) -> dict[str, str]:
            return samples(server.metrics(), name)

        async def monitored(ids: list[str]) -> None:
            """Every channel of `ids` through ~2 s of updates, then released."""
            async with Client(server.url) as client:
                await collect(client, ids, lambda s: len(s) > 20 * n)  # len: O(1) per update

        server.graphql(HISTORY, {"id": "sim://counter/none"})  # GraphQL's first answer built
        before = rss()
        first = [f"sim://counter/first{i}?rate=10" for i in range(n)]
        await monitored(first)
        grown = rss() - before
        assert grown < budget + n * CHANNEL_ALLOWANCE, (grown, budget)
        assert int(metric("pvwire_history_budget_bytes")[""]) == budget
        assert metric("pvwire_history_bytes") == {"": str(capacity * CHANNEL_BYTES)}
        assert metric("pvwire_history_refused_total") == {"": str(n - capacity)}
        assert metric("pvwire_history_reclaimed_total") == {"": "0"}
        # Released: their histories stay until new channels need the room, then go, oldest first.
        await eventually_async(
            lambda: metric("pvwire_history_channels")['monitored="false"'] == str(capacity)
        )
        second = [f"sim://counter/second{i}?rate=10" for i in range(n)]
        await monitored(second)
        grown = rss() - before
        assert grown < budget + 2 * n * CHANNEL_ALLOWANCE, (grown, budget)
        assert metric("pvwire_history_bytes") == {"": str(capacity * CHANNEL_BYTES)}
        assert metric("pvwire_history_reclaimed_total") == {"": str(capacity)}
        assert metric("pvwire_history_refused_total") == {"": str(2 * n - 2 * capacity)}


@contextlib.asynccontextmanager
async def recording(client: Client, ids: list[str], updates: int) -> AsyncIterator[None]:
    """The channels monitored by `client` (so they record) while the block runs, which starts
    once more than `updates` updates came."""
    seen = 0

    async def drain() -> None:
        nonlocal seen
        async for _ in client.monitor(ids):
            seen += 1

    keeper = asyncio.create_task(drain())
    try:
        await eventually_async(lambda: seen > updates, timeout=60)
        yield
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)


async def test_the_python_client_yields_the_past_then_live_values(server: ServerProcess) -> None:
    async with Client(server.url) as client, recording(client, [COUNTER], 30):
        past: list[Any] = []
        live: list[Any] = []
        updates = client.monitor([COUNTER], backfill=60)
        async with asyncio.timeout(60):
            async for u in updates:
                if u.past:
                    assert not live, "a past update after a live one"
                    assert u.channel.serial is None
                    past.append(u.channel)
                elif u.channel.value is not None:
                    live.append(u.channel)
                    if len(live) == 3:
                        break
        await updates.aclose()
    values = [p.value for p in past]
    start = max((i + 1 for i, v in enumerate(values) if v is None), default=0)  # after any gap
    steps = values[start:]
    assert len(steps) >= 29 and steps == [steps[0] + i for i in range(len(steps))]
    # The join: the first live value is the step after the last past one.
    assert live[0].value == steps[-1] + 1
    assert (past[-1].seconds, past[-1].nanoseconds) < (live[0].seconds, live[0].nanoseconds)


async def test_past_rows_read_as_the_channel_s_type_with_its_metadata() -> None:
    """A released channel keeps its history; subscribed again, its past comes before the
    snapshot, which brings the metadata (the registration has none: the channel was closed).
    The client holds the past until then, so an integer channel's past values are integers, as
    its live ones (they were floats: `pvwire monitor --backfill` printed 52.0 above 55)."""
    counter = "sim://counter/pastint?rate=10"
    with ServerProcess(*server_args_for_tests()) as server:

        def released() -> bool:
            held = samples(server.metrics(), "pvwire_history_channels")
            return held.get('monitored="false"') == "1"

        async with Client(server.url) as client, recording(client, [counter], 10):
            pass  # recorded, then released
        await eventually_async(released, timeout=60)
        async with Client(server.url) as client:
            past: list[Any] = []
            live: list[Any] = []
            updates = client.monitor([counter], backfill=60)
            async with asyncio.timeout(60):
                async for u in updates:
                    (past if u.past else live).append(u.channel)
                    if live and live[-1].value is not None:
                        break
            await updates.aclose()
    values = [p.value for p in past if p.value is not None]
    assert len(values) >= 10 and live[-1].metadata["type"] == "int64", live[-1].metadata
    assert all(type(v) is int for v in values), values[:5]
    assert all(p.metadata == live[-1].metadata for p in past if p.value is not None)


async def test_pvwire_monitor_backfill_prints_the_past_lines_first(server: ServerProcess) -> None:
    async with Client(server.url) as client, recording(client, [COUNTER], 20):
        pvwire = str(Path(sys.executable).with_name("pvwire"))
        proc = await asyncio.create_subprocess_exec(
            pvwire, "monitor", "--json", "--backfill", "60", "--count", "3", COUNTER,
            env={**os.environ, "PVWIRE_URL": server.url},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    docs = [json.loads(line) for line in out.decode().splitlines()]
    # The past lines first: the live ones start with the first that has a serial. A live line
    # may carry no value (its metadata or alarm alone changed), which --count does not count.
    start = next(i for i, d in enumerate(docs) if d.get("serial") is not None)
    past = docs[:start]
    live = [d for d in docs[start:] if "value" in d["changed"]]
    assert len(live) == 3 and all(d.get("serial") is None for d in past), docs
    # An earlier test's monitoring of the counter ended with a gap: a line of its own.
    gaps = [i for i, d in enumerate(past) if d.get("connection") == "DISCONNECTED"]
    assert all(past[i].get("value") is None for i in gaps)
    values = [d["value"] for d in past[gaps[-1] + 1 if gaps else 0 :]]
    assert len(values) >= 20 and values == [values[0] + i for i in range(len(values))]
    assert live[0]["value"] == values[-1] + 1


async def test_history_channels_are_recorded_from_start_with_no_subscriber() -> None:
    # A glob over the catalogue (the test arguments list ca://PVW:COUNTER in it).
    args = server_args_for_tests(["--history-channels", "ca://PVW:COUNT*"])
    with ServerProcess(*args) as server:

        def recorded() -> int:
            doc = server.graphql(HISTORY, {"id": COUNTER})
            return 0 if "errors" in doc else len(doc["data"]["history"]["value"])

        await eventually_async(lambda: recorded() >= 20, timeout=60)
        got = history(server, COUNTER)
        steps = got["value"]
        assert steps[-10:] == [steps[-10] + i for i in range(10)]
        text = server.metrics()
        assert samples(text, "pvwire_history_channels")['monitored="true"'] == "1"
        assert samples(text, "pvwire_clients") == {"": "0"}


async def test_history_channels_globs_take_in_ids_the_catalogue_file_adds(tmp_path: Path) -> None:
    names = tmp_path / "names.txt"
    names.write_text("sim://counter/kept0?rate=10\n")
    args = ["--catalogue-file", str(names), "--history-channels", "sim://counter/kept*"]
    with ServerProcess(*server_args_for_tests(args)) as server:

        def recorded(cid: str) -> int:
            doc = server.graphql(HISTORY, {"id": cid})
            return 0 if "errors" in doc else len(doc["data"]["history"]["value"])

        await eventually_async(lambda: recorded("sim://counter/kept0?rate=10") >= 10, timeout=60)
        # An id the file gains while the server runs is held and recorded from then on, with
        # no subscriber, as the ids it had at start.
        names.write_text("sim://counter/kept0?rate=10\nsim://counter/kept1?rate=10\n")
        await eventually_async(lambda: recorded("sim://counter/kept1?rate=10") >= 10, timeout=60)
        text = server.metrics()
        assert samples(text, "pvwire_history_channels")['monitored="true"'] == "2"
        assert samples(text, "pvwire_clients") == {"": "0"}


# --- small arrays (--history-array-max) ---------------------------------------------------------

WAVE16 = "ca://PVW:WAVE16"  # the counter's last 16 values, a new array at each step
WAVE20 = "ca://PVW:WAVE20"  # 20 elements, processed with it
ARRAY_HISTORY = """query($id: String!, $max: Int! = 1000) {
  history(id: $id, maxPoints: $max) {
    resolution truncated seconds nanoseconds value min max mean gap count
  }
}"""


@pytest.fixture(scope="module")
def array_server(epics_env: IocProcess) -> Any:
    with ServerProcess(*server_args_for_tests(["--history-array-max", "16"])) as proc:
        yield proc


async def frames_seen(server: ServerProcess, n: int) -> list[tuple[list[float], int]]:
    """(elements, IOC time in ns) of `n` whole 16-element frames of WAVE16 seen by a monitor,
    while WAVE20 is monitored too (so both record)."""
    seen: list[tuple[list[float], int]] = []
    async with Client(server.url) as client:
        updates = client.monitor([WAVE16, WAVE20])
        try:
            async with asyncio.timeout(60):
                async for u in updates:
                    c = u.channel
                    if c.id == WAVE16 and isinstance(c.value, np.ndarray) and len(c.value) == 16:
                        seen.append(
                            (c.value.tolist(), (c.seconds or 0) * 10**9 + (c.nanoseconds or 0))
                        )
                        if len(seen) == n:
                            break
        finally:
            await updates.aclose()
    return seen


async def test_small_array_frames_come_back_from_history_with_the_ioc_times(
    array_server: ServerProcess,
) -> None:
    seen = await frames_seen(array_server, 30)
    doc = array_server.graphql(ARRAY_HISTORY, {"id": WAVE16})
    assert "errors" not in doc, doc
    got = doc["data"]["history"]
    assert got["resolution"] == 0 and not got["truncated"]
    rows = {
        s * 10**9 + ns: v
        for s, ns, v in zip(got["seconds"], got["nanoseconds"], got["value"], strict=True)
    }
    for elements, t in seen:  # every frame the monitor saw, at its IOC time
        assert rows[t] == elements
    steps = [v[-1] for v in rows.values() if None not in v]  # a gap's row is all null
    # Every frame the monitor saw is there (above), in order; not every step of the IOC's:
    # libca merges updates while the server falls behind, which a busy machine causes.
    assert len(steps) >= 30 and all(b > a for a, b in itertools.pairwise(steps))
    assert got["min"] == got["value"] == got["max"] and set(got["mean"]) == {None}
    # A frame longer than --history-array-max is not kept, and the answer says why.
    doc = array_server.graphql(ARRAY_HISTORY, {"id": WAVE20})
    assert doc["errors"][0]["extensions"]["code"] == "NO_HISTORY", doc
    assert "20 elements is longer than --history-array-max (16)" in doc["errors"][0]["message"]
    # The array channel's frames are in the figures: more than two channels' scalar buffers.
    text = array_server.metrics()
    channels = sum(int(v) for v in samples(text, "pvwire_history_channels").values())
    assert int(samples(text, "pvwire_history_bytes")[""]) > channels * CHANNEL_BYTES


async def test_an_array_answer_follows_the_response_cap(epics_env: IocProcess) -> None:
    """Each row of an array answer counts its 3 x 16 elements (and 7 more columns) against the
    response's element cap: asked for more rows than fit, the answer is coarser, not refused."""
    cap = 2_000  # 36 rows of 55 elements
    args = server_args_for_tests(["--history-array-max", "16"])
    with ServerProcess(*args, env={"PVWIRE_MAX_GRAPHQL_ELEMENTS": str(cap)}) as server:
        await frames_seen(server, 40)
        doc = server.graphql(ARRAY_HISTORY, {"id": WAVE16, "max": cap // 10})
    assert "errors" not in doc, doc
    got = doc["data"]["history"]
    rows = len(got["seconds"])
    assert 0 < rows <= cap // (10 - 3 + 3 * 16)
    assert got["resolution"] > 0  # 40 frames did not fit: 10 s buckets did
    assert all(len(v) == 16 for v in got["value"])


async def test_with_arrays_off_nothing_of_them_is_kept(server: ServerProcess) -> None:
    await frames_seen(server, 3)
    doc = server.graphql(ARRAY_HISTORY, {"id": WAVE16})
    assert doc["errors"][0]["extensions"]["code"] == "NO_HISTORY", doc
    assert "--history-array-max (it is 0)" in doc["errors"][0]["message"]
    text = server.metrics()
    channels = sum(int(v) for v in samples(text, "pvwire_history_channels").values())
    assert int(samples(text, "pvwire_history_bytes")[""]) == channels * CHANNEL_BYTES


async def test_array_backfill_comes_before_the_snapshot_with_no_duplicate_at_the_join(
    array_server: ServerProcess,
) -> None:
    stream = await RawStream.connect(array_server.ws_url)
    try:
        _, histories, snapshot, seen = await backfill_after_30(stream, array_server, WAVE16)
    finally:
        await stream.close()
    # The frames may come in several messages, each of at most HISTORY_MESSAGE_ROWS values.
    parts = [h for h in histories if h.resolution == 0]
    assert all(h.value.size <= HISTORY_MESSAGE_ROWS for h in parts)
    assert all(h.value.ndim == 2 and h.value.shape[1] == 16 for h in parts)
    assert all(h.min.shape == h.max.shape == h.value.shape for h in parts)
    t, value = np.concatenate([h.t for h in parts]), np.concatenate([h.value for h in parts])
    gap = np.concatenate([h.gap for h in parts])
    after_gap = int(np.flatnonzero(gap)[-1]) + 1 if gap.any() else 0
    frames = value[after_gap:]
    (entry,) = snapshot.entries
    assert isinstance(entry.value, np.ndarray) and entry.seconds is not None
    snapshot_t = entry.seconds * 1_000_000_000 + (entry.nanoseconds or 0)
    assert_seen_are_recorded(t[after_gap:], frames, seen, snapshot_t)
    assert all((np.diff(frames, axis=1) == 1).all(axis=1))  # each the counter's last 16 steps
    # The join: the snapshot's frame is newer than the last HISTORY row, not one of them.
    assert entry.value[-1] > frames[-1, -1] and t[-1] < snapshot_t


async def test_the_python_client_yields_an_array_channel_s_past_as_arrays(
    array_server: ServerProcess,
) -> None:
    async with Client(array_server.url) as client, recording(client, [WAVE16], 20):
        past: list[Any] = []
        updates = client.monitor([WAVE16], backfill=60)
        async with asyncio.timeout(60):
            async for u in updates:
                if not u.past:
                    live = u.channel.value
                    break
                past.append(u.channel.value)
        await updates.aclose()
    frames = [v for v in past if v is not None]
    assert len(frames) >= 20 and all(isinstance(v, np.ndarray) and v.shape == (16,) for v in frames)
    assert live[-1] == frames[-1][-1] + 1


async def test_array_histories_share_the_budget_and_the_rest_are_refused_once() -> None:
    """Ten 16-element sim waveforms under a budget that holds every channel's scalar buffers and
    two channels' frames: two keep their frames, eight are refused (counted once each, not per
    frame), and what the store holds never passes the budget."""
    n, fit = 10, 2
    budget = n * CHANNEL_BYTES + fit * array_bytes(16) + array_bytes(16) // 2
    ids = [f"sim://waveform/w{i}?length=16&rate=10" for i in range(n)]
    args = ["--history-mb", repr(budget / 2**20), "--history-array-max", "16"]
    with ServerProcess(*server_args_for_tests(args)) as server:

        def metric(name: str) -> dict[str, str]:
            return samples(server.metrics(), name)

        async with Client(server.url) as client:
            # Several frames of every channel: each refused channel was offered many.
            await collect(client, ids, lambda s: sum(v is not None for _, v, _, _ in s) > 5 * n)
            held = int(metric("pvwire_history_bytes")[""])
            assert held == n * CHANNEL_BYTES + fit * array_bytes(16) <= budget
            assert metric("pvwire_history_refused_total") == {"": str(n - fit)}
            answers = [server.graphql(ARRAY_HISTORY, {"id": cid}) for cid in ids]
    kept = [a for a in answers if "errors" not in a]
    assert len(kept) == fit and all(
        len(v) == 16 for a in kept for v in a["data"]["history"]["value"]
    )
    for a in answers:
        if "errors" in a:
            assert "no room for its arrays" in a["errors"][0]["message"], a
