"""A backfill's pass over idle channels costs O(1) each, not a read of their history: what a
client costs in work grows with what it reads, not with how many channels it asks for.

In memory, a real hub and history store; ChannelHistory.backfill is counted, not replaced."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from pvwire.core.backfill import Backfill
from pvwire.core.history import CHANNEL_BYTES, NS, RAW_POINTS, ChannelHistory, HistoryStore
from pvwire.core.hub import Hub
from pvwire.wire.session import SessionLimits

from tests.hub_doubles import Client, FakeBackend, attach
from tests.test_backfill_budget import backfill_token, channel_rows, read, record

CHANNELS = 1_000


async def test_a_pass_over_idle_channels_reads_none_of_them(
    hub: Hub, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rows and a current value per channel, read under a small budget: the first pass
    spans many sends, so a second pass comes; nothing was recorded since, and it reads nothing
    (before, it read every channel again). Every row still arrives once, then the snapshot."""
    ids = [f"fake://idle{k}" for k in range(CHANNELS)]
    attach(Client(hub), hub, ids)
    now = int(time.time())
    record(hub, backend, ids, 3, now - 10)
    reads = 0
    real = ChannelHistory.backfill

    def counted(self: ChannelHistory, since: int, limit: int | None = None) -> Any:
        nonlocal reads
        reads += 1
        return real(self, since, limit)

    monkeypatch.setattr(ChannelHistory, "backfill", counted)
    passes = 0
    fill = Backfill.fill

    def watched(self: Backfill, room: int) -> tuple[list[bytes], bool]:
        nonlocal passes
        out = fill(self, room)
        passes = max(passes, self.passes)
        return out

    monkeypatch.setattr(Backfill, "fill", watched)
    reader = Client(hub, SessionLimits(send_budget=16 * 1024))
    read(reader, 1)  # HELLO
    reader.send(16, 1, backfill_token(hub, ids))
    while read(reader, 50):
        pass
    att = next(m[2] for m in reader.received if m[0] == 1)
    assert any(m[0] == 2 and m[2] == att for m in reader.received), "no snapshot"
    rows, late = channel_rows(reader.received, att)
    assert late == 0
    assert passes == 2  # the first pass spanned many sends: a second one followed
    assert sum(1 for m in reader.received if m[0] == 8 and m[1] == att) == CHANNELS
    for sid in range(CHANNELS):
        assert [v for _, v in rows[sid]] == [float(now - 10 + k) for k in range(3)], sid
    assert reads == CHANNELS  # the first pass's reads only: the idle second pass read none


def _agrees(h: ChannelHistory, times: list[int]) -> None:
    for since in [0, *times, *(t + 1 for t in times)]:
        assert h.backfills_from(since) == bool(h.backfill(since, 10)), since


def test_backfills_from_says_what_a_read_would_give() -> None:
    """Scalar, through a store's journal (points still pending), with a gap last, a wrapped
    ring, and an array channel's frames: whether a read gives a row, as the read says."""
    store = HistoryStore(64 * CHANNEL_BYTES, array_max=4)
    h = store.attach("fake://s")
    assert h is not None
    assert not h.backfills_from(0)  # nothing recorded
    times = []
    for k in range(RAW_POINTS + 20):  # wraps the ring: the tiers answer for the oldest
        t = 1_700_000_000 + k
        h.record(float(k), t, 0, 0, 0)  # into the journal, not flushed yet
        times.append(t * NS)
        if k < 3 or k == RAW_POINTS + 19:
            _agrees(h, times)
    h.mark_gap()  # a gap is kept: it is not the current value
    _agrees(h, [*times, int(h.points()["t"][-1])])
    frames = store.attach("fake://a")
    assert frames is not None
    for k in range(3):
        frames.record(np.full(4, float(k)), 1_700_000_000 + k, 0, 0, 0)
        _agrees(frames, [(1_700_000_000 + j) * NS for j in range(k + 1)])
