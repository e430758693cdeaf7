"""A backfill's pass over idle channels costs O(1) each, not a read of their history: what a
client costs in work grows with what it reads, not with how many channels it asks for.

In memory, a real hub and history store; ChannelHistory.backfill is counted, not replaced."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pvwire.core.backfill import Backfill
from pvwire.core.history import ChannelHistory
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
