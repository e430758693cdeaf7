"""The real server on IPv6 loopback (`--host ::1`): every bound kept per client address counts an
IPv6 client by its /64 (access/bound_key.py), while the audit file and the access rules see its
whole address; and the trusted proxy's own address opens no admin view.

Loopback has one IPv6 address, `::1`, so the addresses of one /64 come as a trusted proxy in
front of IPv6 clients forwards them: the test connects from `::1`, the server's only
`--trusted-proxy`, and writes an `X-Forwarded-For` with a new address of the /64 for every
socket or request (2001:db8::/32, documentation only; never a source address here). Each test
takes a /64 of its own, so that none spends another's budget.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import websockets
from pvwire.limits import integer
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually
from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess
from tests.stream_client import RawStream

LOCAL = "::1"
CONNECTIONS = 20  # the module server's max_connections_per_address (past pvget_in_flight)
MJPEG_VIEWERS = 2
PUTS_PER_S = 2.0
CHANNELS = 40  # its max_channels_per_address (past the pvgets below)
PVGET_IN_FLIGHT = integer("pvget_in_flight")
REFUSAL_BURST = integer("refusal_log_burst")
RULES = """\
default = "READ"

[[rule]]                      # one address of a /64, not its neighbours
channels = ["sim://value/one*"]
hosts = ["2001:db8:7:1::5/128"]
access = "WRITE"

[[rule]]
channels = ["sim://value/any*"]
access = "WRITE"
"""
PUT = "mutation($id: String!, $v: JSON!) { put(id: $id, value: $v) { ok } }"


def net(n: int) -> str:
    """The test's own /64."""
    return f"2001:db8:7:{n:x}::/64"


def in_net(n: int, i: int) -> str:
    """The `i`-th address of /64 number `n`, from its far end (as one client picks them)."""
    return str(ipaddress.ip_network(net(n))[-1 - i])


def via(address: str) -> dict[str, str]:
    """What the trusted proxy says of a request: it came from `address`."""
    return {"X-Forwarded-For": address}


@dataclass
class Site:
    server: ServerProcess
    audit: Path

    def lines(self) -> list[dict[str, Any]]:
        text = self.audit.read_text() if self.audit.exists() else ""
        return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def site(epics_env: IocProcess) -> Iterator[Site]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "rules.toml").write_text(RULES)
        audit = folder / "audit.jsonl"
        server = ServerProcess(
            "--trusted-proxy", f"{LOCAL}/128", "--access-rules", str(folder / "rules.toml"),
            "--audit-log", str(audit), "--log-level", "warning",
            env={"PVWIRE_MAX_CONNECTIONS_PER_ADDRESS": str(CONNECTIONS),
                 "PVWIRE_MJPEG_VIEWERS_PER_ADDRESS": str(MJPEG_VIEWERS),
                 "PVWIRE_MAX_PUTS_PER_S": str(PUTS_PER_S),
                 "PVWIRE_MAX_CHANNELS_PER_ADDRESS": str(CHANNELS)},
            host=LOCAL,
        )  # fmt: skip
        with server:
            yield Site(server, audit)


def http(site: Site, connections: int = 4) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(
        local_address=LOCAL, limits=httpx.Limits(max_connections=connections)
    )
    return httpx.AsyncClient(base_url=site.server.url, transport=transport, timeout=60)


async def put(client: httpx.AsyncClient, channel: str, value: float, address: str) -> str:
    """'ok' or the put's error code."""
    body = {"query": PUT, "variables": {"id": channel, "v": value}}
    doc = (await client.post("/graphql", json=body, headers=via(address))).json()
    if doc.get("errors"):
        return str(doc["errors"][0]["extensions"]["code"])
    return "ok" if doc["data"]["put"]["ok"] else "not ok"


async def stream(site: Site, address: str) -> RawStream:
    return await RawStream.connect(
        site.server.ws_url, additional_headers=via(address), local_addr=(LOCAL, 0)
    )


# --- the bounds count a /64 --------------------------------------------------------------------


async def test_the_sockets_of_one_64_are_one_address_s(site: Site) -> None:
    """A new address of the /64 for every WebSocket: the first past max_connections_per_address
    is refused at its upgrade, 429 naming the /64; a client of the next /64 is served."""
    opened: list[RawStream] = []
    try:
        for i in range(CONNECTIONS):
            opened.append(await stream(site, in_net(1, i)))  # HELLO: admitted
        with pytest.raises(websockets.InvalidStatus) as refused:
            await stream(site, in_net(1, CONNECTIONS))
        assert refused.value.response.status_code == 429
        assert f"{CONNECTIONS} connections from {net(1)}" in refused.value.response.body.decode()
        opened.append(await stream(site, in_net(2, 0)))
    finally:
        await asyncio.gather(*(s.close() for s in opened))


async def test_the_channels_of_one_64_are_one_address_s_budget(site: Site) -> None:
    """One pvws socket holds all the channels an address may (max_channels_per_address); a
    socket from another address of the /64 gets none more."""
    names = [f"sim://value/any_v6_{i}" for i in range(CHANNELS)]
    first, second = [
        await PvwsClient.connect(
            site.server.url, additional_headers=via(in_net(3, i)), local_addr=(LOCAL, 0)
        )
        for i in range(2)
    ]
    try:
        await first.subscribe(*names)
        for name in names:
            await first.next("update", name, timeout=30)
        # Two names: pvws tells errors only to a client that shows it reads them
        # (pvws/messages.py `may_read_errors`).
        await second.subscribe("sim://value/any_v6_past", "sim://value/any_v6_past2")
        error = await second.next("error", timeout=30)
        assert "max_channels_per_address" in error["message"] and net(3) in error["message"]
    finally:
        await asyncio.gather(first.close(), second.close())


async def _mjpeg_status(site: Site, address: str, opened: list[asyncio.StreamWriter]) -> bytes:
    """The status line and first words of one MJPEG request from `address`, left open."""
    path = "/mjpeg/" + quote("sim://image/v6?width=32&height=32&rate=5", safe="")
    reader, writer = await asyncio.open_connection(LOCAL, site.server.port, local_addr=(LOCAL, 0))
    opened.append(writer)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {address}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    if head.startswith(b"HTTP/1.1 200"):
        return head.split(b"\r\n", 1)[0]
    return head.split(b"\r\n", 1)[0] + b" " + await asyncio.wait_for(reader.read(300), 30)


async def test_the_mjpeg_viewers_of_one_64_are_one_address_s(site: Site) -> None:
    opened: list[asyncio.StreamWriter] = []
    try:
        statuses = [await _mjpeg_status(site, in_net(4, i), opened) for i in range(MJPEG_VIEWERS)]
        assert all(s.startswith(b"HTTP/1.1 200") for s in statuses), statuses
        past = await _mjpeg_status(site, in_net(4, MJPEG_VIEWERS), opened)
        assert past.startswith(b"HTTP/1.1 503") and net(4).encode() in past, past
    finally:
        for writer in opened:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in opened), return_exceptions=True)


async def test_the_puts_of_one_64_spend_one_rate_and_each_is_audited_by_its_address(
    site: Site,
) -> None:
    before = len(site.lines())
    async with http(site) as client:
        t0 = time.monotonic()
        results = [await put(client, "sim://value/any_v6", i, in_net(5, i)) for i in range(30)]
        elapsed = time.monotonic() - t0
    ok = results.count("ok")
    # A burst of twice the rate, then the rate: the time taken only loosens the bound.
    assert ok <= 2 * PUTS_PER_S + PUTS_PER_S * elapsed + 1, (ok, elapsed, results)
    assert set(results) == {"ok", "RATE_LIMITED"}, results
    lines = [x for x in site.lines()[before:] if "channel" in x]
    # Each line names the whole address it came from, the /64 being what the rate counted.
    sent = {in_net(5, i) for i in range(30)}
    assert len(lines) >= ok and {x["address"] for x in lines} <= sent
    assert len({x["address"] for x in lines}) == len(lines)


async def test_the_refusals_of_one_64_are_one_source(site: Site) -> None:
    """60 bad bearer tokens, each from another address of the /64: one source's lines (its
    burst and a line a second), not a fresh source's burst each; every line names its whole
    address."""
    before = len(site.lines())
    async with http(site) as client:
        t0 = time.monotonic()
        for i in range(60):
            headers = {"Authorization": "Bearer forged", **via(in_net(6, i))}
            r = await client.post("/graphql", json={"query": "{ server { version } }"},
                                  headers=headers)  # fmt: skip
            assert r.status_code == 401
        elapsed = time.monotonic() - t0
    eventually(lambda: len(site.lines()) > before, "the refusals' lines")
    refused = [x for x in site.lines()[before:] if x.get("event") == "auth_refused"]
    assert len(refused) <= REFUSAL_BURST + elapsed + 1, (len(refused), elapsed)
    named = [x["address"] for x in refused]
    assert len(set(named)) == len(named) and set(named) <= {in_net(6, i) for i in range(60)}


async def test_the_pvgets_of_one_64_in_flight_are_one_address_s(site: Site) -> None:
    """Gets of names no IOC has (each a search for get_timeout_s) from as many addresses of the
    /64 at once: past pvget_in_flight, answered 429 naming the /64, at once."""
    names = [f"ca://V6:NOBODY:{i}" for i in range(PVGET_IN_FLIGHT + 4)]
    async with http(site, connections=len(names)) as client:
        answers = await asyncio.gather(*(
            client.get("/pvws/pvget", params={"name": n}, headers=via(in_net(7, i)))
            for i, n in enumerate(names)
        ))  # fmt: skip
    refused = [r.json() for r in answers if r.status_code == 429]
    assert refused and all(r["code"] == "TOO_MANY_REQUESTS" for r in refused), refused
    assert all(net(7) in r["message"] for r in refused), refused[0]
    assert len(refused) >= len(names) - PVGET_IN_FLIGHT, [r.status_code for r in answers]


# --- and what keeps the whole address ----------------------------------------------------------


async def test_a_hosts_rule_sees_the_whole_address(site: Site) -> None:
    async with http(site) as client:
        assert await put(client, "sim://value/one_v6", 1, "2001:db8:7:1::5") == "ok"
        assert await put(client, "sim://value/one_v6", 2, "2001:db8:7:1::6") == "WRITE_DENIED"


async def test_the_trusted_proxy_s_own_address_is_not_this_machine(site: Site) -> None:
    """::1 is loopback, and the trusted proxy: a request from it that forwards nobody (a
    frontend in TCP mode, its health check) or only itself opens no admin view."""
    async with http(site) as client:
        for headers in ({}, via(LOCAL), via("2001:db8:7:9::1")):
            r = await client.get("/pvws/summary", headers=headers)
            assert r.status_code == 403 and "not an administrator" in r.text, (headers, r.text)
            r = await client.delete("/pvws/socket/1", headers=headers)
            assert r.status_code == 403, (headers, r.text)
        doc = (
            await client.post("/graphql", json={"query": "{ server { clients { id } } }"})
        ).json()
        assert doc["errors"][0]["extensions"]["code"] == "FORBIDDEN", doc
