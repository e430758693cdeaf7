"""Backfill under the send budget (PROTOCOL.md section 2.8, DESIGN.md section 7d), in memory: a
real hub and history store, sessions driven the way the socket pump drives them.

A client that reads nothing holds at most its budget of backfill; one that reads gets every
recorded update exactly once, the past as HISTORY and the rest live, joined without gap or
duplicate even when updates keep coming while it reads; a re-attach that says what it holds gets
only what is newer.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest
from pvwire.core.history import ChannelHistory
from pvwire.core.hub import Hub
from pvwire.limits import BACKFILL_PASSES, HISTORY_MESSAGE_ROWS
from pvwire.wire import codec as wire
from pvwire.wire.session import SessionLimits
from pvwire_client.session import Backfill as ClientBackfill
from pvwire_client.session import Entries as ClientEntries
from pvwire_client.session import Session as ClientSession

from tests.hub_doubles import Client, FakeBackend, attach, decode

NS = 1_000_000_000
ROW_BYTES = 8 * 4 + 1 + 2 + 1  # t, value, min, max, severity, status, gap


def record(hub: Hub, backend: FakeBackend, ids: list[str], n: int, start: int) -> None:
    """`n` updates of each channel, one a second of IOC time from `start`: value = its index."""
    for i in range(n):
        for cid in ids:
            backend.update(cid.removeprefix("fake://"), float(start + i), t=start + i)
    hub.ticker.tick()


def read(client: Client, frames: int) -> list[Any]:
    """The writer sends up to `frames` messages (the client reads them), as the pump does."""
    out = []
    for _ in range(frames):
        frame = client.session.next_frame()
        if frame is None:
            break
        client.session.sent(len(frame))
        out.append(frame)
    msgs = [decode(f) for f in out]
    client.received += msgs
    return msgs


def channel_rows(msgs: list[Any], att: int) -> tuple[dict[int, list[tuple[int, float]]], int]:
    """Per sid, the (t ns, value) rows of HISTORY, then of the SNAPSHOT and DATA after it, in
    the order they came; and how many HISTORY messages came after the attachment's SNAPSHOT
    or DATA (must be none)."""
    rows: dict[int, list[tuple[int, float]]] = {}
    late = 0
    live = False
    for m in msgs:
        if m[0] == 8 and m[1] == att:
            late += live
            cols = [c for c in m[4] if c is not None]
            assert len(cols[0]) <= HISTORY_MESSAGE_ROWS
            rows.setdefault(m[2], []).extend(zip(cols[0].tolist(), cols[1].tolist(), strict=True))
        elif m[0] == 2 and m[2] == att:
            live = True
            for e in m[3]:
                if e[1] & 1:
                    rows.setdefault(e[0], []).append((e[4] * NS + e[5], e[2]))
        elif m[0] == 3:
            for g_att, entries in m[2]:
                if g_att == att:
                    assert live, "DATA of the attachment before its SNAPSHOT"
                    for e in entries:
                        if e[1] & 1:
                            rows.setdefault(e[0], []).append((e[4] * NS + e[5], e[2]))
    return rows, late


def backfill_token(hub: Hub, ids: list[str], seconds: float = 3600) -> str:
    return hub.signer.issue(ids, backfill=seconds).token


IDS = [f"fake://c{k}" for k in range(40)]
POINTS = 1_000  # under RAW_POINTS: every update is a point


async def test_a_client_that_reads_nothing_holds_at_most_its_budget_of_backfill(
    hub: Hub, backend: FakeBackend
) -> None:
    attach(Client(hub), hub, IDS)  # the channels record from their first subscriber
    now = int(time.time())
    record(hub, backend, IDS, POINTS, now - POINTS)
    whole = len(IDS) * (POINTS - 1) * ROW_BYTES  # what the backfill holds in all
    budget = 64 * 1024
    assert whole > 10 * budget  # so that the bound means something
    idle = Client(hub, SessionLimits(send_budget=budget))
    read(idle, 1)  # HELLO
    idle.send(16, 1, backfill_token(hub, IDS))
    chunk = HISTORY_MESSAGE_ROWS * ROW_BYTES + 200  # one message's columns and header
    assert idle.session.queued_bytes <= budget + chunk
    # Ticks come and go: the attachment's live data is held, nothing else is queued.
    for i in range(5):
        for cid in IDS:
            backend.update(cid.removeprefix("fake://"), -1.0, t=now + i)
        hub.ticker.tick()
    assert idle.session.queued_bytes <= budget + chunk
    # Frames the writer took but has not finished sending stay counted: no more is made.
    taken = read_unsent(idle)
    assert sum(len(f) for f in taken) <= budget + chunk
    assert idle.session.next_frame() is None


def read_unsent(client: Client) -> list[bytes]:
    out = []
    while (frame := client.session.next_frame()) is not None:
        out.append(frame)
    return out


@pytest.mark.parametrize("batch", [1, 7, 1_000])
async def test_a_reading_client_gets_every_update_once_across_the_join(
    hub: Hub, backend: FakeBackend, batch: int
) -> None:
    """Updates keep coming while the client reads its backfill a few messages at a time: every
    one of them reaches it exactly once, in order, as a HISTORY row or live."""
    ids = IDS[:12]
    attach(Client(hub), hub, ids)
    now = int(time.time())
    record(hub, backend, ids, 300, now - 600)
    reader = Client(hub, SessionLimits(send_budget=16 * 1024))
    read(reader, 1)  # HELLO
    reader.send(16, 1, backfill_token(hub, ids))
    t = now - 300
    for _ in range(400):
        if not read(reader, batch) and reader.session.next_frame() is None:
            break
        record(hub, backend, ids, 1, t)  # one more update of each channel, and a tick
        t += 1
    record(hub, backend, ids, 1, t)
    t += 1
    while read(reader, 1_000):
        pass
    att = next(m[2] for m in reader.received if m[0] == 1)
    assert any(m[0] == 2 and m[2] == att for m in reader.received), "no snapshot"
    rows, late = channel_rows(reader.received, att)
    assert late == 0
    every = list(range(now - 600, now - 300)) + list(range(now - 300, t))
    for sid in range(len(ids)):
        assert [v for _, v in rows[sid]] == [float(x) for x in every], sid
        assert [ts for ts, _ in rows[sid]] == [x * NS for x in every]


async def test_a_reattach_that_says_what_it_holds_gets_only_newer_rows(
    hub: Hub, backend: FakeBackend
) -> None:
    ids = IDS[:3]
    attach(Client(hub), hub, ids)
    now = int(time.time())
    record(hub, backend, ids, 100, now - 200)
    first = Client(hub)
    read(first, 1)
    first.send(16, 1, backfill_token(hub, ids))
    read(first, 1_000)
    rows, _ = channel_rows(first.received, 1)
    held = [rows[sid][-1][0] for sid in range(len(ids))]  # the newest time of each channel
    assert held == [(now - 101) * NS] * 3
    record(hub, backend, ids, 20, now - 100)  # while it was away
    # Channel 1 holds less (say it read its past only up to here).
    held[1] = (now - 150) * NS
    again = Client(hub)
    read(again, 1)
    again.send(16, 2, backfill_token(hub, ids), held)
    read(again, 1_000)
    rows, late = channel_rows(again.received, 1)
    assert late == 0
    assert [v for _, v in rows[0]] == [float(x) for x in range(now - 100, now - 80)]
    assert [v for _, v in rows[1]] == [float(x) for x in range(now - 149, now - 80)]
    # Without `since`: everything again (an older client), as before.
    old = Client(hub)
    read(old, 1)
    old.send(16, 3, backfill_token(hub, ids))
    read(old, 1_000)
    rows, _ = channel_rows(old.received, 1)
    assert [v for _, v in rows[2]] == [float(x) for x in range(now - 200, now - 80)]


async def test_since_is_never_before_the_backfill_window(hub: Hub, backend: FakeBackend) -> None:
    attach(Client(hub), hub, ["fake://a"])
    now = int(time.time())
    record(hub, backend, ["fake://a"], 100, now - 100)
    c = Client(hub)
    read(c, 1)
    c.send(16, 1, backfill_token(hub, ["fake://a"], seconds=10), [0])
    read(c, 100)
    rows, _ = channel_rows(c.received, 1)
    assert rows[0][0][1] >= now - 10 and len(rows[0]) <= 11


async def test_since_of_the_wrong_length_refuses_that_attach(hub: Hub) -> None:
    c = Client(hub)
    read(c, 1)
    c.send(16, 4, backfill_token(hub, ["fake://a", "fake://b"]), [1])
    (error,) = read(c, 10)
    assert error[:3] == [5, 4, 4400] and "2 channels" in error[3]
    assert not c.session.attachments


async def test_detaching_during_a_backfill_ends_it(hub: Hub, backend: FakeBackend) -> None:
    attach(Client(hub), hub, IDS)
    now = int(time.time())
    record(hub, backend, IDS, POINTS, now - POINTS)
    c = Client(hub, SessionLimits(send_budget=16 * 1024))
    read(c, 1)
    c.send(16, 1, backfill_token(hub, IDS))
    c.send(17, 2, 1)
    msgs = read(c, 100_000)
    detached = next(i for i, m in enumerate(msgs) if m[0] == 4)
    # Nothing of att 1 after DETACHED, and no snapshot at all.
    assert not [m for m in msgs[detached + 1 :] if m[0] in (2, 8)]
    assert not [m for m in msgs if m[0] == 2]


async def test_a_channel_whose_past_cannot_be_read_is_skipped_once(
    hub: Hub, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    ids = IDS[:3]
    attach(Client(hub), hub, ids)
    now = int(time.time())
    record(hub, backend, ids, 2 * HISTORY_MESSAGE_ROWS, now - 2 * HISTORY_MESSAGE_ROWS)
    broken = hub.registry.channels["fake://c1"].recorder
    real = ChannelHistory.backfill

    def fails_for_c1(self: ChannelHistory, since: int, limit: int | None = None) -> Any:
        if self is broken:
            raise RuntimeError("unreadable")
        return real(self, since, limit)

    monkeypatch.setattr(ChannelHistory, "backfill", fails_for_c1)
    before = hub.ticker.stats.failures.get("history", 0)
    c = Client(hub, SessionLimits(send_budget=8 * 1024))
    read(c, 1)
    with caplog.at_level(logging.ERROR, "pvwire"):
        c.send(16, 1, backfill_token(hub, ids))
        while not any(m[0] == 2 for m in c.received):  # until its snapshot
            assert read(c, 3)
            record(hub, backend, ids, 1, now + len(c.received))
    rows, _ = channel_rows(c.received, 1)
    assert 1 not in {m[2] for m in c.received if m[0] == 8}
    assert len(rows[0]) > 2 * HISTORY_MESSAGE_ROWS - 1 and len(rows[2]) == len(rows[0])
    assert len([r for r in caplog.records if "backfill of fake://c1" in r.message]) == 1
    assert hub.ticker.stats.failures.get("history", 0) == before + 1
    assert np.all(np.diff([ts for ts, _ in rows[0]]) > 0)


async def test_a_reader_slower_than_its_channels_gets_a_gap_and_its_snapshot_within_budget(
    hub: Hub, backend: FakeBackend
) -> None:
    """Each pass sends what was recorded while the previous one was read; for a reader slower
    than its channels that never shrinks, so after BACKFILL_PASSES passes the backfill ends
    with a gap row where each channel's rows stop, then the snapshot: never more than the
    budget queued, every update before the gap once, none after it passed off as complete."""
    ids = IDS[:4]
    attach(Client(hub), hub, ids)
    now = int(time.time())
    record(hub, backend, ids, 100, now - 10_000)
    # A pass over the 4 channels, each with the 10 rows of one read, never fits in the room
    # half this budget leaves: the passes do not end by themselves.
    budget = 1024
    chunk = HISTORY_MESSAGE_ROWS * ROW_BYTES + 200
    reader = Client(hub, SessionLimits(send_budget=budget))
    read(reader, 1)  # HELLO
    reader.send(16, 1, backfill_token(hub, ids, seconds=20_000))
    t = now - 9_000
    for _ in range(10 * BACKFILL_PASSES * len(ids)):
        record(hub, backend, ids, 10, t)  # (one tick: live, they would be conflated)
        t += 10
        assert reader.session.queued_bytes <= budget + chunk
        read(reader, 1)
        if any(m[0] == 2 for m in reader.received):
            break
    else:
        pytest.fail("no snapshot: the passes never ended")
    upto = [m for m in reader.received if m[0] != 3]
    rows, late = channel_rows(upto, 1)
    assert late == 0
    every = list(range(now - 10_000, now - 9_900)) + list(range(now - 9_000, t))
    gaps = 0
    for sid in range(len(ids)):
        values = [v for _, v in rows[sid]]
        gap = next((i for i, v in enumerate(values) if np.isnan(v)), None)
        if gap is None:  # this channel's rows were all sent in the last pass: none left out
            assert values == [float(x) for x in every[: len(values)]], sid
            continue
        gaps += 1
        assert values[:gap] == [float(x) for x in every[:gap]], sid
        assert gap > 100 + 10, sid  # past the first pass: rows of later ones too
        # The gap row stands where the rows stop; after it only the snapshot's current value,
        # a later update than any row (those between were left out, and the gap says so).
        assert rows[sid][gap][0] == every[gap - 1] * NS + 1, sid
        (current,) = values[gap + 1 :]
        assert current in every and current > every[gap], sid
    assert gaps > 0  # the reader was slower than its channels: some rows were left out


async def test_the_gap_rows_that_end_a_slow_backfill_are_made_under_the_budget_too(
    hub: Hub, backend: FakeBackend
) -> None:
    """The last step of a slow reader's backfill, a gap row for each channel with rows left
    out, is made a few at a time under the budget like the rest: 200 channels' gap rows
    (~30 KB) made in one call would queue past this budget and one message."""
    ids = [f"fake://g{k}" for k in range(200)]
    attach(Client(hub), hub, ids)
    now = int(time.time())
    record(hub, backend, ids, 3, now - 10_000)
    budget = 1024
    chunk = HISTORY_MESSAGE_ROWS * ROW_BYTES + 200
    gap_rows = len(ids) * 153  # one gap row's message each
    assert gap_rows > budget + chunk  # so that the bound means something
    reader = Client(hub, SessionLimits(send_budget=budget))
    read(reader, 1)  # HELLO
    reader.send(16, 1, backfill_token(hub, ids, seconds=20_000))
    t = now - 9_000
    most = 0
    for _ in range(4 * BACKFILL_PASSES * len(ids)):
        record(hub, backend, ids, 1, t)  # every channel records while each message is read
        t += 1
        most = max(most, reader.session.queued_bytes)
        read(reader, 1)
        if any(m[0] == 2 for m in reader.received):
            break
    else:
        pytest.fail("no snapshot: the backfill never ended")
    assert most <= budget + chunk
    history = [m for m in reader.received if m[0] == 8]
    left_out = [m for m in history if columns_of(m)[6].tolist() == [1]]
    assert left_out and all(columns_of(m)[5].tolist() == [1] for m in left_out)  # status 1
    assert len({m[2] for m in left_out}) == len(left_out)  # one per channel at most
    for m in left_out:  # each the last row of its channel before the snapshot
        assert m is [h for h in history if h[2] == m[2]][-1]


def columns_of(msg: list[Any]) -> list[Any]:
    return [c for c in msg[4] if c is not None]


class Reader:
    """The Python client's session core reading a hub's session, as the client's pump does."""

    def __init__(self, hub: Hub, ids: list[str], budget: int) -> None:
        self.hub, self.ids = hub, ids
        self.core = ClientSession()
        # ALL mode: live, every update comes too (LATEST would conflate a tick's updates).
        token = hub.signer.issue(ids, "ALL", backfill=20_000).token
        self.core.add("a", token, tuple(ids), backfill=True)
        self.times: dict[int, list[int]] = {sid: [] for sid in range(len(ids))}
        self.left_out = 0
        self.connect(budget)

    def connect(self, budget: int) -> None:
        self.server = Client(self.hub, SessionLimits(send_budget=budget))
        self.server.session.next_frame()  # the double's HELLO: the core gets a real one
        self.core.connection_made(0.0)
        self.core.receive(wire.encode_hello("test", 20, 15_000, 1 << 20), 0.0)
        self.flush()

    def flush(self) -> None:
        for data in self.core.data_to_send():
            self.server.session.receive(data)

    def read(self, frames: int) -> bool:
        """Up to `frames` messages; whether the attachment's snapshot came."""
        snapshot = False
        for _ in range(frames):
            frame = self.server.session.next_frame()
            if frame is None:
                break
            self.server.session.sent(len(frame))
            self.core.receive(frame, 0.0)
            while (event := self.core.next_event()) is not None:
                if isinstance(event, ClientBackfill):
                    h = event.history
                    self.left_out += int(np.sum(h.gap & (h.status == wire.GapKind.LEFT_OUT)))
                    self.times[h.sid] += h.t[h.gap == 0].tolist()
                elif isinstance(event, ClientEntries):
                    snapshot = snapshot or event.snapshot
                    for e in event.raw:
                        if e[1] & 1:  # VALUE, and its TIME (an update's entry)
                            self.times[e[0]].append(e[4] * NS + e[5])
            self.flush()
        return snapshot


async def test_a_reattach_recovers_the_rows_a_slow_backfill_left_out(
    hub: Hub, backend: FakeBackend
) -> None:
    """A slow reader's backfill ends with a gap row (left out) and the snapshot; it goes on
    live, loses its connection and re-attaches with the `since` its client computes: the rows
    left out come then, and over both connections the client got every update once."""
    ids = IDS[:4]
    attach(Client(hub), hub, ids)
    now = int(time.time())
    record(hub, backend, ids, 100, now - 10_000)
    reader = Reader(hub, ids, budget=1024)
    t = now - 9_000
    while reader.server.session._backfills:  # until its last rows and snapshot are queued
        reader.read(1)
        record(hub, backend, ids, 10, t)  # held: the attachment's live data waits
        t += 10
        assert t < now - 9_000 + 10 * 10 * BACKFILL_PASSES * len(ids), "no snapshot"
    # Then it reads on (updates while it is behind would be merged, as in any stream).
    assert reader.read(10_000)
    assert reader.left_out > 0  # the reader was slower than its channels: rows were left out
    for _ in range(3):  # live
        record(hub, backend, ids, 2, t)
        t += 2
        reader.read(100)
    reader.core.connection_lost(1006, "")
    record(hub, backend, ids, 5, t)  # while it was away
    t += 5
    reader.connect(budget=1 << 20)
    assert reader.read(10_000)
    every = [x * NS for x in [*range(now - 10_000, now - 9_900), *range(now - 9_000, t)]]
    for sid in range(len(ids)):
        assert sorted(reader.times[sid]) == every, sid
