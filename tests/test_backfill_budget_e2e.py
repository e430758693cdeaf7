"""Backfill under the send budget over the real server and real WebSockets (PROTOCOL.md sections
2.8 and 9): sockets that attach a big backfill and read nothing hold at most their budget each,
and a reader attaching next to them gets every recorded update of its channels, then live ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import psutil
from pvwire.limits import HISTORY_MESSAGE_ROWS
from pvwire_client import Client, wire

from tests.eventually import eventually_async
from tests.server_process import ServerProcess, server_args_for_tests
from tests.stream_client import RawStream

CHANNELS = 200
POINTS = 800  # recorded updates of each channel before the sockets attach
RATE = 50  # Hz
IDLE_SOCKETS = 8
BUDGET = 256 * 1024  # server_args_for_tests' --send-budget
# One HISTORY message at most: its rows' columns and header.
MESSAGE = HISTORY_MESSAGE_ROWS * (8 * 4 + 1 + 2 + 1) + 256

SUBSCRIBE = """mutation($ids: [String!]!, $backfill: Float!) {
  subscribe(ids: $ids, options: {backfill: $backfill}) { token }
}"""


def backfill_token(server: ServerProcess, ids: list[str]) -> str:
    doc = server.graphql(SUBSCRIBE, {"ids": ids, "backfill": 3600.0})
    assert "errors" not in doc, doc
    return str(doc["data"]["subscribe"]["token"])


@contextlib.asynccontextmanager
async def recorded(server: ServerProcess, ids: list[str]) -> AsyncIterator[None]:
    """The channels monitored (so they record) from before the block until its end; the block
    starts once each has about POINTS updates."""
    seen = 0

    async def keep() -> None:
        nonlocal seen
        async with Client(server.url) as client:
            async for batch in client.monitor_batches(ids):
                seen += len(batch.sids)

    keeper = asyncio.create_task(keep())
    try:
        await eventually_async(lambda: seen > len(ids) * POINTS, timeout=120)
        yield
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)


def queued(server: ServerProcess) -> list[int]:
    doc = server.graphql("{ server { clients { endpoint queuedBytes attachments } } }")
    clients = doc["data"]["server"]["clients"]
    return [c["queuedBytes"] for c in clients if c["endpoint"] == "stream"]


async def test_sockets_that_read_nothing_hold_at_most_their_budget_of_backfill() -> None:
    ids = [f"sim://counter/bf{i}?rate={RATE}" for i in range(CHANNELS)]
    args = server_args_for_tests(["--stall-timeout", "300"])
    with ServerProcess(*args) as server:
        assert server.pid is not None
        proc = psutil.Process(server.pid)
        async with recorded(server, ids):
            token = backfill_token(server, ids)
            whole = CHANNELS * POINTS * (8 * 4 + 1 + 2 + 1)  # what one backfill holds at least
            assert whole > 20 * BUDGET
            queued(server)  # GraphQL's first answer built before measuring
            before = proc.memory_info().rss
            # Each socket attaches and then reads nothing (its library stops reading after one
            # message, so TCP pushes back).
            idle = [
                await RawStream.connect(server.ws_url, max_queue=1) for _ in range(IDLE_SOCKETS)
            ]
            try:
                for stream in idle:
                    await stream.send(16, 1, token)
                # Their queues fill up to the budget and stay there.
                await eventually_async(
                    lambda: sum(q >= BUDGET // 2 for q in queued(server)) >= IDLE_SOCKETS,
                    timeout=60,
                )
                grown = proc.memory_info().rss - before
                print(f"{IDLE_SOCKETS} idle sockets, backfill >= {whole:,} B each: server RSS "
                      f"+{grown:,} B, queued {queued(server)}")  # fmt: skip
                for q in queued(server):
                    assert q <= BUDGET + MESSAGE, (q, BUDGET)
                # Not a backfill each: a budget each (and the allocator's slack).
                assert grown < IDLE_SOCKETS * whole // 2, grown
                await reads_everything(server, ids[:5])
                for q in queued(server):
                    assert q <= BUDGET + MESSAGE, (q, BUDGET)
            finally:
                for stream in idle:
                    stream.ws.transport.abort()


async def reads_everything(server: ServerProcess, ids: list[str]) -> None:
    """A reader next to the idle sockets gets each counter's every recorded step up to the
    snapshot, as HISTORY points then the snapshot, with no gap and no duplicate; then live."""
    stream = await RawStream.connect(server.ws_url)
    try:
        await stream.send(16, 1, backfill_token(server, ids))
        points: dict[int, list[float]] = {sid: [] for sid in range(len(ids))}
        snapshot = None
        while snapshot is None:
            msg = await stream.recv(timeout=60)
            if isinstance(msg, wire.History):
                assert len(msg.t) <= HISTORY_MESSAGE_ROWS and not msg.gap.any()
                if msg.resolution == 0:  # (buckets come first when the ring has wrapped)
                    points[msg.sid] += msg.value.tolist()
            elif isinstance(msg, wire.Snapshot):
                snapshot = msg
            else:
                assert isinstance(msg, wire.Attached), msg
        for e in snapshot.entries:
            # A counter counts its updates: every one came once, in order, up to the snapshot.
            values = [*points[e.sid], float(e.value)]
            assert len(values) > POINTS, (e.sid, len(values))
            assert list(np.diff(values)) == [1.0] * (len(values) - 1), e.sid
        live = await stream.next_data(timeout=60)  # then the stream as always
        assert {g.att for g in live.groups} == {1}
        # Attached again saying what it holds (the snapshot's times): only the steps after.
        held = {
            e.sid: (e.seconds * 1_000_000_000 + e.nanoseconds, e.value)
            for e in snapshot.entries
            if e.seconds is not None and e.nanoseconds is not None
        }
        assert len(held) == len(snapshot.entries), "every snapshot entry has its time"
        await stream.send(
            16, 2, backfill_token(server, ids), [held[sid][0] for sid in sorted(held)]
        )
        after: dict[int, list[float]] = {sid: [] for sid in range(len(ids))}
        while True:
            msg = await stream.recv(timeout=60)
            if isinstance(msg, wire.History) and msg.att == 2:
                assert msg.resolution == 0 and msg.t.min() > held[msg.sid][0]
                after[msg.sid] += msg.value.tolist()
            elif isinstance(msg, wire.Snapshot) and msg.att == 2:
                break
        for e in msg.entries:
            held_t, held_value = held[e.sid]
            assert e.seconds is not None and e.nanoseconds is not None
            if e.seconds * 1_000_000_000 + e.nanoseconds == held_t:
                # No update since the first snapshot (the re-attach may come within a 50 Hz
                # period of it): nothing to send but the same value again.
                assert not after[e.sid] and e.value == held_value, e.sid
                continue
            values = [held_value, *after[e.sid], float(e.value)]
            assert list(np.diff(values)) == [1.0] * (len(values) - 1), e.sid
    finally:
        await stream.close()
