"""A backfill reaching into the archive (core/archive/past.py), in memory: a real hub and session
driven as the socket pump drives them, the archive a real HTTP server (tests/archiver.py).

The archive part is read off the session's calls and resumes the backfill when it answers: a
failure there is that channel's, never the attachment's, which still gets its snapshot."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pvwire.config import Settings
from pvwire.core.archive import past as past_module
from pvwire.core.hub import Hub
from pvwire.wire.tokens import TokenSigner

from tests import hub_doubles
from tests.archiver import NS, Every, PbArchiver
from tests.eventually import eventually_async
from tests.hub_doubles import Client, FakeBackend, attach


@pytest.fixture
def archiver() -> Iterator[PbArchiver]:
    now = time.time_ns() // NS * NS
    with PbArchiver(every=Every(now - 3_600 * NS, 10 * NS)) as a:
        yield a


@pytest.fixture
async def archive_hub(backend: FakeBackend, archiver: PbArchiver) -> AsyncIterator[Hub]:
    settings = Settings(default_scheme="fake", linger_s=0.0, tick_ms=20, archivers=[archiver.url])
    h = Hub({"fake": backend}, settings, TokenSigner(hub_doubles.KEYS, "k1"))
    h.start()
    yield h
    await h.stop()


async def test_a_failed_archive_part_costs_its_channel_s_past_not_the_attachment(
    archive_hub: Hub,
    backend: FakeBackend,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The join failing on what an archiver sent (as a ValueError did on a malformed field)
    is logged and counted, the channel's past skipped; the attachment's snapshot follows. It
    escaped the read's done callback: the frames of that call were lost and the attachment's
    data held until something else was sent (a keep-alive, 15 s later)."""
    hub = archive_hub
    attach(Client(hub), hub, ["fake://a"])  # the channel records from its first subscriber
    backend.update("a", 1.0, t=int(time.time()))
    hub.ticker.tick()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("what the archiver sent")

    monkeypatch.setattr(past_module, "past", broken)
    client = Client(hub)
    client.drain()  # HELLO
    client.send(16, 1, hub.signer.issue(["fake://a"], backfill=600).token)

    def snapshot() -> list[Any]:
        return [m for m in client.drain() if m[0] == 2]

    with caplog.at_level(logging.ERROR, "pvwire"):
        await eventually_async(snapshot, "the attachment's snapshot")
    assert "backfill of fake://a failed" in caplog.text
    assert hub.snapshot().failures.get("history", 0) >= 1
