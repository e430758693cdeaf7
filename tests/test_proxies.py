"""The real server behind Debian's haproxy and nginx terminating TLS, configured as
docs/OPERATIONS.md section 17 says (tests/proxies.py): clients get their values over https and
wss, and a client that writes its own `X-Forwarded-For` is still the address the proxy saw for
the host rules, the audit file, the admin views and every bound per address.

One server and both proxies for the module. The server trusts the proxies' address (127.0.0.2)
and their edges' (127.0.0.3, a stand-in for a client on another network, 192.0.2.10), not
127.0.0.1: each check's attacker binds its sockets to an address of its own in 127.0.0.0/8, so
the two proxies' checks share no bound.

The Python client verifies the test CA by what httpx and `ssl` take without a change to its
API: an httpx transport for GraphQL, `SSL_CERT_FILE` (read by `ssl.create_default_context`)
for its WebSocket.
"""

from __future__ import annotations

import asyncio
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
from pvwire_client import Client

from tests.certs import TestCA
from tests.eventually import eventually
from tests.proxies import KINDS, PROXY_SOURCE, REMOTE_CLIENT, TRUSTED, Proxy
from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess

CONNECTIONS = 4  # the module server's max_connections_per_address
MJPEG_VIEWERS = 2  # its mjpeg_viewers_per_address
PUTS_PER_S = 2.0  # its max_puts_per_s (bursts of twice that)
REFUSAL_BURST = integer("refusal_log_burst")  # lines per reason and source at once
# Each proxy's attacker: an address of its own, never a trusted proxy.
ATTACKER = {"haproxy": "127.0.0.9", "nginx": "127.0.0.10"}
RULES = """\
default = "READ"

[[rule]]                      # writes from this machine's own address
channels = ["sim://value/local*"]
hosts = ["127.0.0.1/32"]
access = "WRITE"

[[rule]]                      # writes from TEST-NET-3 alone
channels = ["sim://value/far*"]
hosts = ["203.0.113.0/24"]
access = "WRITE"

[[rule]]                      # writes from this machine, whichever of its addresses
channels = ["sim://value/loop*"]
hosts = ["127.0.0.0/8"]
access = "WRITE"

[[rule]]
channels = ["sim://value/any*"]
access = "WRITE"
"""
PUT = "mutation($id: String!, $v: JSON!) { put(id: $id, value: $v) { ok } }"


@dataclass
class Site:
    server: ServerProcess
    proxies: dict[str, Proxy]
    audit: Path

    def lines(self) -> list[dict[str, Any]]:
        text = self.audit.read_text() if self.audit.exists() else ""
        return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "rules.toml").write_text(RULES)
        audit = folder / "audit.jsonl"
        trusted = [arg for cidr in TRUSTED for arg in ("--trusted-proxy", cidr)]
        server = ServerProcess(
            *trusted, "--access-rules", str(folder / "rules.toml"), "--audit-log", str(audit),
            "--log-level", "warning",
            env={"PVWIRE_MAX_CONNECTIONS_PER_ADDRESS": str(CONNECTIONS),
                 "PVWIRE_MJPEG_VIEWERS_PER_ADDRESS": str(MJPEG_VIEWERS),
                 "PVWIRE_MAX_PUTS_PER_S": str(PUTS_PER_S)},
        )  # fmt: skip
        ca = TestCA(folder / "ca")
        with server:
            proxies = {kind: Proxy(kind, server.port, ca) for kind in KINDS}
            try:
                for p in proxies.values():
                    p.start()
                yield Site(server, proxies, audit)
            finally:
                for p in proxies.values():
                    p.stop()


@pytest.fixture(params=KINDS)
def proxy(request: pytest.FixtureRequest, site: Site) -> Proxy:
    return site.proxies[request.param]


def http(proxy: Proxy | None, source: str = "127.0.0.1") -> httpx.Client:
    """An HTTP client from `source`, to https through `proxy` (verifying the test CA)."""
    verify = proxy.ssl_context() if proxy is not None else True
    return httpx.Client(
        transport=httpx.HTTPTransport(local_address=source, verify=verify), timeout=30
    )


def put(client: httpx.Client, url: str, channel: str, value: float, **headers: str) -> str:
    """'ok' or the put's error code."""
    r = client.post(f"{url}/graphql", json={"query": PUT, "variables": {"id": channel, "v": value}},
                    headers=headers)  # fmt: skip
    doc = r.json()
    if doc.get("errors"):
        return str(doc["errors"][0]["extensions"]["code"])
    return "ok" if doc["data"]["put"]["ok"] else "not ok"


def puts(site: Site, before: int) -> list[dict[str, Any]]:
    """The audit file's put lines after the first `before` lines (summaries left out)."""
    return [x for x in site.lines()[before:] if "channel" in x]


def forged() -> dict[str, str]:
    """A client's own X-Forwarded-For, naming this machine and a network a rule lets write."""
    return {"X-Forwarded-For": "127.0.0.1, 203.0.113.1"}


def rotating(i: int) -> dict[str, str]:
    """A client's own X-Forwarded-For, another address each time."""
    return {"X-Forwarded-For": f"198.51.100.{i % 250 + 1}"}


# --- values over https and wss ----------------------------------------------------------------


async def test_the_python_client_gets_values_over_stream_and_pvws(
    proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(proxy.ca.path))  # the client's WebSocket
    transport = httpx.AsyncHTTPTransport(verify=proxy.ssl_context())
    channel = f"sim://counter/{proxy.kind}?rate=20"
    values: list[float] = []
    async with Client(proxy.url, transport=transport) as client:
        got = await client.get("sim://value/any_seed")
        assert got.connected
        async with asyncio.timeout(60):
            async for update in client.monitor([channel]):
                if update.channel.value is not None:
                    values.append(float(update.channel.value))
                if len(values) >= 5:
                    break
    assert values == sorted(values) and values[-1] > values[0], values
    pvws = await PvwsClient.connect(proxy.url, ssl=proxy.ssl_context())
    try:
        await pvws.subscribe(channel)
        first = await pvws.next("update", channel, timeout=30)
        # The channel is warm: a subscribe that lands while its change waits for the tick gets
        # that value now and again with the tick. What is checked is that the counter goes on.
        async with asyncio.timeout(30):
            later = await pvws.next("update", channel)
            while later.get("value") == first["value"]:
                later = await pvws.next("update", channel)
        assert later["value"] > first["value"], (first, later)
    finally:
        await pvws.close()


# --- what the forged address does not open ------------------------------------------------------


def test_a_forged_address_opens_no_host_rule(site: Site, proxy: Proxy) -> None:
    """`X-Forwarded-For: 127.0.0.1, 203.0.113.1` from another address is that other address:
    neither the rule for 127.0.0.1 nor the one for 203.0.113.0/24 lets it write; this machine
    itself (127.0.0.1, no header) may, through the same proxy."""
    attacker = ATTACKER[proxy.kind]
    before = len(site.lines())
    with http(proxy) as honest, http(proxy, attacker) as mallory:
        assert put(honest, proxy.url, "sim://value/local_h", 1) == "ok"
        assert put(mallory, proxy.url, "sim://value/local_h", 2, **forged()) == "WRITE_DENIED"
        assert put(mallory, proxy.url, "sim://value/far_h", 3, **forged()) == "WRITE_DENIED"
    lines = puts(site, before)
    assert [(x["address"], x["result"] == "ok") for x in lines] == [
        ("127.0.0.1", True), (attacker, False), (attacker, False)
    ]  # fmt: skip


def test_a_forged_address_opens_no_admin_view(site: Site, proxy: Proxy) -> None:
    """Through the edge the client is 192.0.2.10, on no loopback: the admin views stay shut
    however it names itself; this machine itself sees them through the same proxy."""
    before = len(site.lines())
    with http(None) as remote, http(proxy) as local:
        for headers in ({}, {"X-Forwarded-For": "127.0.0.1"}, forged()):
            r = remote.get(f"{proxy.edge_url}/pvws/summary", headers=headers)
            assert r.status_code == 403 and "anonymous" in r.text, (headers, r.text)
        assert local.get(f"{proxy.url}/pvws/summary").status_code == 200
        # The address the server took, as the audit file has it: the edge's client.
        code = put(remote, proxy.edge_url, "sim://value/local_e", 1, **forged())
        assert code == "WRITE_DENIED"
    assert [x["address"] for x in puts(site, before)] == [REMOTE_CLIENT]


def _admin_answers(client: httpx.Client, url: str) -> tuple[int, int, str]:
    """What `/pvws/summary`, `DELETE /pvws/socket/ID` and the `server` query's `clients` say to
    `client` at `url`: two statuses and a GraphQL error code ("" for none)."""
    summary = client.get(f"{url}/pvws/summary").status_code
    delete = client.delete(f"{url}/pvws/socket/nobody").status_code
    doc = client.post(f"{url}/graphql", json={"query": "{ server { clients { id } } }"}).json()
    return summary, delete, str(doc["errors"][0]["extensions"]["code"]) if "errors" in doc else ""


def test_a_request_naming_nobody_behind_the_proxy_is_not_this_machine(site: Site) -> None:
    """Through haproxy's frontend in TCP mode, which adds no header, and straight from the
    proxy's own address without one (its health check's way): the client is the proxy's
    address, 127.0.0.2, loopback but a trusted proxy, so it came from whoever the proxy did not
    name. Neither the admin views nor the rule for 127.0.0.0/8 take it for this machine, which
    itself (127.0.0.1) is let in by both."""
    haproxy = site.proxies["haproxy"]
    assert haproxy.tcp_url is not None
    before = len(site.lines())
    with http(None) as through_tcp, http(None, PROXY_SOURCE) as from_proxy, http(None) as local:
        for client, url in ((through_tcp, haproxy.tcp_url), (from_proxy, site.server.url)):
            assert _admin_answers(client, url) == (403, 403, "FORBIDDEN"), url
            assert put(client, url, "sim://value/loop_p", 1) == "WRITE_DENIED", url
        assert _admin_answers(local, site.server.url) == (200, 404, "")
        assert put(local, site.server.url, "sim://value/loop_p", 2) == "ok"
    assert [(x["address"], x["result"] == "ok") for x in puts(site, before)] == [
        (PROXY_SOURCE, False), (PROXY_SOURCE, False), ("127.0.0.1", True)
    ]  # fmt: skip


# --- the bounds per address ----------------------------------------------------------------------


async def _stream(proxy: Proxy, source: str, headers: dict[str, str]) -> Any:
    url = proxy.url.replace("https://", "wss://") + "/stream"
    return await websockets.connect(
        url, ssl=proxy.ssl_context(), additional_headers=headers, local_addr=(source, 0)
    )


async def test_forged_addresses_are_one_address_for_the_websocket_bound(proxy: Proxy) -> None:
    """A new X-Forwarded-For for each socket: the server counts them all as the attacker's one
    address, and answers the upgrade of the first past max_connections_per_address with 429
    naming it."""
    attacker = ATTACKER[proxy.kind]
    opened = []
    try:
        for i in range(CONNECTIONS):
            opened.append(await _stream(proxy, attacker, rotating(i)))
            await asyncio.wait_for(opened[-1].recv(), 30)  # HELLO: admitted
        with pytest.raises(websockets.InvalidStatus) as refused:
            await _stream(proxy, attacker, rotating(249))
        assert refused.value.response.status_code == 429
        assert f"{CONNECTIONS} connections from {attacker}" in refused.value.response.body.decode()
    finally:
        await asyncio.gather(*(ws.close() for ws in opened))


async def _mjpeg_status(proxy: Proxy, source: str, headers: dict[str, str]) -> int:
    """The status of one MJPEG request through `proxy` from `source`, left open."""
    path = "/mjpeg/" + quote(f"sim://image/{proxy.kind}?width=32&height=32&rate=5", safe="")
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", proxy.port, ssl=proxy.ssl_context(), local_addr=(source, 0)
    )
    _OPEN.append(writer)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode())
    status = await asyncio.wait_for(reader.readuntil(b"\r\n"), 30)
    return int(status.split()[1])


_OPEN: list[asyncio.StreamWriter] = []


async def test_forged_addresses_are_one_address_for_mjpeg_viewers(proxy: Proxy) -> None:
    attacker = ATTACKER[proxy.kind]
    try:
        statuses = [await _mjpeg_status(proxy, attacker, rotating(i)) for i in range(MJPEG_VIEWERS)]
        assert statuses == [200] * MJPEG_VIEWERS
        assert await _mjpeg_status(proxy, attacker, rotating(249)) == 503
    finally:
        for writer in _OPEN:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in _OPEN), return_exceptions=True)
        _OPEN.clear()


def test_forged_addresses_are_one_identity_for_the_anonymous_put_rate(
    site: Site, proxy: Proxy
) -> None:
    """Anonymous puts are rated per address: rotating the header buys no more puts."""
    attacker = ATTACKER[proxy.kind]
    before = len(site.lines())
    results = []
    with http(proxy, attacker) as mallory:
        t0 = time.monotonic()
        for i in range(30):
            results.append(put(mallory, proxy.url, "sim://value/any_rate", i, **rotating(i)))
        elapsed = time.monotonic() - t0
    ok = results.count("ok")
    # A burst of twice the rate, then the rate: the bound grows with the time taken, so a slow
    # machine only makes it looser.
    assert ok <= 2 * PUTS_PER_S + PUTS_PER_S * elapsed + 1, (ok, elapsed, results)
    assert set(results) <= {"ok", "RATE_LIMITED"}, results
    # What holds however slow the machine (the bound above loosens with the time taken): the
    # rate was the attacker's one address's, as its puts' audit lines name it.
    lines = puts(site, before)
    assert len(lines) >= ok and {x["address"] for x in lines} == {attacker}


def test_forged_addresses_are_one_source_for_the_refusal_log(site: Site, proxy: Proxy) -> None:
    """60 bad bearer tokens, each with a new X-Forwarded-For: one source, whose lines are
    bounded as one address's are, each naming the attacker's real address."""
    attacker = ATTACKER[proxy.kind]
    before = len(site.lines())
    with http(proxy, attacker) as mallory:
        t0 = time.monotonic()
        for i in range(60):
            r = mallory.post(f"{proxy.url}/graphql", json={"query": "{ server { version } }"},
                             headers={"Authorization": "Bearer forged", **rotating(i)})  # fmt: skip
            assert r.status_code == 401
        elapsed = time.monotonic() - t0
    eventually(lambda: len(site.lines()) > before, "the refusals' lines")
    refused = [x for x in site.lines()[before:] if x.get("event") == "auth_refused"]
    assert {x["address"] for x in refused} == {attacker}
    assert len(refused) <= REFUSAL_BURST + elapsed + 1, (len(refused), elapsed)


# --- and without a trusted proxy -----------------------------------------------------------------


def test_a_client_writing_x_forwarded_for_to_the_server_is_its_own_address(site: Site) -> None:
    """127.0.0.1 is no trusted proxy here: its X-Forwarded-For: 203.0.113.9 is ignored by
    pvwire and, with its proxy-header handling off, by the HTTP server beneath it (which would
    otherwise trust 127.0.0.1 and rewrite the client's address)."""
    before = len(site.lines())
    header = {"X-Forwarded-For": "203.0.113.9"}
    with http(None) as client:
        assert put(client, site.server.url, "sim://value/local_d", 1, **header) == "ok"
        assert put(client, site.server.url, "sim://value/far_d", 2, **header) == "WRITE_DENIED"
    lines = puts(site, before)
    assert [(x["address"], x["channel"]) for x in lines] == [
        ("127.0.0.1", "sim://value/local_d"), ("127.0.0.1", "sim://value/far_d")
    ]  # fmt: skip
