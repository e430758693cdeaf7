"""The data plane over a real WebSocket: a real server process, real IOC and sim channels."""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest
import websockets
from pvwire import limits
from pvwire.wire.tokens import TokenSigner
from pvwire_client import closecodes, wire

from tests.eventually import eventually_async
from tests.server_process import TEST_TOKEN_KEY, ServerProcess
from tests.server_process import stream_token as token
from tests.stream_client import RawStream
from tests.test_metrics import samples


async def test_snapshot_then_deltas_from_a_real_ioc(server: ServerProcess) -> None:
    s = await RawStream.connect(server.ws_url)
    attached, snapshot = await s.attach(token(server, ["ca://PVW:COUNTER", "ca://PVW:AO"]))
    assert attached.ids == ("ca://PVW:COUNTER", "ca://PVW:AO")
    assert snapshot.seq == 1 and snapshot.att == attached.att
    serials: list[int] = []
    seqs = [snapshot.seq]
    while len(serials) < 5:
        data = await s.next_data()
        seqs.append(data.seq)
        for e in data.groups[0].entries:
            if e.sid == 0 and e.serial is not None:
                serials.append(e.serial)
    assert seqs == list(range(1, len(seqs) + 1))
    assert serials == sorted(serials) and len(set(serials)) == len(serials)
    await s.close()


async def test_two_clients_share_one_upstream_monitor(server: ServerProcess) -> None:
    ids = ["ca://PVW:COUNTER"]
    a = await RawStream.connect(server.ws_url)
    b = await RawStream.connect(server.ws_url)
    await a.attach(token(server, ids))
    await b.attach(token(server, ids))
    got: dict[str, list[tuple[int, float]]] = {"a": [], "b": []}
    for name, s in (("a", a), ("b", b)):
        while len(got[name]) < 4:
            data = await s.next_data()
            got[name] += [(e.serial, e.value) for e in data.groups[0].entries if e.serial]
    # Same serials carry the same values for both: one upstream monitor feeds both.
    common = set(dict(got["a"])) & set(dict(got["b"]))
    assert common and all(dict(got["a"])[k] == dict(got["b"])[k] for k in common)
    info = server.graphql("query { server { channels { id subscribers } } }")
    counter = [c for c in info["data"]["server"]["channels"] if c["id"] == "ca://PVW:COUNTER"]
    assert len(counter) == 1 and counter[0]["subscribers"] >= 2
    await a.close()
    await b.close()


async def test_arrays_and_enums_arrive_typed(server: ServerProcess) -> None:
    s = await RawStream.connect(server.ws_url)
    _, snap = await s.attach(
        token(server, ["sim://waveform/t1?length=500&rate=10", "ca://PVW:MBBO"])
    )
    # A snapshot may come before the upstream monitors connected: merge until both have values.
    latest: dict[int, wire.Entry] = {}
    metadata: dict[int, dict[str, object]] = {}
    entries = list(snap.entries)
    while True:
        for e in entries:
            if e.value is not None:
                latest[e.sid] = e
            if e.metadata is not None:
                metadata[e.sid] = e.metadata
        if len(latest) == 2 and 1 in metadata:
            break
        entries = list((await s.next_data()).groups[0].entries)
    wf, mbbo = latest[0], latest[1]
    assert wf.value.dtype.str == "<f8" and wf.value.shape == (500,)
    assert isinstance(mbbo.value, int) and metadata[1]["choices"]
    await s.close()


async def test_slow_client_is_closed_with_4008_and_does_not_delay_others(
    server: ServerProcess,
) -> None:
    big = token(server, ["sim://waveform/slow?length=200000&rate=10"])  # 1.6 MB per update
    fast_ids = ["sim://counter/fast?rate=10"]
    # max_queue=1: the client library stops reading the socket once one message is buffered.
    slow = await RawStream.connect(server.ws_url, max_queue=1)
    fast = await RawStream.connect(server.ws_url)
    await slow.send(16, 1, big)
    await fast.attach(token(server, fast_ids))
    connected = await asyncio.to_thread(metric, server, "pvwire_clients")
    # The fast client reads on until the server has released the slow one, 2 s or more after
    # its queue stopped moving (the test server's stall limit; the close frame itself waits
    # behind the unread data). A tick that waited for the slow client would send the fast one
    # nothing meanwhile; one that does not, ~20 frames of its 10 Hz counter. Counted by
    # frames, not by time: a busy machine only makes it longer.
    frames = 0
    async with asyncio.timeout(120):
        while await asyncio.to_thread(metric, server, "pvwire_clients") >= connected:
            await fast.next_data(timeout=30)
            frames += 1
    assert frames >= 5, frames
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await slow.ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4008
    await fast.close()


async def test_bad_token_fails_only_its_attachment(server: ServerProcess) -> None:
    s = await RawStream.connect(server.ws_url)
    await s.send(16, 1, "pvw1.cli.e30.not-a-signature")
    err = await s.recv()
    assert isinstance(err, wire.Error) and (err.req, err.code) == (1, 4401)
    attached, _ = await s.attach(token(server, ["ca://PVW:AO"]))  # the connection goes on
    assert attached.ids == ("ca://PVW:AO",)
    await s.close()


async def test_expired_token_gets_4402(server: ServerProcess) -> None:
    signer = TokenSigner({"cli": TEST_TOKEN_KEY.encode()}, "cli", ttl=1, clock=lambda: 1000.0)
    s = await RawStream.connect(server.ws_url)
    await s.send(16, 1, signer.issue(["ca://PVW:AO"]).token)
    err = await s.recv()
    assert isinstance(err, wire.Error) and (err.req, err.code) == (1, 4402)
    await s.close()


async def test_malformed_frames_get_errors_and_the_connection_survives(
    server: ServerProcess,
) -> None:
    s = await RawStream.connect(server.ws_url)
    await s.ws.send(b"\xc1\xc1")
    err = await s.recv()
    assert isinstance(err, wire.Error) and err.code == 4400 and "MessagePack" in err.message
    await s.ws.send("a text frame")
    err = await s.recv()
    assert isinstance(err, wire.Error) and err.code == 4400 and "binary" in err.message
    await s.send(17, 5, 99)
    err = await s.recv()
    assert isinstance(err, wire.Error) and (err.req, err.code) == (5, 4404)
    await s.send(18, "nonce")
    pong = await s.recv()
    assert isinstance(pong, wire.Pong) and pong.nonce == "nonce"
    await s.attach(token(server, ["ca://PVW:AO"]))  # still a working connection
    await s.close()


def metric(server: ServerProcess, name: str, labels: str = "") -> int:
    """A sample of the server's /metrics, e.g. ("pvwire_disconnects_total", 'code="1009"')."""
    return int(samples(server.metrics(), name).get(labels, "0"))


def closes_1009(server: ServerProcess) -> int:
    return metric(server, "pvwire_disconnects_total", 'code="1009"')


async def test_oversized_message_closes_with_1009(server: ServerProcess) -> None:
    before = closes_1009(server)
    s = await RawStream.connect(server.ws_url)
    with pytest.raises(websockets.ConnectionClosed) as closed:
        # The server may close before the 2 MB are sent (it did on a busy machine): the send
        # then raises with the close frame already received.
        await s.ws.send(msgpack.packb([16, 1, "x" * 2_000_000]))
        await s.recv()
    # Most of the message is unread when the server closes, so its kernel answers with a reset,
    # which can overtake the close frame: then the code is only on the server's side.
    if closed.value.rcvd is not None:
        assert closed.value.rcvd.code == 1009
    await eventually_async(lambda: closes_1009(server) == before + 1, timeout=30)
    other = await RawStream.connect(server.ws_url)  # the server is fine
    await other.attach(token(server, ["ca://PVW:AO"]))
    await other.close()


async def test_a_text_frame_of_invalid_utf8_closes_with_1007_a_terminal_code(
    server: ServerProcess,
) -> None:
    """RFC 6455 section 8.1: the WebSocket layer (uvicorn) fails a text frame that is not UTF-8
    with 1007 before the application sees it, so no ERROR 4400 can answer it. PROTOCOL.md lists
    1007 as terminal: the client that sent it would send it again."""
    s = await RawStream.connect(server.ws_url)
    await s.ws.send(b"\xc3\x28", text=True)  # a TEXT frame whose payload is not UTF-8
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await s.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    assert closecodes.name(1007) == "INVALID_DATA" and not closecodes.is_reconnect(1007)
    other = await RawStream.connect(server.ws_url)  # the server is fine
    await other.attach(token(server, ["ca://PVW:AO"]))
    await other.close()


async def test_detach_stops_the_stream(server: ServerProcess) -> None:
    s = await RawStream.connect(server.ws_url)
    attached, _ = await s.attach(token(server, ["sim://counter/d?rate=20"]))
    await s.next_data()
    await s.send(17, 9, attached.att)
    while True:
        msg = await s.recv()
        if isinstance(msg, wire.Detached):
            assert (msg.req, msg.att) == (9, attached.att)
            break
    with pytest.raises(asyncio.TimeoutError):
        await s.next_data(timeout=0.5)
    await s.close()


async def test_all_mode_over_the_wire_has_no_gaps(server: ServerProcess) -> None:
    s = await RawStream.connect(server.ws_url)
    await s.attach(token(server, ["sim://counter/all?rate=50"], mode="ALL"))
    serials: list[int] = []
    while len(serials) < 40:
        data = await s.next_data()
        serials += [e.serial for e in data.groups[0].entries if e.serial is not None]
    assert serials == list(range(serials[0], serials[0] + len(serials)))
    await s.close()


async def test_max_rate_throttles_a_subscription(server: ServerProcess) -> None:
    s = await RawStream.connect(server.ws_url)
    start = time.monotonic()  # before the attach: frames read late are counted in its time
    await s.attach(token(server, ["sim://counter/mr?rate=50"], maxRate=5))
    frames = 0
    conflated = 0
    last = None
    while time.monotonic() - start < 2.0:
        data = await s.next_data()
        frames += 1
        for e in data.groups[0].entries:
            if e.serial is not None:
                if last is not None:
                    conflated += e.serial - last - 1
                last = e.serial
    elapsed = time.monotonic() - start
    assert frames <= 5 * elapsed + 2, (frames, elapsed)  # 5 Hz, plus the first one and a tick
    assert conflated > 0
    await s.close()


async def test_per_message_deflate_is_refused(server: ServerProcess) -> None:
    # Browsers offer deflate; it cut 64 KB frames from 13,500/s to 623/s (DESIGN.md section 9).
    ws = await websockets.connect(  # offers deflate
        server.ws_url, subprotocols=[websockets.Subprotocol("pvwire.v1")]
    )
    assert ws.response is not None
    assert "Sec-WebSocket-Extensions" not in ws.response.headers
    assert ws.subprotocol == "pvwire.v1"
    await ws.close()


async def test_a_subscription_of_10000_channels_can_be_attached(server: ServerProcess) -> None:
    ids = [f"sim://counter/big{i}?rate=1" for i in range(10_000)]
    t = token(server, ids)
    assert len(t) < 200_000  # compressed: ids share long prefixes
    s = await RawStream.connect(server.ws_url)
    attached, snapshot = await s.attach(t)
    assert len(attached.ids) == 10_000 and len(snapshot.entries) == 10_000
    await s.close()


async def test_the_attachment_limit_is_the_table_s(server: ServerProcess) -> None:
    """The 1,001st ATTACH on one connection is refused with 4413, as section 11 says."""
    t = token(server, ["sim://counter"])
    s = await RawStream.connect(server.ws_url)
    try:
        most = limits.integer("max_attachments_per_connection")
        for req in range(1, most + 2):
            await s.send(16, req, t)
        answers = 0
        while answers < most + 1:
            msg = await s.recv(60)
            if isinstance(msg, wire.Attached | wire.Error):
                answers += 1
        assert isinstance(msg, wire.Error), msg
        assert (msg.req, msg.code) == (most + 1, 4413)
    finally:
        await s.close()
