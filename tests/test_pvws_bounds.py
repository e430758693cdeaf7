"""`/pvws/pv`'s per-message bounds over the real server: names per `subscribe`, opening many
names a few per event-loop pass, writes in flight per connection, writable sim PVs monitored per
server; and `/pvws/pvget`'s gets in flight and per second. Each is exceeded from one connection
(or address); the error it gets names the limit, and what it already holds goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from pvwire import limits
from pvwire_dev.ioc import IocProcess

from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess, server_args_for_tests


@pytest.fixture(scope="module")
def bounds_server(epics_env: IocProcess) -> Iterator[ServerProcess]:
    # Puts are rate limited per identity (20/s); this server allows more, so that writes
    # reach the in-flight bound instead of the rate limit.
    # And a pvget of a name no IOC has waits long enough to be seen in flight.
    env = {"PVWIRE_MAX_PUTS_PER_S": "1000", "PVWIRE_GET_TIMEOUT_S": "30"}
    with ServerProcess(*server_args_for_tests(), env=env) as server:
        yield server


async def errors_and_updates(
    client: PvwsClient, until: int, kind: str = "update"
) -> tuple[list[str], set[str]]:
    """Messages until `until` of `kind` arrived: the errors, and the PVs updated."""
    errors: list[str] = []
    updated: set[str] = set()
    async with asyncio.timeout(120):
        while len(errors if kind == "error" else updated) < until:
            m = await client.recv(60)
            if m["type"] == "error":
                errors.append(m["message"])
            elif m["type"] == "update":
                updated.add(m["pv"])
    return errors, updated


async def test_a_subscribe_of_too_many_names_is_refused_and_nothing_else_is_lost(
    bounds_server: ServerProcess,
) -> None:
    cap = limits.integer("max_channels_per_subscription")
    client = await PvwsClient.connect(bounds_server.url)
    try:
        await client.subscribe("sim://counter/held", "sim://value/held_too")
        await client.next("update", "sim://counter/held", timeout=60)
        await client.subscribe(*[f"sim://value/many{i}" for i in range(cap + 1)])
        error = await client.next("error", timeout=60)
        assert error["message"] == (
            f"Cannot subscribe to {cap + 1:,} PVs in one message: the most is {cap:,} "
            "(max_channels_per_subscription)"
        )
        await client.send(type="list")
        listed = await client.next("list", timeout=60)
        assert listed["pvs"] == ["sim://counter/held", "sim://value/held_too"]
        # The PVs held go on updating.
        first = (await client.next("update", "sim://counter/held", timeout=60))["value"]
        later = (await client.next("update", "sim://counter/held", timeout=60))["value"]
        assert later > first
    finally:
        await client.close()


async def test_many_names_open_a_few_per_pass_and_other_messages_are_answered_meanwhile(
    bounds_server: ServerProcess,
) -> None:
    """5,000 names take 100 passes of the event loop to open: a message sent right after the
    subscribe, on the same connection, is answered before the last of them opens (opened all at
    once, the answer came after every one of the 5,000 updates), and a bystander's too."""
    n = 5_000
    names = [f"sim://value/open{i}" for i in range(n)]
    client = await PvwsClient.connect(bounds_server.url)
    bystander = await PvwsClient.connect(bounds_server.url)
    try:
        await client.subscribe(*names)
        await client.send(type="echo", after="subscribe")
        await bystander.send(type="echo", by="bystander")
        bystander_answered = asyncio.create_task(bystander.next("echo", timeout=120))
        updated: set[str] = set()
        echoed_after = -1
        async with asyncio.timeout(180):
            while len(updated) < n:
                m = await client.recv(60)
                if m["type"] == "update":
                    updated.add(m["pv"])
                elif m["type"] == "echo":
                    echoed_after = len(updated)
                elif m["type"] == "error":
                    raise AssertionError(m["message"])
        assert updated == set(names)  # every one answered with its value
        assert 0 <= echoed_after < n
        assert (await bystander_answered)["by"] == "bystander"
    finally:
        await client.close()
        await bystander.close()


async def test_writes_in_flight_past_the_bound_are_refused_with_an_error(
    bounds_server: ServerProcess,
) -> None:
    """Writes to a CA PV that never connects stay in flight until their timeout: past the bound
    each further one is answered with an error naming it, and is not made."""
    cap = limits.integer("pvws_writes_in_flight")
    pv = "ca://PVW:NO_SUCH_RECORD"
    client = await PvwsClient.connect(bounds_server.url)
    try:
        await client.subscribe(pv, "sim://counter/w")
        for i in range(cap + 5):
            await client.send(type="write", pv=pv, value=i)
        errors, _ = await errors_and_updates(client, 5, kind="error")
        refused = [e for e in errors if "pvws_writes_in_flight" in e]
        expected = (
            f"Cannot write {pv}: {cap} writes of this connection are not done yet, the most one "
            "may have (pvws_writes_in_flight)"
        )
        assert refused[:5] == [expected] * 5
        # Once they time out, writes are taken again: the bound is on those in flight.
        timed_out, _ = await errors_and_updates(client, cap, kind="error")
        assert all("pvws_writes_in_flight" not in e for e in timed_out)
        await client.send(type="write", pv=pv, value=1.0)
        again = await client.next("error", timeout=60)
        assert "pvws_writes_in_flight" not in again["message"]
    finally:
        await client.close()


async def test_a_writable_sim_past_the_store_bound_is_refused_and_the_connection_goes_on(
    bounds_server: ServerProcess,
) -> None:
    """With `sim_max_stores` writable sim PVs monitored, one more is refused with a message
    naming the bound (it closed the connection with 1011), and those held still take writes."""
    cap = limits.integer("sim_max_stores")
    names = [f"sim://value/store{i}" for i in range(cap)]
    client = await PvwsClient.connect(bounds_server.url)
    try:
        await client.subscribe(*names)
        errors, updated = await errors_and_updates(client, cap)
        assert not errors and updated == set(names)
        await client.subscribe("sim://value/one_more")
        refused = await client.next("error", timeout=60)
        # The id once: the sim reason opens with it too.
        assert refused["message"] == (
            f"sim://value/one_more: this server keeps at most {cap:,} writable sim instances "
            "(sim_max_stores) and all of them are monitored"
        )
        await client.send(type="write", pv=names[0], value=7.5)
        written = await client.next("update", names[0], timeout=60)
        assert written["value"] == 7.5
    finally:
        await client.close()


def pvget_client(server: ServerProcess, local: str) -> httpx.AsyncClient:
    """pvgets from the local address `local` (all of 127/8 is loopback), over up to 40
    connections at once."""
    transport = httpx.AsyncHTTPTransport(
        local_address=local, limits=httpx.Limits(max_connections=40)
    )
    return httpx.AsyncClient(base_url=server.url, transport=transport, timeout=120)


async def test_pvgets_in_flight_are_bounded_per_address(bounds_server: ServerProcess) -> None:
    """Each pvget of a name no IOC has waits `get_timeout_s` (30 s on this server) for an
    upstream search: one address has at most `pvget_in_flight` of them at once."""
    most = limits.integer("pvget_in_flight")
    async with (
        pvget_client(bounds_server, "127.0.0.61") as flood,
        pvget_client(bounds_server, "127.0.0.62") as neighbour,
    ):
        gets = [
            asyncio.ensure_future(flood.get("/pvws/pvget", params={"name": f"ca://NOPE:{i}"}))
            for i in range(most + 8)
        ]
        try:
            refused = []
            async with asyncio.timeout(60):
                for done in asyncio.as_completed(gets):
                    r = await done
                    assert r.status_code == 429, (r.status_code, r.text)
                    refused.append(r.json())
                    if len(refused) == 8:
                        break
            assert all(e["code"] == "TOO_MANY_REQUESTS" for e in refused), refused
            assert "pvget_in_flight" in refused[0]["message"], refused[0]
            # Another address is answered meanwhile.
            r = await neighbour.get("/pvws/pvget", params={"name": "sim://value/pvget_ok"})
            assert r.status_code == 200 and r.json()["pv"] == "sim://value/pvget_ok", r.text
        finally:
            for g in gets:
                g.cancel()
            await asyncio.gather(*gets, return_exceptions=True)


async def test_pvgets_are_rate_limited_per_identity(bounds_server: ServerProcess) -> None:
    rate = limits.number("pvget_per_s")
    count = 1_000
    name = {"name": "sim://value/pvget_rate"}
    async with pvget_client(bounds_server, "127.0.0.63") as client:
        sem = asyncio.Semaphore(16)

        async def one() -> httpx.Response:
            async with sem:
                return await client.get("/pvws/pvget", params=name)

        loop = asyncio.get_running_loop()
        started = loop.time()
        answers = await asyncio.gather(*(one() for _ in range(count)))
        seconds = loop.time() - started
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert len(ok) + len(refused) == count, {r.status_code for r in answers}
    # A burst of twice the rate, then the rate: what that lets through in the time it took.
    allowed = 2 * rate + rate * (seconds + 1)
    assert ok and len(ok) <= allowed, f"{len(ok)} answered in {seconds:.1f} s, bound {allowed:g}"
    assert len(refused) >= count - allowed
    if refused:
        error = refused[0].json()
        assert error["code"] == "RATE_LIMITED" and "pvget_per_s" in error["message"], error
