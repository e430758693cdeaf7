"""core/archive/fetch.py, reading archivers, against tests/archiver.py (a real HTTP server on
127.0.0.1 whose PB the PyPI client's protobuf classes write): what it holds is read back, raw
and binned; repeated reads are cached and concurrent ones shared; an archiver that is down,
slow, answers garbage, an error or too much costs at most the deadline and says why, and a
failing one is left alone for archive_retry_s; each bound (limits.py `archive_*`) is exceeded
and holds, and a read of another identity, or of another archiver, goes on meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
from pvwire.core.archive.fetch import ArchiveClient, ArchiveMissing, Reach
from pvwire.core.archive.routes import Archiver, Routes, pv_name
from pvwire.limits import integer, number
from pvwire_dev.ioc import free_port

from tests.archiver import NS, PbArchiver
from tests.eventually import eventually_async

T0 = 1_780_000_000 * NS  # 2026-05-28


@pytest.fixture
def archiver() -> Iterator[PbArchiver]:
    with PbArchiver() as a:
        a.hold("PV:A", [(T0 + k * NS // 10, float(k)) for k in range(600)])
        yield a


@pytest.fixture
async def client() -> AsyncIterator[ArchiveClient]:
    c = ArchiveClient(1 << 20)
    try:
        yield c
    finally:
        await c.close()


def at(a: PbArchiver) -> Archiver:
    return Archiver(a.url, "*")


async def test_raw_samples_come_back_as_held_with_the_one_before_the_range(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    got = await client.read(at(archiver), "ca://PV:A", "", T0 + 10 * NS, T0 + 20 * NS,
                            Reach("u", 5))  # fmt: skip
    assert got.t.tolist() == [T0 + k * NS // 10 for k in range(99, 201)]
    assert got.value.tolist() == [float(k) for k in range(99, 201)]
    assert archiver.asked[-1]["pv"] == "PV:A"  # the PV name of a CA channel, as archived


async def test_optimized_bins_and_the_samples_when_few(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    reach = Reach("u", 5)
    bins = await client.read(at(archiver), "ca://PV:A", "optimizedSample_6", T0, T0 + 60 * NS,
                             reach)  # fmt: skip
    assert bins.ptype.name == "WAVEFORM_DOUBLE" and bins.elements == 5
    assert len(bins) == 6 and bins.value[:, 4].tolist() == [100.0] * 6  # 10 s bins of 10 Hz
    few = await client.read(at(archiver), "ca://PV:A", "optimizedSample_1000", T0, T0 + 60 * NS,
                            reach)  # fmt: skip
    assert few.ptype.name == "SCALAR_DOUBLE" and len(few) == 600


async def test_a_pv_the_archiver_lacks_is_no_samples(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    got = await client.read(at(archiver), "ca://NONE", "", T0, T0 + NS, Reach("u", 5))
    assert len(got) == 0 and client.outcomes["unknown"] == 1


async def test_a_repeated_read_is_cached_and_concurrent_ones_are_shared(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    args = (at(archiver), "ca://PV:A", "", T0, T0 + 30 * NS)
    many = await asyncio.gather(*(client.read(*args, Reach(f"u{i}", 5)) for i in range(20)))
    again = await client.read(*args, Reach("v", 5))
    assert archiver.requests["PV:A"] == 1
    assert all(np.array_equal(g.t, again.t) for g in many)
    assert client.outcomes["shared"] == 19 and client.outcomes["cached"] == 1


async def test_the_cache_is_bounded_in_bytes(archiver: PbArchiver) -> None:
    small = ArchiveClient(5_000)  # room for one answer of ~100 samples (3.2 KB), not two
    try:
        for lo in (0, 20, 0):
            await small.read(at(archiver), "ca://PV:A", "", T0 + lo * NS, T0 + (lo + 10) * NS,
                             Reach("u", 5))  # fmt: skip
        assert archiver.requests["PV:A"] == 3 and small.cache.used <= 5_000
    finally:
        await small.close()


async def test_a_slow_archiver_costs_the_deadline_then_is_left_alone(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    t = time.monotonic()
    with pytest.raises(ArchiveMissing, match=r"did not answer within 0\.5 s"):
        await client.read(at(archiver), "ca://SLOW:X", "", T0, T0 + NS, Reach("u", 0.5))
    took = time.monotonic() - t
    assert took < 5  # a bound: the trickle alone would last 500 s
    with pytest.raises(ArchiveMissing, match="archive_retry_s"):
        await client.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("u", 5))
    assert archiver.requests["PV:A"] == 0  # left alone, not asked
    assert client.outcomes["skipped"] == 1


async def test_retry_after_archive_retry_s(archiver: PbArchiver) -> None:
    now = [0.0]
    c = ArchiveClient(1 << 20, clock=lambda: now[0])
    try:
        with pytest.raises(ArchiveMissing, match="HTTP 500"):
            await c.read(at(archiver), "ca://ERROR:X", "", T0, T0 + NS, Reach("u", 5))
        now[0] += number("archive_retry_s") - 0.1
        with pytest.raises(ArchiveMissing, match="archive_retry_s"):
            await c.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("u", 5))
        now[0] += 0.2
        got = await c.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("u", 5))
        assert len(got) == 11
    finally:
        await c.close()


async def test_a_range_ending_now_is_cached_for_a_short_while_only(archiver: PbArchiver) -> None:
    """Its last samples may not have reached the archive yet: asked again after
    archive_recent_cache_s; an older range stays cached."""
    now = [0.0]
    c = ArchiveClient(1 << 20, clock=lambda: now[0])
    recent = time.time_ns() // NS * NS
    try:
        for _ in range(2):
            await c.read(at(archiver), "ca://PV:A", "", recent - 10 * NS, recent, Reach("u", 5))
            await c.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("u", 5))
        assert archiver.requests["PV:A"] == 2  # both from the cache the second time
        now[0] += number("archive_recent_cache_s") + 0.1
        await c.read(at(archiver), "ca://PV:A", "", recent - 10 * NS, recent, Reach("u", 5))
        await c.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("u", 5))
        assert archiver.requests["PV:A"] == 3  # the recent range read again, the old one not
    finally:
        await c.close()


async def test_garbage_is_that_read_s_failure_only(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    with pytest.raises(ArchiveMissing, match="malformed"):
        await client.read(at(archiver), "ca://GARBAGE:X", "", T0, T0 + NS, Reach("u", 5))
    got = await client.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("u", 5))
    assert len(got) == 11  # not left alone: the archiver answers, it is this PV's answer


async def test_more_samples_than_asked_is_refused(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    with pytest.raises(ArchiveMissing, match="more than 1,003 samples"):
        await client.read(at(archiver), "ca://BIG:X", "optimizedSample_1000", T0, T0 + NS,
                          Reach("u", 5), 1003)  # fmt: skip
    most = integer("archive_samples")
    with pytest.raises(ArchiveMissing, match=f"more than {most:,} samples"):
        await client.read(at(archiver), "ca://BIG:X", "", T0, T0 + NS, Reach("u", 5), 10**9)


async def test_the_bytes_of_one_request_are_bounded(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    reach = Reach("u", 5)
    assert reach.bytes_left == integer("archive_request_bytes")
    reach.bytes_left = 5_000  # as if the request had read the rest already
    with pytest.raises(ArchiveMissing, match="longer than 5,000 bytes"):
        await client.read(at(archiver), "ca://PV:A", "", T0, T0 + 60 * NS, reach)


async def test_an_archiver_that_is_down(client: ArchiveClient) -> None:
    down = Archiver(f"http://127.0.0.1:{free_port()}/retrieval", "*")
    t = time.monotonic()
    with pytest.raises(ArchiveMissing, match="cannot be reached"):
        await client.read(down, "ca://PV:A", "", T0, T0 + NS, Reach("u", 5))
    assert time.monotonic() - t < 5


async def test_an_identity_takes_turns_and_another_goes_on(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    """Two slow reads hold one identity's turns: its third waits (and misses within its
    deadline), another identity's read is answered at once."""
    most = integer("archive_fetches_per_identity")
    slow = [asyncio.ensure_future(client.read(at(archiver), f"ca://SLOW:{i}", "", T0, T0 + NS,
                                              Reach("a", 3))) for i in range(most)]  # fmt: skip
    await asyncio.sleep(0.2)  # let them take their turns (what is awaited is the misses below)
    with pytest.raises(ArchiveMissing, match="archive_fetches_per_identity"):
        await client.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("a", 0.5))
    other = await client.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("b", 5))
    assert len(other) == 11
    for task in slow:
        with pytest.raises(ArchiveMissing):
            await task


async def test_a_read_left_little_time_by_its_turns_is_its_own_miss(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    """A read whose deadline went on waiting for a turn (or on its request's earlier reads)
    and that misses it in the little time left says so, but leaves the archiver to every other
    reader: only one given most of the deadline blames it."""
    most = integer("archive_fetches_per_identity")
    with PbArchiver(fails="SLOW") as elsewhere:
        held = [
            asyncio.ensure_future(
                client.read(at(elsewhere), f"ca://X:{i}", "", T0, T0 + NS, Reach("a", 1))
            )
            for i in range(most)
        ]
        now = [0.0]
        late_reach = Reach("a", 5, clock=lambda: now[0])
        late = asyncio.ensure_future(
            client.read(at(archiver), "ca://SLOW:late", "", T0, T0 + NS, late_reach)
        )

        def waiting() -> bool:  # the identity's turns: held by two, waited for by the third
            turns = client._identities.get("a")
            return turns is not None and turns.users == most + 1

        await eventually_async(waiting, "the late read waiting for a turn")
        now[0] = 4.9  # as if it had waited that long: the turn comes with 0.1 s left
        with pytest.raises(ArchiveMissing, match=r"did not answer within 5 s"):
            await late
        for task in held:
            with pytest.raises(ArchiveMissing):
                await task
    got = await client.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("b", 5))
    assert len(got) == 11 and "skipped" not in client.outcomes


async def test_a_read_nobody_waits_for_any_more_is_given_up(
    archiver: PbArchiver, client: ArchiveClient
) -> None:
    """A read whose readers were all cancelled (a detached backfill, a closed request) ends
    and gives its turns back, rather than holding them to its deadline for nobody; one that
    another reader shares goes on for it."""
    most = integer("archive_fetches_per_identity")
    args = (at(archiver), "ca://SLOW:shared", "", T0, T0 + NS)
    shared = [asyncio.ensure_future(client.read(*args, Reach(who, 60))) for who in "ab"]
    alone = [
        asyncio.ensure_future(
            client.read(at(archiver), f"ca://SLOW:{i}", "", T0, T0 + NS, Reach("a", 60))
        )
        for i in range(most - 1)
    ]
    await eventually_async(lambda: archiver.requests["SLOW:0"] == 1, "the reads under way")
    for task in [shared[0], *alone]:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not shared[1].done()  # its read goes on for the reader left
    got = await client.read(at(archiver), "ca://PV:A", "", T0, T0 + NS, Reach("a", 5))
    assert len(got) == 11  # a turn of "a" was free: the read of SLOW:0 gave its own back
    shared[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await shared[1]
    await eventually_async(lambda: not client._identities, "every turn given back")


async def test_an_archiver_s_turns_are_bounded_and_another_archiver_goes_on(
    client: ArchiveClient,
) -> None:
    most = integer("archive_fetches_per_archiver")
    with PbArchiver() as busy, PbArchiver() as other:
        other.hold("PV:B", [(T0, 1.0)])
        slow = [
            asyncio.ensure_future(
                client.read(at(busy), f"ca://SLOW:{i}", "", T0, T0 + NS, Reach(f"id{i}", 3))
            )
            for i in range(most)
        ]
        await asyncio.sleep(0.2)
        with pytest.raises(ArchiveMissing, match="archive_fetches_per_archiver"):
            await client.read(at(busy), "ca://SLOW:more", "", T0, T0 + NS, Reach("late", 0.5))
        got = await client.read(at(other), "ca://PV:B", "", T0, T0 + NS, Reach("late", 5))
        assert len(got) == 1
        for task in slow:
            with pytest.raises(ArchiveMissing):
                await task


def test_routes_first_match_by_id_or_pv_name() -> None:
    r = Routes(["ca://SR:*=http://sr:17668/retrieval", "BL*=http://bl/retrieval/",
                "http://all:17668/retrieval"])  # fmt: skip
    assert r.route("ca://SR:BPM1") == Archiver("http://sr:17668/retrieval", "ca://SR:*")
    assert r.route("pva://BL1:X") == Archiver("http://bl/retrieval", "BL*")
    assert r.route("sim://sine") == Archiver("http://all:17668/retrieval", "*")
    assert r.route("ca://SR:X").name == "sr:17668"  # type: ignore[union-attr]
    assert not Routes([]) and Routes([]).route("ca://X") is None
    names = (pv_name("ca://A:B"), pv_name("pva://A:B"), pv_name("sim://x"))
    assert names == ("A:B", "A:B", "sim://x")
    with pytest.raises(ValueError, match="GLOB=URL"):
        Routes(["arch.example.org:17668"])
