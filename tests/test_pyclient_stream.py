"""pvwire_client.Client's stream layer against a scripted fake server (no pvwire server needed).

GraphQL is an httpx MockTransport; the stream is a websockets server on an ephemeral port whose
per-connection behaviour each test scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
from pvwire_client import Client, ProtocolError, StreamClosed, StreamRefused, Update, transport
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests.test_pyclient_transport import accept_key

Script = Callable[[ServerConnection, int], Awaitable[None]]
HELLO = [0, 1, "fake", 20, 15000, 65536]


def pack(obj: Any) -> bytes:
    out = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(out, bytes)
    return out


async def recv(ws: ServerConnection) -> list[Any]:
    data = await ws.recv()
    assert isinstance(data, bytes)
    msg = msgpack.unpackb(data)
    assert isinstance(msg, list)
    return msg


def full(sid: int, value: Any, serial: int) -> list[Any]:
    return [sid, 31, value, serial, 1700000000, 0, 0, 0, "", {"units": "mA"}, 1, ""]


class Fake:
    """A GraphQL mock plus a scripted WebSocket server."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.registrations: list[list[str]] = []
        self.options: list[dict[str, Any]] = []  # the subscribe options of each registration
        self.subprotocols: list[str | None] = []
        self.extensions: list[str | None] = []
        self.authorization: list[str | None] = []  # the header of each GraphQL request
        self.access: dict[str, str] = {}  # the access subscribe grants, by id (default READ)

    def graphql(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert "subscribe" in body["query"]
        self.authorization.append(request.headers.get("Authorization"))
        ids = body["variables"]["ids"]
        self.registrations.append(ids)
        self.options.append(body["variables"]["options"])
        n = len(self.registrations)
        return httpx.Response(
            200,
            json={
                "data": {
                    "subscribe": {
                        "token": f"tok{n}",
                        "expiresAt": 4e9,
                        "streamPath": "/stream",
                        "channels": [
                            {
                                "sid": i,
                                "id": f"sim://{x}",
                                "access": self.access.get(x, "READ"),
                                "metadata": None,
                            }
                            for i, x in enumerate(ids)
                        ],
                    }
                }
            },
        )

    async def handler(self, ws: ServerConnection) -> None:
        self.connections += 1
        self.subprotocols.append(ws.subprotocol)
        self.extensions.append(
            ws.request.headers.get("Sec-WebSocket-Extensions") if ws.request else None
        )
        await self.script(ws, self.connections)


@pytest.fixture
async def fake_factory() -> AsyncIterator[Callable[..., Awaitable[tuple[Fake, Client]]]]:
    servers: list[Any] = []
    clients: list[Client] = []

    async def make(script: Script, **options: Any) -> tuple[Fake, Client]:
        fake = Fake(script)
        server = await serve(fake.handler, "127.0.0.1", 0, subprotocols=["pvwire.v1"])  # type: ignore[list-item]
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        client = Client(
            "http://fake",
            transport=httpx.MockTransport(fake.graphql),
            stream_url=f"ws://127.0.0.1:{port}/stream",
            reconnect_base=0.01,
            reconnect_max=0.05,
            **options,
        )
        clients.append(client)
        return fake, client

    yield make
    for c in clients:
        await c.aclose()
    for s in servers:
        s.close()
        await s.wait_closed()


async def take(it: AsyncIterator[Update], n: int) -> list[Update]:
    out = []
    async with asyncio.timeout(10):
        async for u in it:
            out.append(u)
            if len(out) == n:
                break
    return out


async def test_snapshot_then_data_then_detach(fake_factory: Any) -> None:
    detached = asyncio.Event()

    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        assert attach[0] == 16 and attach[2] == "tok1"
        await ws.send(pack([1, attach[1], 7, ["sim://a", "sim://b"]]))
        await ws.send(pack([2, 1, 7, [full(0, 1.5, 1), full(1, 2, 5)]]))
        await ws.send(pack([6]))
        await ws.send(pack([3, 2, [[7, [[0, 3, 2.5, 4, 1700000001, 5]]]]]))
        detach = await recv(ws)
        assert detach[0] == 17 and detach[2] == 7
        await ws.send(pack([4, detach[1], 7]))
        detached.set()
        await ws.wait_closed()

    fake, client = await fake_factory(script)
    ups = await take(client.monitor(["a", "b"]), 3)
    assert [u.channel.id for u in ups] == ["sim://a", "sim://b", "sim://a"]
    assert ups[0].changed == {"value", "time", "alarm", "metadata", "connection"}
    assert ups[0].channel.format() == "1.5 mA"
    assert ups[2].changed == {"value", "time"} and ups[2].channel.value == 2.5
    assert ups[2].channel.conflated == 2 and ups[0].channel.value == 1.5  # updates are copies
    async with asyncio.timeout(5):
        await detached.wait()
    assert fake.subprotocols == ["pvwire.v1"]  # an older server: the client takes v1
    assert fake.extensions == [None]  # no permessage-deflate offered


async def test_first_update_of_a_cold_channel_carries_its_value(fake_factory: Any) -> None:
    # A cold channel's snapshot is "connecting, no value"; the first update a reader gets must
    # carry the value (or say why there is none), with everything known marked as changed.
    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 1, ["sim://a", "sim://b"]]))
        await ws.send(pack([2, 1, 1, [[0, 16, 0, ""], [1, 16, 0, ""]]]))
        await ws.send(pack([3, 2, [[1, [[0, 8, {"units": "mA"}]]]]]))  # metadata first
        await ws.send(pack([3, 3, [[1, [[0, 23, 1.5, 1, 1700000000, 0, 0, 0, "", 1, ""]]]]]))
        reason = "not found (no IOC answered for 5 s)"
        await ws.send(pack([3, 4, [[1, [[1, 16, 4, reason]]]]]))
        await ws.wait_closed()

    _, client = await fake_factory(script)
    a, b = await take(client.monitor(["a", "b"]), 2)
    assert (a.channel.id, a.channel.value, a.channel.connection) == ("sim://a", 1.5, "CONNECTED")
    assert a.changed == {"value", "time", "alarm", "metadata", "connection"}
    assert a.channel.format() == "1.5 mA"
    assert (b.channel.id, b.channel.value, b.channel.connection) == ("sim://b", None, "NOT_FOUND")
    assert b.changed == {"connection"} and b.channel.reason.startswith("not found (")


async def test_reconnect_on_restart_shows_disconnect_and_resnapshots(fake_factory: Any) -> None:
    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(pack([2, 1, 1, [full(0, n * 10, n * 10)]]))
        if n == 1:
            await ws.close(1012, "restart")
        else:
            await ws.wait_closed()

    fake, client = await fake_factory(script)
    ups = await take(client.monitor("a"), 3)
    assert [(u.channel.value, u.channel.connection) for u in ups] == [
        (10, "CONNECTED"),
        (10, "DISCONNECTED"),
        (20, "CONNECTED"),
    ]
    assert "1012 RESTART" in ups[1].channel.reason
    # Serial 10, then 20 in the new connection's snapshot: a new baseline, not 9 conflated.
    assert ups[2].channel.conflated == 0
    assert fake.connections == 2 and len(fake.registrations) == 1


HISTORY_POINTS = (Path(__file__).parents[1] / "protocol/vectors/history_points.bin").read_bytes()


async def test_backfill_yields_the_past_once_across_a_reconnect(fake_factory: Any) -> None:
    # PROTOCOL.md section 2.8: this server ignores `since` and sends the backfill again; the
    # reader must not see the rows it already had twice. The vector's HISTORY is att 1, sid 0: four
    # rows, the third a gap, the last at 1700000004.0; the snapshots come after them.
    attaches: list[list[Any]] = []

    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        attaches.append(attach)
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(HISTORY_POINTS)
        live = [0, 31, 7.0 * n, n, 1700000004 + n, 0, 0, 0, "", {"units": "mA"}, 1, ""]
        await ws.send(pack([2, 1, 1, [live]]))
        if n == 1:
            await ws.close(1012, "restart")
        else:
            await ws.wait_closed()

    fake, client = await fake_factory(script)
    ups = await take(client.monitor("a", backfill=60), 7)
    assert fake.options == [{"maxRate": 0.0, "mode": "LATEST", "backfill": 60.0}]
    got = [(u.past, u.channel.value, u.channel.connection, u.channel.time) for u in ups]
    assert got == [
        (True, 1.0, "CONNECTED", (1700000000, 0)),
        (True, 2.0, "CONNECTED", (1700000000, 100000000)),
        (True, None, "DISCONNECTED", (1700000003, 500000000)),
        (True, 0.5, "CONNECTED", (1700000004, 0)),
        (False, 7.0, "CONNECTED", (1700000005, 0)),
        (False, 7.0, "DISCONNECTED", (1700000005, 0)),
        # The second attach's HISTORY repeats rows the reader had: none yielded again.
        (False, 14.0, "CONNECTED", (1700000006, 0)),
    ]
    assert all(u.channel.serial is None for u in ups[:4]) and ups[4].channel.serial == 1
    assert ups[1].changed == {"value", "time", "alarm"} and ups[2].changed == {"connection"}
    assert fake.connections == 2
    # The re-attach said what it held (the snapshot's time), so a server sends only newer rows.
    assert len(attaches[0]) == 3
    assert attaches[1][3:] == [[1700000005 * 1_000_000_000]]


async def test_history_reaches_only_a_monitor_that_asked_for_backfill(fake_factory: Any) -> None:
    # A HISTORY the reader did not ask for (here: a server sending it anyway) is no update: a
    # plain monitor's and a batch reader's first item is the snapshot's value.
    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(HISTORY_POINTS)
        await ws.send(pack([2, 1, 1, [full(0, 7.0, 1)]]))
        await ws.wait_closed()

    fake, client = await fake_factory(script)
    [u] = await take(client.monitor("a"), 1)
    assert (u.past, u.channel.value, u.channel.serial) == (False, 7.0, 1)
    batch_fake, client = await fake_factory(script)
    batches = client.monitor_batches("a")
    async with asyncio.timeout(10):
        batch = await anext(batches)
    await batches.aclose()
    assert [(s.value, s.serial) for s in batch.states] == [(7.0, 1)]
    assert fake.options == batch_fake.options == [{"maxRate": 0.0, "mode": "LATEST"}]


async def test_terminal_close_raises(fake_factory: Any) -> None:
    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        await recv(ws)
        await ws.close(4403, "not allowed")

    _, client = await fake_factory(script)
    with pytest.raises(StreamClosed, match="4403 FORBIDDEN") as e:
        await take(client.monitor("a"), 1)
    assert e.value.close_code == 4403


async def test_token_close_codes_end_every_monitor(fake_factory: Any) -> None:
    # Refused tokens are answered per attachment (ERROR); a close names no attachment, so a
    # terminal close code ends every monitor without guessing which one it was about.
    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        await recv(ws)
        await ws.close(4402, "expired")

    fake, client = await fake_factory(script)
    with pytest.raises(StreamClosed, match="4402 TOKEN_EXPIRED"):
        await take(client.monitor("a"), 1)
    assert len(fake.registrations) == 1 and fake.connections == 1


async def test_heartbeat_watchdog_reconnects(fake_factory: Any) -> None:
    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack([0, 1, "fake", 20, 50, 65536]))  # heartbeat 50 ms: watchdog 1.1 s
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(pack([2, 1, 1, [full(0, n, n)]]))
        await ws.wait_closed()  # then silence

    fake, client = await fake_factory(script)
    ups = await take(client.monitor("a"), 3)
    assert [u.channel.connection for u in ups] == ["CONNECTED", "DISCONNECTED", "CONNECTED"]
    assert "4000 HEARTBEAT_TIMEOUT" in ups[1].channel.reason
    assert fake.connections == 2


async def test_a_heartbeat_timeout_is_reported_without_waiting_for_the_close_answer(
    fake_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that stopped sending and reading: the loss shows and the reconnect starts when
    the watchdog fires, not once the unanswered close handshake gives up."""
    monkeypatch.setattr(transport, "CLOSE_TIMEOUT", 600.0)  # longer than take() waits
    released = asyncio.Event()

    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack([0, 1, "fake", 20, 50, 65536]))  # heartbeat 50 ms: watchdog 1.1 s
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(pack([2, 1, 1, [full(0, n, n)]]))
        if n == 1:
            ws.transport.pause_reading()  # the client's Close is never read, never answered
            await released.wait()
            ws.transport.resume_reading()
        await ws.wait_closed()

    _, client = await fake_factory(script)
    try:
        ups = await take(client.monitor("a"), 3)
    finally:
        released.set()
    assert [u.channel.connection for u in ups] == ["CONNECTED", "DISCONNECTED", "CONNECTED"]
    assert "4000 HEARTBEAT_TIMEOUT" in ups[1].channel.reason


async def test_aclose_ends_a_connection_whose_server_never_ends_tcp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server sends Close and keeps TCP open: the client answers and reconnects, and
    aclose() ends that old TCP itself, so a loop closed next (asyncio.run returning) leaks no
    socket. Only the abort timer would end it otherwise, and here that is 600 s away."""
    monkeypatch.setattr(transport, "CLOSE_TIMEOUT", 600.0)
    echoed, ended = asyncio.Event(), asyncio.Event()
    accepted = 0

    async def close_and_keep_tcp(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal accepted
        accepted += 1
        if accepted > 1:
            writer.close()  # the reconnects are refused
            return
        request = await reader.readuntil(b"\r\n\r\n")
        key = re.search(rb"Sec-WebSocket-Key: *(\S+)", request, re.IGNORECASE)
        assert key is not None
        accept = accept_key(key[1])
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: pvwire.v1\r\n\r\n"
        )
        writer.write(b"\x88\x02\x03\xf4")  # Close 1012 RESTART (unmasked: server to client)
        await reader.readexactly(8)  # the client's answer: 2 header, 4 mask and 2 code bytes
        echoed.set()
        with contextlib.suppress(ConnectionError):
            await reader.read()  # until the client ends TCP
        ended.set()
        writer.close()

    async def unused(ws: ServerConnection, n: int) -> None:
        raise AssertionError("the stream goes to the raw server above")

    srv = await asyncio.start_server(close_and_keep_tcp, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        client = Client(
            "http://fake",
            transport=httpx.MockTransport(Fake(unused).graphql),
            stream_url=f"ws://127.0.0.1:{port}/stream",
            reconnect_base=0.01,
            reconnect_max=0.05,
        )

        async def read_to_the_end() -> None:
            async for _ in client.monitor("a"):
                pass

        reading = asyncio.create_task(read_to_the_end())
        await asyncio.wait_for(echoed.wait(), 30)
        assert not ended.is_set()  # the client waits for the server to end TCP (RFC 6455 7.1.1)
        await client.aclose()
        await asyncio.wait_for(ended.wait(), 30)
        await asyncio.wait_for(reading, 30)


async def test_seq_gap_reconnects(fake_factory: Any) -> None:
    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(pack([2, 1, 1, [full(0, n, n)]]))
        if n == 1:
            await ws.send(pack([3, 3, [[1, [[0, 1, 5, 5]]]]]))  # seq 3 after 1
        await ws.wait_closed()

    fake, client = await fake_factory(script)
    ups = await take(client.monitor("a"), 3)
    assert [u.channel.value for u in ups] == [1, 1, 2]
    assert fake.connections == 2


async def test_two_monitors_share_one_websocket(fake_factory: Any) -> None:
    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        seq = 0
        att = 0
        async for data in ws:
            msg = msgpack.unpackb(data)
            if msg[0] == 16:
                att += 1
                ids = fake.registrations[int(msg[2][3:]) - 1]
                await ws.send(pack([1, msg[1], att, [f"sim://{i}" for i in ids]]))
                seq += 1
                await ws.send(pack([2, seq, att, [full(0, att, 1)]]))

    fake, client = await fake_factory(script)
    (u1,) = await take(client.monitor("x"), 1)
    (u2,) = await take(client.monitor("y"), 1)
    assert (u1.channel.id, u1.channel.value, u2.channel.id, u2.channel.value) == (
        "sim://x",
        1,
        "sim://y",
        2,
    )
    assert fake.connections == 1


@pytest.mark.parametrize(
    "bad",
    [pack([3, 2, [[1, [[0, 64]]]]]), "a text message"],  # reserved mask bit; PROTOCOL.md 1
    ids=["reserved-mask-bit", "text"],
)
async def test_malformed_message_closes_with_1002_and_reconnects(
    fake_factory: Any, bad: bytes | str
) -> None:
    closes: list[int | None] = []
    first_closed = asyncio.Event()

    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(pack([2, 1, 1, [full(0, n, n)]]))
        if n == 1:
            await ws.send(bad)
        await ws.wait_closed()
        closes.append(ws.close_code)
        if n == 1:
            first_closed.set()

    fake, client = await fake_factory(script)
    ups = await take(client.monitor("a"), 3)
    assert [(u.channel.value, u.channel.connection) for u in ups] == [
        (1, "CONNECTED"),
        (1, "DISCONNECTED"),
        (2, "CONNECTED"),
    ]
    assert "1002 PROTOCOL_ERROR" in ups[1].channel.reason
    async with asyncio.timeout(10):
        await first_closed.wait()
    assert closes[0] == 1002 and fake.connections == 2


async def test_unanswered_attach_times_out_and_reconnects(fake_factory: Any) -> None:
    closes: list[int | None] = []
    first_closed = asyncio.Event()

    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack([0, 1, "fake", 20, 50, 65536]))
        attach = await recv(ws)
        if n == 1:
            # Heartbeats keep the connection alive; the ATTACH never gets an answer.
            with contextlib.suppress(ConnectionClosed):
                while True:
                    await ws.send(pack([6]))
                    await asyncio.sleep(0.02)
            closes.append(ws.close_code)
            first_closed.set()
            return
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(pack([2, 1, 1, [full(0, 5.0, 1)]]))
        await ws.wait_closed()

    # Long enough that the second connection's answer, on this same loop, always comes in time
    # on a busy machine (at 0.3 s a stall could make a third connection).
    fake, client = await fake_factory(script, request_timeout=2.0)
    (up,) = await take(client.monitor("a"), 1)
    assert up.channel.value == 5.0
    async with asyncio.timeout(10):
        await first_closed.wait()
    assert closes == [4000] and fake.connections == 2


async def test_backoff_restarts_after_a_hello_and_grows_while_refused(fake_factory: Any) -> None:
    # Connections 2-4 are closed before HELLO (1013, as an overloaded server refuses): the
    # backoff grows. Connection 5 reaches HELLO, so the outage after it starts again from 0.
    async def script(ws: ServerConnection, n: int) -> None:
        if n in (2, 3, 4):
            await ws.close(1013, "try again")
            return
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(pack([2, 1, 1, [full(0, n * 10, n * 10)]]))
        if n in (1, 5):
            await ws.close(1012, "restart")
        else:
            await ws.wait_closed()

    client: Client
    _, client = await fake_factory(script)
    attempts: list[int] = []
    backoff = client._backoff

    def recording(attempt: int) -> float:
        attempts.append(attempt)
        return backoff(attempt)

    client._backoff = recording  # type: ignore[method-assign]
    seen = []
    async with asyncio.timeout(30):
        async for u in client.monitor("a"):
            seen.append(u.channel.value)
            if u.channel.value == 60 and u.channel.connected:
                break
    assert attempts == [0, 1, 2, 3, 0]
    assert seen[-1] == 60


async def test_backoff_defaults_are_the_typescript_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.5 s doubling, capped at 5 s (PROTOCOL.md section 8; clients/ts DEFAULT_BACKOFF)."""
    # The whole window: the client's random.uniform returns its upper bound.
    monkeypatch.setattr("pvwire_client.client.random.uniform", lambda low, high: high)
    async with Client("http://127.0.0.1:1") as client:
        assert [client._backoff(a) for a in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


async def test_attached_naming_other_channels_ends_that_monitor_alone(fake_factory: Any) -> None:
    # PROTOCOL.md section 12: values would show under the wrong names; reconnecting would meet
    # the same answer. The monitor fails, its att is detached, the connection stays.
    detached: list[int] = []
    done = asyncio.Event()

    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 4, ["sim://b", "sim://a"]]))  # registered a, b
        await ws.send(pack([2, 1, 4, [full(0, 1.5, 1), full(1, 2.5, 1)]]))
        detach = await recv(ws)
        detached.append(detach[2])
        await ws.send(pack([4, detach[1], 4]))
        done.set()
        await ws.wait_closed()

    fake, client = await fake_factory(script)
    with pytest.raises(ProtocolError, match=r"ATTACHED ids \['sim://b', 'sim://a'\] differ"):
        await take(client.monitor(["a", "b"]), 1)
    async with asyncio.timeout(10):
        await done.wait()
    assert detached == [4] and fake.connections == 1


async def test_error_without_req_is_reported_once(
    fake_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A 4403 with req nil explains the DETACHED after it: the monitor fails with it, and it is
    # not logged as well. Any other code is logged and ends nothing.
    async def script(ws: ServerConnection, n: int) -> None:
        await ws.send(pack(HELLO))
        attach = await recv(ws)
        await ws.send(pack([1, attach[1], 1, ["sim://a"]]))
        await ws.send(pack([2, 1, 1, [full(0, 1.5, 1)]]))
        await ws.send(pack([5, None, 4400, "a message must be an array"]))
        await ws.send(pack([3, 2, [[1, [[0, 1, 2.5, 2]]]]]))
        await ws.send(pack([5, None, 4403, "sim://a: no longer readable"]))
        await ws.send(pack([4, None, 1]))
        await ws.wait_closed()

    _, client = await fake_factory(script)
    seen: list[Any] = []
    with (
        caplog.at_level("WARNING", logger="pvwire_client"),
        pytest.raises(StreamRefused, match="no longer readable"),
    ):
        async with asyncio.timeout(10):
            async for u in client.monitor("a"):
                seen.append(u.channel.value)
    assert seen == [1.5, 2.5]
    errors = [r.getMessage() for r in caplog.records if "stream error" in r.getMessage()]
    assert errors == ["pvwire stream error 4400: a message must be an array"]
