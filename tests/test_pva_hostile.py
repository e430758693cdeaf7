"""pvwire's own PVA client (upstream/pva_identity.py) against a hostile PVA server on loopback
(tests/hostile_pva.py): every way the server breaks the protocol closes that one connection with
a clear error, counted by reason; what nobody asked for is dropped and counted; its words reach
the log cut and at a bounded rate; and its search answers count only for a pending search, from
an address searched. No IOC: the server is in this process."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from pvwire import limits
from pvwire.errors import ChannelNotFound, PutRejected
from pvwire.upstream.pva_identity import (
    IdentityConnections,
    PeerRefusals,
    PvaSearch,
    search_destinations,
)
from pvwire.upstream.pvaproto import ServerMessage

from tests.eventually import eventually_async
from tests.hostile_pva import (
    HostilePva,
    Name,
    chain_type,
    doubling_type,
    message_flood,
    unsolicited_types,
)

MESSAGES = 200
MESSAGE_BYTES = 100_000
UNSOLICITED = 300

NAMES = {
    "H:PLAIN": Name(),
    "H:DOUBLE": Name(put_type=doubling_type(42)),
    "H:CHAIN": Name(put_type=chain_type(2000)),
    "H:FLOOD": Name(before_init=lambda ioid: unsolicited_types(UNSOLICITED, 50)),
    "H:SAYS": Name(before_init=lambda ioid: message_flood(MESSAGES, MESSAGE_BYTES, ioid)),
}


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostilePva]:
    with HostilePva(NAMES) as server:
        yield server


@pytest.fixture
async def connections() -> AsyncIterator[IdentityConnections]:
    c = IdentityConnections("pvwire-host")
    yield c
    c.close()


async def put(c: IdentityConnections, hostile: HostilePva, name: str) -> None:
    await c.put("olga", ("127.0.0.1", hostile.tcp_port), name, "value", 1.0, True, 30.0)


@pytest.mark.parametrize(
    ("name", "reason", "words"),
    [
        ("H:DOUBLE", "type_nodes", f"more than {limits.integer('pva_identity_type_nodes')} nodes"),
        ("H:CHAIN", "type_depth", "deeper than"),
    ],
)
async def test_a_type_past_a_bound_closes_that_connection_only(
    hostile: HostilePva, connections: IdentityConnections, name: str, reason: str, words: str
) -> None:
    await put(connections, hostile, "H:PLAIN")
    with pytest.raises(PutRejected, match=words):
        await put(connections, hostile, name)
    assert connections.refusals.counts[reason] == 1
    await eventually_async(lambda: len(connections) == 0)  # closed, by this side
    await put(connections, hostile, "H:PLAIN")  # a new connection, as the next put needs
    assert len(connections) == 1


async def test_replies_nobody_asked_for_are_dropped_and_counted(
    hostile: HostilePva, connections: IdentityConnections
) -> None:
    """Each stores a type under a key of its own if read: none is, and the put goes on."""
    await put(connections, hostile, "H:FLOOD")
    assert connections.refusals.counts["unsolicited"] == UNSOLICITED


async def test_a_servers_messages_reach_the_log_cut_and_bounded(
    hostile: HostilePva, connections: IdentityConnections, caplog: pytest.LogCaptureFixture
) -> None:
    burst = limits.integer("pva_identity_message_lines")
    interval = limits.number("pva_identity_message_interval_s")
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="pvwire.upstream.pva_identity"):
        await put(connections, hostile, "H:SAYS")
    seconds = time.monotonic() - t0
    said = [r.getMessage() for r in caplog.records if "the IOC says" in r.getMessage()]
    # The burst, and one more per interval the put took (none unless the machine is slow).
    assert burst <= len(said) <= burst + seconds / interval, (len(said), seconds)
    assert max(len(line) for line in said) < limits.integer("pva_identity_text_bytes") + 200
    assert f"({MESSAGE_BYTES} bytes, cut)" in said[0]
    assert connections.refusals.counts["message_log"] == MESSAGES - len(said)


# --- search ------------------------------------------------------------------------------------


def only(server: HostilePva) -> dict[str, str]:
    """EPICS_PVA_* that search `server` alone, unicast."""
    return {"EPICS_PVA_ADDR_LIST": server.address_list, "EPICS_PVA_AUTO_ADDR_LIST": "NO"}


async def test_search_ids_are_not_predictable(hostile: HostilePva) -> None:
    search = PvaSearch(only(hostile))
    first = len(hostile.searches)
    try:
        for _ in range(5):
            with pytest.raises(ChannelNotFound):
                await search.find("H:NOBODY", 0.1)
    finally:
        search.close()
    # The server reads them on its own thread, in its own time (a busy machine: later).
    await eventually_async(lambda: len({s.cids[0] for s in hostile.searches[first:]}) >= 5)
    seen = hostile.searches[first:]
    cids = sorted({s.cids[0] for s in seen})
    seqs = {s.seq for s in seen}
    assert len(cids) == 5 and len(seqs) == 5  # one of each per search, resends alike
    assert 1 not in cids and all(b - a > 1 for a, b in itertools.pairwise(cids))
    assert all(s.seq != s.cids[0] for s in seen)


async def test_an_answer_counts_only_for_its_search_from_where_it_was_sent(
    hostile: HostilePva,
) -> None:
    """Forged answers naming the hostile server's TCP port, from an address nobody searched:
    one with the search's own seq and cid (as one who sees the search would send it), and
    guesses of the cids to come. The real answer, from the address searched, is taken."""
    search = PvaSearch(only(hostile))
    try:
        assert await search.find("H:PLAIN", 30.0) == ("127.0.0.1", hostile.tcp_port)
        seen = hostile.searches[-1]
        target = ("127.0.0.1", seen.reply_port)
        # The cids a counter would give next, with the seqs it used (seq = cid).
        hostile.forge(target, [seen.seq, *range(1, 50)], [*seen.cids, *range(1, 50)])
        await eventually_async(lambda: search.refused >= 50, lambda: f"{search.refused}")
        # An answer for a search still pending, copied, but from elsewhere: refused.
        searching = asyncio.ensure_future(search.find("H:ELSEWHERE", 30.0))
        await eventually_async(lambda: any("H:ELSEWHERE" in s.names for s in hostile.searches))
        copied = next(s for s in hostile.searches if "H:ELSEWHERE" in s.names)
        before = search.refused
        hostile.forge(target, [copied.seq], copied.cids)
        await eventually_async(lambda: search.refused > before)
        assert not searching.done()
        searching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await searching
    finally:
        search.close()


def test_past_the_burst_one_message_is_logged_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    burst = limits.integer("pva_identity_message_lines")
    interval = limits.number("pva_identity_message_interval_s")
    now = [0.0]
    gate = PeerRefusals(clock=lambda: now[0])
    said = ServerMessage(1, 1, "careful", 7)
    with caplog.at_level(logging.INFO, logger="pvwire.upstream.pva_identity"):
        for _ in range(burst + 5):
            gate.message("conn", said)
        now[0] += interval * 0.9
        gate.message("conn", said)  # not yet
        now[0] += interval * 0.2
        gate.message("conn", said)  # one more, saying how many were left out
        gate.message("conn", said)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == burst + 1 and "6 left out so far" in lines[-1]
    assert gate.counts["message_log"] == 7


def test_a_multicast_or_broadcast_destination_is_answered_by_anyone() -> None:
    env = {
        "EPICS_PVA_ADDR_LIST": "127.0.0.1:5075 224.0.2.3 10.1.2.255 255.255.255.255",
        "EPICS_PVA_AUTO_ADDR_LIST": "NO",
        "EPICS_PVA_BROADCAST_PORT": "5076",
    }
    assert search_destinations(env) == [
        (("127.0.0.1", 5075), True),
        (("224.0.2.3", 5076), False),
        (("10.1.2.255", 5076), False),
        (("255.255.255.255", 5076), False),
    ]
