"""One connection lifecycle for `/stream` and `/pvws/pv`, seen by real clients of a real server:
refusals a browser can read, connections counted at accept (HTTP and WebSocket together, a
trusted proxy's clients by the address it forwards), and a stalled client that learns why it
was closed.

The in-memory side (cancellation, release order) is in tests/test_connection.py."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import msgpack
import pytest
import websockets
from pvwire_client import wire
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually_async
from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess, server_args_for_tests
from tests.test_stream_close_codes import closed_with, metric

ALLOWED = "https://controls.example.org"
ENDPOINTS = [pytest.param("/stream", id="stream"), pytest.param("/pvws/pv", id="pvws")]
PROXY = "127.0.0.5"  # a trusted proxy (all of 127/8 is loopback)


@pytest.fixture(scope="module")
def strict_server(epics_env: IocProcess) -> Iterator[ServerProcess]:
    """One allowed Origin, one connection per client address, and a trusted proxy."""
    env = {"PVWIRE_ALLOWED_ORIGINS": ALLOWED, "PVWIRE_MAX_CONNECTIONS_PER_ADDRESS": "1"}
    args = server_args_for_tests(["--trusted-proxy", f"{PROXY}/32"])
    with ServerProcess(*args, env=env) as server:
        yield server


def ws_url(server: ServerProcess, path: str) -> str:
    return server.url.replace("http://", "ws://") + path


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_a_refused_origin_is_closed_with_1008_after_a_handshake_a_browser_accepts(
    strict_server: ServerProcess, path: str
) -> None:
    url = ws_url(strict_server, path)
    offer = [websockets.Subprotocol("pvwire.v1")]
    origin = websockets.Origin("https://elsewhere.example.org")
    async with websockets.connect(url, subprotocols=offer, origin=origin) as ws:
        # A browser fails a handshake that selects none of its offers, and its application then
        # sees 1006, which says "reconnect": the server selects the offer to say 1008, "stop".
        assert ws.subprotocol == "pvwire.v1"
        assert await closed_with(ws) == 1008


def get(url: str, local: str = "127.0.0.1") -> tuple[int, bytes]:
    """A GET from the local address `local`: its status and body."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30, source_address=(local, 0)) as s:
        path = "/" + url.split("//", 1)[1].split("/", 1)[1]
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while data := s.recv(65536):
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def connect_from(
    url: str, local: str, headers: dict[str, str] | None = None
) -> websockets.ClientConnection:
    """A WebSocket from the local address `local`, past HELLO, that said something (a PING),
    so that no deadline of its own ends it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((local, 0))
    sock.setblocking(False)
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    ws = await websockets.connect(url, sock=sock, additional_headers=headers)
    if url.endswith("/stream"):
        assert isinstance(wire.decode_message(await ws.recv(decode=False)), wire.Hello)
        await ws.send(msgpack.packb([18, 1]))
    return ws


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_one_connection_too_many_is_refused_at_accept_http_and_websocket_alike(
    strict_server: ServerProcess, path: str
) -> None:
    first = await connect_from(ws_url(strict_server, "/stream"), "127.0.0.1")
    try:
        # Refused as it opens, before the upgrade: an HTTP 429 a client reads as a failed
        # attempt (its backoff grows), where the WebSocket was once accepted to be closed 1013.
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(ws_url(strict_server, path))
        response = refused.value.response
        assert response.status_code == 429, response
        assert b"1 connections from 127.0.0.1 already" in response.body
        assert b"max_connections_per_address" in response.body
        # The WebSocket counts for HTTP too, and HTTP for WebSockets.
        status, body = await asyncio.to_thread(get, strict_server.url + "/healthz")
        assert status == 429 and b"max_connections_per_address" in body, body
        neighbour = await asyncio.to_thread(get, strict_server.url + "/healthz", "127.0.0.2")
        assert neighbour[0] == 200, neighbour
    finally:
        await first.close()
        await eventually_async(
            lambda: asyncio.to_thread(lambda: metric(strict_server, "clients") == 0),
            "the first client gone",
        )
    # Gone, its address's connection is free again.
    await eventually_async(
        lambda: asyncio.to_thread(lambda: get(strict_server.url + "/healthz")[0] == 200),
        "the address's connection free",
    )


async def test_a_trusted_proxy_s_clients_count_under_the_addresses_it_forwards(
    strict_server: ServerProcess,
) -> None:
    url = ws_url(strict_server, "/stream")
    one = await connect_from(url, PROXY, {"X-Forwarded-For": "192.0.2.1"})
    other = await connect_from(url, PROXY, {"X-Forwarded-For": "192.0.2.2"})
    try:
        # The proxy holds two connections, its bound being one: its own address counts nothing.
        with pytest.raises(websockets.InvalidStatus) as refused:
            await connect_from(url, PROXY, {"X-Forwarded-For": "192.0.2.1"})
        response = refused.value.response
        assert response.status_code == 429, response
        assert b"connections from 192.0.2.1 already" in response.body
        status, _ = await asyncio.to_thread(get, strict_server.url + "/healthz", PROXY)
        assert status == 200  # a request of the proxy's own: no forwarded address, not counted
    finally:
        await one.close()
        await other.close()
        await eventually_async(
            lambda: asyncio.to_thread(lambda: metric(strict_server, "clients") == 0),
            "the proxied clients gone",
        )


async def test_pvws_refuses_an_origin_before_it_looks_at_credentials(
    strict_server: ServerProcess,
) -> None:
    """Admitted first, then identified: a connection refused for its Origin costs no token
    check and writes no refusal line, where it once had its bearer token verified first."""

    def refusals() -> float:
        text = strict_server.metrics()
        found = [ln for ln in text.splitlines() if ln.startswith("pvwire_auth_refusals_total")]
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in found)

    before = await asyncio.to_thread(refusals)
    async with websockets.connect(
        ws_url(strict_server, "/pvws/pv"),
        origin=websockets.Origin("https://elsewhere.example.org"),
        additional_headers={"Authorization": "Bearer not-a-token"},
    ) as ws:
        assert await closed_with(ws) == 1008
        assert ws.close_reason is not None and "origin" in ws.close_reason, ws.close_reason
    assert await asyncio.to_thread(refusals) == before


async def test_a_stalled_pvws_client_sees_4008_once_it_reads_again(
    epics_env: IocProcess,
) -> None:
    with ServerProcess(*server_args_for_tests()) as server:
        # ~2 MB of JSON per update at 10 Hz; max_queue=1 makes the client library stop reading.
        slow = await PvwsClient.connect(server.url, max_queue=1)
        await slow.subscribe("sim://waveform/pvstall?length=200000&rate=10")
        # The server gave up on it (stall limit 2 s on the test server) and released its session
        # at once, while the close frame still waits behind what the client has not read.
        await eventually_async(
            lambda: asyncio.to_thread(lambda: metric(server, "clients") == 0),
            "the stalled client released",
        )
        assert await closed_with(slow.ws, timeout=60) == 4008


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_a_long_refused_origin_still_closes_with_1008(
    strict_server: ServerProcess, path: str
) -> None:
    # The reason names the Origin; a close frame holds 123 bytes of it.
    origin = websockets.Origin("https://" + "x" * 300 + ".example.org")
    async with websockets.connect(ws_url(strict_server, path), origin=origin) as ws:
        assert await closed_with(ws) == 1008
