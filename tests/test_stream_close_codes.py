"""Close codes a real client receives from a real server process (PROTOCOL.md sections 1, 8, 9)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Iterator

import pytest
import websockets
from pvwire_client import wire

from tests.eventually import eventually_async
from tests.server_process import ServerProcess, server_args_for_tests
from tests.server_process import stream_token as token
from tests.stream_client import RawStream


@pytest.fixture
def own_server() -> Iterator[ServerProcess]:
    """A server for this test alone: it is stopped, or its clients are counted."""
    with ServerProcess(*server_args_for_tests()) as proc:
        yield proc


def metric(server: ServerProcess, name: str) -> float:
    m = re.search(rf"^pvwire_{name} (\S+)$", server.metrics(), re.MULTILINE)
    assert m is not None, f"no pvwire_{name} in /metrics"
    return float(m.group(1))


async def closed_with(ws: websockets.ClientConnection, timeout: float = 30.0) -> int:
    """Read everything until the server's close frame; its code (1006 when there was none)."""
    with pytest.raises(websockets.ConnectionClosed) as closed:
        async with asyncio.timeout(timeout):
            while True:
                await ws.recv()
    rcvd = closed.value.rcvd
    return 1006 if rcvd is None else rcvd.code


async def test_client_offering_other_subprotocols_only_is_closed_with_4406(
    server: ServerProcess,
) -> None:
    async with websockets.connect(
        server.ws_url, subprotocols=[websockets.Subprotocol("pvwire.v2")]
    ) as ws:
        # The server selected the offer (so a browser's handshake succeeds) to say why: 4406,
        # after HELLO, first on every connection (PROTOCOL.md section 2.1): its version tells
        # the client what this server speaks.
        assert ws.subprotocol == "pvwire.v2"
        hello = wire.decode_message(await ws.recv(decode=False))
        assert isinstance(hello, wire.Hello) and hello.version == 1
        assert await closed_with(ws) == 4406


async def test_client_offering_no_subprotocol_is_served(server: ServerProcess) -> None:
    async with websockets.connect(server.ws_url) as ws:
        assert ws.subprotocol is None
        assert isinstance(wire.decode_message(await ws.recv(decode=False)), wire.Hello)


async def test_client_offering_v1_among_others_gets_v1(server: ServerProcess) -> None:
    async with websockets.connect(
        server.ws_url, subprotocols=[websockets.Subprotocol(p) for p in ("pvwire.v2", "pvwire.v1")]
    ) as ws:
        assert ws.subprotocol == "pvwire.v1"
        assert isinstance(wire.decode_message(await ws.recv(decode=False)), wire.Hello)


async def test_sigterm_closes_streams_with_4012_draining(own_server: ServerProcess) -> None:
    # The test server's drain has neither delay nor window (tests/server_process.py).
    s = await RawStream.connect(own_server.ws_url)
    await s.attach(token(own_server, ["sim://counter/term?rate=10"]))
    await s.next_data()
    assert own_server.pid is not None
    os.kill(own_server.pid, signal.SIGTERM)
    assert await closed_with(s.ws) == 4012
    # All at once: the clients are told to spread their reconnects over drain_jitter_max_s.
    assert s.ws.close_reason == "reconnect within 1000 ms"


async def test_stalled_client_sees_4008_once_it_reads_again(own_server: ServerProcess) -> None:
    # 1.6 MB per update at 10 Hz; max_queue=1 makes the client library stop reading the socket.
    big = token(own_server, ["sim://waveform/stall?length=200000&rate=10"])
    slow = await RawStream.connect(own_server.ws_url, max_queue=1)
    await slow.send(16, 1, big)
    # The server gave up on it (stall limit 2 s on the test server) and released its session,
    # while the close frame still waits behind the data the client has not read.
    await eventually_async(
        lambda: asyncio.to_thread(lambda: metric(own_server, "clients") == 0),
        "the stalled client released",
        interval=0.1,
    )
    assert await closed_with(slow.ws) == 4008
