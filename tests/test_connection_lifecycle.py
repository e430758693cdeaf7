"""One connection lifecycle for `/stream` and `/pvws/pv`, seen by real clients of a real server:
refusals a browser can read, and a stalled client that learns why it was closed.

The in-memory side (cancellation, release order) is in tests/test_connection.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

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


@pytest.fixture(scope="module")
def strict_server(epics_env: IocProcess) -> Iterator[ServerProcess]:
    """One allowed Origin, and one connection per client address."""
    env = {"PVWIRE_ALLOWED_ORIGINS": ALLOWED, "PVWIRE_MAX_CONNECTIONS_PER_ADDRESS": "1"}
    with ServerProcess(*server_args_for_tests(), env=env) as server:
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


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_one_connection_too_many_is_closed_with_1013_after_a_handshake(
    strict_server: ServerProcess, path: str
) -> None:
    first = await websockets.connect(ws_url(strict_server, "/stream"))
    try:
        hello = wire.decode_message(await first.recv(decode=False))
        assert isinstance(hello, wire.Hello)  # admitted
        async with websockets.connect(
            ws_url(strict_server, path), subprotocols=[websockets.Subprotocol("pvwire.v1")]
        ) as ws:
            assert ws.subprotocol == "pvwire.v1"
            assert await closed_with(ws) == 1013
    finally:
        await first.close()
        await eventually_async(
            lambda: asyncio.to_thread(lambda: metric(strict_server, "clients") == 0),
            "the first client gone",
        )


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
