"""Distinct upstream channels per client address (`max_channels_per_address`), over every
connection and endpoint of that address, in a real hub in memory (tests/hub_doubles.py). The
same bound over a real server, with pvws and GraphQL: tests/test_attacks.py (h)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pvwire.access.identity import Identity
from pvwire.config import Settings
from pvwire.core.hub import Hub
from pvwire.core.mjpeg import MjpegFeed, MjpegOptions
from pvwire.errors import TooManyChannels
from pvwire.limits import integer
from pvwire.model import Reading
from pvwire.wire.session import AttachRefused
from pvwire.wire.tokens import TokenSigner

from .hub_doubles import KEYS, Client, FakeBackend

LIMIT = 3  # the table's 20,000, made small enough to reach here


@pytest.fixture
async def small(backend: FakeBackend) -> AsyncIterator[Hub]:
    settings = Settings(default_scheme="fake", linger_s=0.0, max_channels_per_address=LIMIT)
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    hub.start()
    yield hub
    await hub.stop()


def client_from(hub: Hub, address: str) -> Client:
    c = Client(hub)
    c.session.address = address
    c.drain()  # HELLO
    return c


def attach(hub: Hub, c: Client, req: int, ids: list[str]) -> list[Any]:
    c.send(16, req, hub.signer.issue(ids).token)
    return c.drain()


def test_the_default_is_the_table_s() -> None:
    assert Settings().max_channels_per_address == integer("max_channels_per_address")


async def test_an_address_holds_so_many_channels_over_all_its_connections(
    small: Hub, backend: FakeBackend
) -> None:
    one, two = client_from(small, "10.0.0.1"), client_from(small, "10.0.0.1")
    assert attach(small, one, 1, ["fake://a", "fake://b"])[0][0] == 1  # ATTACHED
    # A channel it holds already costs nothing more; a third distinct one fits.
    assert attach(small, two, 1, ["fake://b", "fake://c"])[0][0] == 1
    assert small.address_channels.held_by("10.0.0.1") == LIMIT
    (refused,) = attach(small, two, 2, ["fake://d"])
    assert refused[:3] == [5, 2, 4413], refused  # ERROR for that ATTACH, the connection goes on
    assert "max_channels_per_address" in refused[3] and "10.0.0.1" in refused[3]
    assert two.session.close_request is None
    # Nothing of the refused attachment is held: no monitor opened for it.
    assert "d" not in backend.opened
    # Another address has a budget of its own.
    other = client_from(small, "10.0.0.2")
    assert attach(small, other, 1, ["fake://d"])[0][0] == 1
    # Released, its channels are free again; b stays held by the other connection.
    one.send(17, 3, 1)  # DETACH att 1
    one.drain()
    assert small.address_channels.held_by("10.0.0.1") == 2
    assert attach(small, two, 3, ["fake://e"])[0][0] == 1
    for c in (one, two, other):
        small.remove_session(c.session)
    assert small.address_channels.held_by("10.0.0.1") == 0
    assert small.address_channels.held_by("10.0.0.2") == 0


class SlowGets(FakeBackend):
    """Gets that wait until the test lets them answer."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()

    async def get(self, name: str, timeout: float) -> Reading:
        await self.answer.wait()
        return await super().get(name, timeout)


async def test_a_get_of_a_channel_not_monitored_holds_one_while_it_runs() -> None:
    backend = SlowGets()
    settings = Settings(default_scheme="fake", linger_s=0.0, max_channels_per_address=1)
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    hub.start()
    try:
        who = Identity("", address="10.0.0.1")
        first = asyncio.ensure_future(hub.get("fake://x", 3.0, who))
        await asyncio.sleep(0)  # the first get is under way
        assert hub.address_channels.held_by("10.0.0.1") == 1
        with pytest.raises(TooManyChannels, match="max_channels_per_address"):
            await hub.get("fake://y", 3.0, who)
        # Another address, and the same channel again, are not refused.
        second = asyncio.ensure_future(hub.get("fake://y", 3.0, Identity("", address="10.0.0.2")))
        third = asyncio.ensure_future(hub.get("fake://x", 3.0, who))
        backend.answer.set()
        await asyncio.gather(first, second, third)
        assert hub.address_channels.held_by("10.0.0.1") == 0
        assert (await hub.get("fake://y", 3.0, who))[0] == "fake://y"
    finally:
        await hub.stop()


async def test_an_mjpeg_feed_holds_its_channel_for_the_address_that_opened_it(
    small: Hub,
) -> None:
    c = client_from(small, "10.0.0.1")
    assert attach(small, c, 1, ["fake://a", "fake://b", "fake://c"])[0][0] == 1
    with ThreadPoolExecutor(1) as executor:
        options = MjpegOptions(1 << 20, 75, 10.0)
        feed = MjpegFeed(small.client_number(), "fake://img", options, small, executor)
        with pytest.raises(AttachRefused) as refused:
            feed.open(Identity("", address="10.0.0.1"))
        assert refused.value.code == 4413
        other = MjpegFeed(small.client_number(), "fake://img", options, small, executor)
        other.open(Identity("", address="10.0.0.2"))
        assert small.address_channels.held_by("10.0.0.2") == 1
        other.close()
        assert small.address_channels.held_by("10.0.0.2") == 0
