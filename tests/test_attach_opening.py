"""A `/stream` ATTACH opens its token's channels for a time per event-loop pass, taking turns with
every other connection's (core/opener.py): a token of 10,000 names opened in one step held the
loop for every client. In memory, with the real hub and sessions (tests/hub_doubles.py), the
opener's passes driven by hand on a clock that moves a unit per reading."""

from __future__ import annotations

import itertools

from pvwire.core.hub import Hub
from pvwire.core.opener import Opener
from pvwire.wire.codes import BAD_TOKEN, SLOW
from pvwire.wire.session import SessionLimits

from .eventually import eventually_async
from .hub_doubles import Client, FakeBackend


def _opener() -> Opener:
    ticks = itertools.count()
    # Three turns of 10 channels fit in a pass: each reading of the clock is a unit later.
    return Opener(budget_s=2.5, turn=10, clock=lambda: float(next(ticks)))


def _ids(prefix: str, n: int) -> list[str]:
    return [f"fake://{prefix}{i}" for i in range(n)]


async def test_an_attach_opens_in_turns_and_its_answers_keep_the_requests_order(
    hub: Hub, backend: FakeBackend
) -> None:
    opener = _opener()
    big, small = Client(hub, opener=opener), Client(hub, opener=opener)
    big.drain(), small.drain()  # HELLO
    big.send(16, 1, hub.signer.issue(_ids("b", 100)).token)
    big.send(18, 7)  # PING, after the ATTACH: answered after it
    small.send(16, 1, hub.signer.issue(_ids("s", 5)).token)
    assert big.drain() == [] and small.drain() == [] and backend.opened == []
    # The address's budget is held from the ATTACH on, before a channel opens.
    assert hub.address_channels.held_by("test") == 105
    opener.one_pass()  # 10 of the big one, the small one's 5, 10 more
    assert len(backend.opened) == 25
    assert [m[0] for m in small.drain()] == [1, 2]  # ATTACHED, SNAPSHOT
    assert big.drain() == []
    passes = 1
    while big.session.opening:
        opener.one_pass()
        passes += 1
    assert passes == 4 and len(backend.opened) == 105  # 30 a pass alone
    msgs = big.drain()
    assert [m[0] for m in msgs] == [1, 2, 7]  # ATTACHED, SNAPSHOT, then the PING's PONG
    assert msgs[0][3] == _ids("b", 100) and msgs[2][1] == 7


async def test_a_connection_gone_while_its_attach_opens_holds_nothing(
    hub: Hub, backend: FakeBackend
) -> None:
    opener = _opener()
    c = Client(hub, opener=opener)
    c.send(16, 1, hub.signer.issue(_ids("c", 100)).token)
    opener.one_pass()
    assert len(backend.opened) == 30
    hub.remove_session(c.session)
    opener.one_pass()  # its turn comes and finds nothing to open
    assert len(backend.opened) == 30
    assert hub.address_channels.held_by("test") == 0 and not hub.registry.views
    await eventually_async(lambda: not hub.registry.channels, "every channel released")
    assert all(m.closed for m in backend.monitors)


async def test_a_channel_that_cannot_open_refuses_its_attach_in_order(
    hub: Hub, backend: FakeBackend
) -> None:
    opener = _opener()
    c = Client(hub, opener=opener)
    c.drain()
    # A scheme this server lacks, after 40 channels it can open.
    c.send(16, 1, hub.signer.issue([*_ids("d", 40), "nope://x"]).token)
    c.send(18, 3)
    while c.session.opening:
        opener.one_pass()
    (kind, req, code, message), pong = c.drain()
    assert (kind, req, code) == (5, 1, BAD_TOKEN) and "nope" in message, message
    assert pong == [7, 3]
    assert not c.session.attachments and hub.address_channels.held_by("test") == 0
    await eventually_async(lambda: not hub.registry.channels, "every channel released")


async def test_requests_past_the_bound_waiting_behind_an_attach_close_the_connection(
    hub: Hub,
) -> None:
    c = Client(hub, SessionLimits(requests_waiting=2), opener=_opener())
    c.send(16, 1, hub.signer.issue(_ids("e", 50)).token)
    c.send(18, 1)
    c.send(18, 2)
    assert c.session.close_request is None
    c.send(18, 3)
    assert c.session.close_request is not None
    code, reason = c.session.close_request
    assert code == SLOW and "stream_requests_waiting" in reason


async def test_bytes_past_one_largest_message_waiting_behind_an_attach_close_the_connection(
    hub: Hub,
) -> None:
    # Each request may be as large as max_in_bytes: together they hold no more than one.
    c = Client(hub, SessionLimits(waiting_bytes=4096), opener=_opener())
    c.send(16, 1, hub.signer.issue(_ids("f", 50)).token)
    c.send(16, 2, "x" * 3000)  # a (bad) token: it waits all the same
    assert c.session.close_request is None
    c.send(16, 3, "x" * 3000)
    assert c.session.close_request is not None
    code, reason = c.session.close_request
    assert code == SLOW and "max_in_bytes" in reason
