"""The Python client's WebSocket transport (pvwire_client.transport): against the real server, and
against small local `websockets` servers for what the real one does not send on demand
(fragments, pings, text, a dropped socket, TLS)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import ipaddress
import ssl
import tempfile
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgpack
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pvwire_client import wire
from pvwire_client.transport import Connection, ConnectionClosed, HandshakeError, connect
from websockets.asyncio.server import ServerConnection, serve

from tests.eventually import eventually_async
from tests.server_process import ServerProcess


def accept_key(key: bytes) -> bytes:
    """The Sec-WebSocket-Accept a server answers to `key` (RFC 6455 section 4.2.2), computed
    here and not by the client, so that tests of raw servers check the client against the RFC."""
    return base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())


MB = 1 << 20
Handler = Callable[[ServerConnection], Awaitable[None]]


async def _open(url: str, max_size: int = 64 * MB, **kw: Any) -> Connection:
    return await connect(url, subprotocols=["pvwire.v1"], max_size=max_size, **kw)


@asynccontextmanager
async def local_server(handler: Handler, **kw: Any) -> AsyncIterator[str]:
    """A websockets server on an ephemeral port; yields its ws:// (or wss://) URL."""
    async with serve(handler, "127.0.0.1", 0, subprotocols=["pvwire.v1"], **kw) as srv:  # type: ignore[list-item]
        port = next(iter(srv.sockets)).getsockname()[1]
        yield f"{'wss' if 'ssl' in kw else 'ws'}://127.0.0.1:{port}/"


def _token(server: ServerProcess, sid: str) -> str:
    doc = server.graphql(
        "mutation($ids: [String!]!) { subscribe(ids: $ids) { token } }", {"ids": [sid]}
    )
    assert "errors" not in doc, doc
    return str(doc["data"]["subscribe"]["token"])


# --- the real server --------------------------------------------------------------------------


async def test_handshake_selects_the_subprotocol_and_hello_arrives(server: ServerProcess) -> None:
    ws = await _open(server.ws_url)
    assert ws.subprotocol == "pvwire.v1"
    hello = await asyncio.wait_for(ws.recv(), 10)
    assert isinstance(hello, bytearray)  # the server sends HELLO with its 101 answer
    assert isinstance(wire.decode_message(hello), wire.Hello)
    await ws.send(msgpack.packb([18, "n" * 300]))  # PING, masked over a 16-bit length
    pong = wire.decode_message(_binary(await asyncio.wait_for(ws.recv(), 10)))
    assert isinstance(pong, wire.Pong) and pong.nonce == "n" * 300
    await ws.close(1000, "done")
    with pytest.raises(ConnectionClosed) as closed:
        await ws.recv()
    assert closed.value.code == 1000  # the server's echo of our Close


async def test_a_refused_upgrade_names_the_status(server: ServerProcess) -> None:
    with pytest.raises(HandshakeError, match=r"HTTP 4\d\d"):
        await _open(server.ws_url.replace("/stream", "/no-such-path"))


async def test_the_server_closing_gives_its_code(server: ServerProcess) -> None:
    ws = await _open(server.ws_url)
    await ws.recv()
    # Over the server's 1 MiB limit for client messages: a 64-bit length, masked.
    await ws.send(msgpack.packb([16, 1, "x" * 2_000_000]))
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.code == 1009
    with pytest.raises(ConnectionClosed):
        await ws.send(b"\x91\x06")


async def test_a_message_over_max_size_closes_with_1009(server: ServerProcess) -> None:
    ws = await _open(server.ws_url, max_size=10)  # HELLO is larger
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.code == 1009
    await ws.close()


async def test_a_4_megapixel_frame_is_received_once_into_the_array_memory(
    server: ServerProcess,
) -> None:
    """Each frame-sized message is one allocation, in the transport, which the array views:
    tracemalloc's peak while a message arrives exceeds what was held before by no more than the
    messages received (1 MiB of slack is an eighth of one frame, so any second copy fails)."""
    sid = "sim://image?width=2048&height=2048&dtype=uint16&rate=2"
    tracemalloc.start()
    try:
        ws = await _open(server.ws_url)
        await ws.recv()
        await ws.send(msgpack.packb([16, 1, _token(server, sid)]))
        frames = 0
        async with asyncio.timeout(60):
            while frames < 3:
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
                msg = _binary(await ws.recv())
                # With the next message's buffer, allocated whole when its header came: a
                # client behind (on a busy machine) gets the frames back to back.
                received = len(msg) + sum(len(m) for m in ws._queue) + len(ws._msg or b"")
                peak = tracemalloc.get_traced_memory()[1]
                if len(msg) < 2048 * 2048 * 2:
                    continue
                frames += 1
                assert peak - before <= received + MB, (peak - before, received)
                where = tracemalloc.get_object_traceback(msg)
                assert where is not None and where[-1].filename.endswith("transport.py")
                decoded = wire.decode_message(msg)
                assert isinstance(decoded, (wire.Data, wire.Snapshot))
                a = _only_array(decoded)
                assert a.shape == (2048, 2048) and not a.flags.writeable
                base: object = a
                while isinstance(base, np.ndarray):
                    base = base.base
                assert isinstance(base, memoryview) and base.obj is msg
                del msg, decoded, a, base
        await ws.close()
    finally:
        tracemalloc.stop()


def _only_array(msg: wire.Data | wire.Snapshot) -> np.ndarray[Any, Any]:
    entries = msg.entries if isinstance(msg, wire.Snapshot) else msg.groups[0].entries
    arrays = [e.value for e in entries if isinstance(e.value, np.ndarray)]
    assert len(arrays) == 1
    return arrays[0]


def _binary(m: bytearray | str) -> bytearray:
    assert isinstance(m, bytearray), m
    return m


# --- local websockets servers -----------------------------------------------------------------


async def test_fragments_are_assembled_into_one_message() -> None:
    parts = [b"a" * 10, b"b" * 200_000, b"c" * 5, b"d" * 100_000, b""]

    async def handler(ws: ServerConnection) -> None:
        await ws.send(parts)  # one binary message in five frames
        await ws.send([b"x", b"y"])
        await ws.wait_closed()

    async with local_server(handler) as url:
        ws = await _open(url)
        assert _binary(await asyncio.wait_for(ws.recv(), 10)) == b"".join(parts)
        assert _binary(await asyncio.wait_for(ws.recv(), 10)) == b"xy"
        await ws.close()


async def test_pings_are_answered_and_text_arrives_as_str() -> None:
    answered = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        pong = await ws.ping(b"are you there")
        await asyncio.wait_for(pong, 10)
        answered.set()
        await ws.send("a text message")  # the client rejects it (PROTOCOL.md section 1)
        await ws.wait_closed()

    async with local_server(handler) as url:
        ws = await _open(url)
        assert await asyncio.wait_for(ws.recv(), 10) == "a text message"
        assert answered.is_set()
        await ws.close()


async def test_close_codes_both_ways() -> None:
    seen: list[tuple[int | None, str | None]] = []

    async def handler(ws: ServerConnection) -> None:
        first = await ws.recv()
        if first == b"close me":
            await ws.close(4008, "too slow")
        else:
            await ws.wait_closed()
            seen.append((ws.close_code, ws.close_reason))

    async with local_server(handler) as url:
        ws = await _open(url)
        await ws.send(b"close me")
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert (closed.value.code, closed.value.reason) == (4008, "too slow")

        ws = await _open(url)
        await ws.send(b"stay")
        await ws.close(4000, "client says bye")
        await eventually_async(lambda: seen, "the close at the server")
        assert seen == [(4000, "client says bye")]


async def test_a_dropped_socket_is_an_abnormal_closure() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.send(b"before the drop")
        await ws.recv()
        ws.transport.abort()

    async with local_server(handler) as url:
        ws = await _open(url)
        assert _binary(await asyncio.wait_for(ws.recv(), 10)) == b"before the drop"
        await ws.send(b"now")
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.code == 1006
        await ws.close()  # nothing to do, and no error


@pytest.mark.parametrize(
    ("accept_ok", "protocol", "error"),
    [(False, "pvwire.v1", "Sec-WebSocket-Accept"), (True, "other.v9", "subprotocol 'other.v9'")],
)
async def test_a_bad_101_answer_is_refused(accept_ok: bool, protocol: str, error: str) -> None:
    answered = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await refuse(reader, writer)
        finally:
            writer.close()
            answered.set()

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = accept_key(key)
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + b"Sec-WebSocket-Accept: "
            + (accept if accept_ok else b"d3Jvbmc=")
            + b"\r\nSec-WebSocket-Protocol: "
            + protocol.encode()
            + b"\r\n\r\n"
        )
        await writer.drain()
        await reader.read()

    srv = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        with pytest.raises(HandshakeError, match=error):
            await _open(f"ws://127.0.0.1:{port}/stream")
        # The client hung up; the server's side closes before the loop does (no unclosed socket).
        await asyncio.wait_for(answered.wait(), 10)


async def test_wss_carries_a_large_message_into_one_buffer() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/c.pem", "wb") as f:
            f.write(pem + key_pem)
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(f"{d}/c.pem")
    client_ctx = ssl.create_default_context(cadata=pem.decode())
    payload = bytes(range(256)) * 8192  # 2 MiB

    async def handler(ws: ServerConnection) -> None:
        await ws.send(payload)
        await ws.wait_closed()

    async with local_server(handler, ssl=server_ctx) as url:
        ws = await _open(url, ssl=client_ctx)
        assert ws.subprotocol == "pvwire.v1"
        got = await asyncio.wait_for(ws.recv(), 10)
        assert isinstance(got, bytearray) and got == payload
        await ws.close()


async def test_a_server_hanging_up_during_the_handshake_is_a_handshake_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    srv = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        with pytest.raises(HandshakeError, match="closed during handshake"):
            await _open(f"ws://127.0.0.1:{port}/stream")
