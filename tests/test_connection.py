"""`api/connection.py`'s lifecycle, the same for both endpoints, in memory: the real endpoints,
sessions and hub, with the socket replaced by a double (the server process cannot be made to
cancel a connection, or to hold a close frame, on cue).

The end-to-end side (real server, real sockets) is in tests/test_connection_lifecycle.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, cast

import msgpack
import pytest
from pvwire.access.identity import Authenticator
from pvwire.api.connection import refuse
from pvwire.api.stream import serve_stream
from pvwire.config import Settings
from pvwire.core.hub import Hub
from pvwire.core.view import View
from pvwire.pvws.endpoint import PvwsEndpoint
from pvwire.wire.codec import Entries
from pvwire.wire.session import Session
from pvwire.wire.tokens import TokenSigner
from starlette.websockets import WebSocket

from tests.eventually import eventually_async
from tests.hub_doubles import KEYS, FakeBackend

Serve = Callable[[Hub, WebSocket], Coroutine[Any, Any, None]]


class FakeSocket:
    """What the endpoints use of starlette's WebSocket. `close` waits for `frame_out` when
    `held`: a close frame stuck behind data the client has not read."""

    def __init__(self, held: bool = False) -> None:
        self.scope: dict[str, Any] = {"subprotocols": []}
        self.headers: dict[str, str] = {}
        self.client = None
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[bytes | str] = []
        self.closes: list[tuple[int, str]] = []
        self.held = held
        self.frame_out = asyncio.Event()
        self.accepted: list[str | None] = []

    async def accept(self, subprotocol: str | None = None) -> None:
        self.accepted.append(subprotocol)

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)

    async def send_text(self, text: str) -> None:
        self.sent.append(text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closes.append((code, reason))
        if self.held:
            await self.frame_out.wait()


async def stream(hub: Hub, ws: WebSocket) -> None:
    await serve_stream(ws, hub, Authenticator())


async def pvws(hub: Hub, ws: WebSocket) -> None:
    await PvwsEndpoint(hub, Authenticator()).serve(ws)


ENDPOINTS = [pytest.param(stream, id="stream"), pytest.param(pvws, id="pvws")]


async def connected(hub: Hub, serve: Serve, ws: FakeSocket) -> asyncio.Task[None]:
    """`serve` running on `ws`, returned once its session is in the hub."""
    task = asyncio.create_task(serve(hub, cast(WebSocket, ws)))
    await eventually_async(lambda: len(hub.sessions) == 1)
    return task


@pytest.mark.parametrize("serve", ENDPOINTS)
async def test_a_cancelled_connection_closes_with_1012(hub: Hub, serve: Serve) -> None:
    ws = FakeSocket()
    task = await connected(hub, serve, ws)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # 1012 on both endpoints, as uvicorn's own shutdown sends (pvws sent 1001 here).
    assert ws.closes == [(1012, "server shutting down")]
    assert not hub.sessions
    assert hub.snapshot().closes_by_code == {1012: 1}


@pytest.mark.parametrize("serve", ENDPOINTS)
async def test_the_session_is_released_before_its_close_frame_gets_out(
    hub: Hub, serve: Serve
) -> None:
    ws = FakeSocket(held=True)
    task = await connected(hub, serve, ws)
    (session,) = hub.sessions
    session.request_close(4008, "too slow")
    await eventually_async(lambda: bool(ws.closes))
    # The close frame waits behind unread data (up to a minute); the session, its views and their
    # upstream monitors are let go already.
    assert ws.closes == [(4008, "too slow")] and not hub.sessions
    ws.frame_out.set()
    await asyncio.wait_for(task, 30)
    assert hub.snapshot().closes_by_code == {4008: 1}


@pytest.mark.parametrize("serve", ENDPOINTS)
async def test_a_client_close_releases_the_session_and_counts_its_code(
    hub: Hub, serve: Serve
) -> None:
    ws = FakeSocket()
    task = await connected(hub, serve, ws)
    await ws.incoming.put({"type": "websocket.disconnect", "code": 4000})
    await asyncio.wait_for(task, 30)
    assert not hub.sessions and not ws.closes
    assert hub.snapshot().closes_by_code == {4000: 1}


async def test_a_refusal_selects_the_first_offer_and_its_reason_fits_a_close_frame(
    hub: Hub,
) -> None:
    ws = FakeSocket()
    ws.scope["subprotocols"] = ["pvwire.v1.aligned", "pvwire.v1"]
    await refuse(cast(WebSocket, ws), hub, 1008, "origin 'https://\u00e9" + "x" * 200)
    assert ws.accepted == ["pvwire.v1.aligned"]
    ((code, reason),) = ws.closes
    # 123 bytes of UTF-8 at most (a longer reason makes the close fail); whole characters.
    assert (
        code == 1008 and len(reason.encode()) == 123 and reason.startswith("origin 'https://\u00e9")
    )
    assert hub.snapshot().closes_by_code == {1008: 1}


class GatedSocket(FakeSocket):
    """A socket whose sends wait for `gate`: a client that has stopped reading, for now."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def send_bytes(self, data: bytes) -> None:
        await self.gate.wait()
        self.sent.append(data)


async def test_a_fault_in_the_writers_catch_up_is_logged_counted_and_closed_with_1011(
    backend: FakeBackend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A budget of 32 bytes: over HELLO (28) but under HELLO, ATTACHED and SNAPSHOT, so the
    # session is behind from its first tick and catches up once the writer has sent it all.
    settings = Settings(default_scheme="fake", linger_s=0.0, tick_ms=20, send_budget=32)
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    hub.start()
    try:
        ws = GatedSocket()
        task = await connected(hub, stream, ws)
        token = hub.signer.issue(["fake://a"]).token
        await ws.incoming.put({"type": "websocket.receive", "bytes": msgpack.packb([16, 1, token])})
        await eventually_async(lambda: "a" in backend.sinks)
        backend.update("a", 2.0)
        hub.ticker.tick()  # merged, not queued: the session is behind

        def fault(self: View, masks: dict[int, int]) -> Entries:
            raise ValueError("injected fault in the catch-up")

        monkeypatch.setattr(View, "entries_for", fault)
        with caplog.at_level(logging.ERROR, logger="pvwire.stream"):
            ws.gate.set()  # the client reads again: the writer drains and runs the catch-up
            await asyncio.wait_for(task, 30)
        # Not 1006 with no log line and no count, as it once was.
        assert ws.closes == [(1011, "internal error; reconnect to resume")]
        assert not hub.sessions
        snapshot = hub.snapshot()
        assert snapshot.failures.get("session") == 1
        assert snapshot.closes_by_code == {1011: 1}
        logged = [r for r in caplog.records if "writer failed" in r.getMessage()]
        assert len(logged) == 1 and "injected fault" in str(logged[0].exc_info)
    finally:
        await hub.stop()


async def test_a_fault_in_the_reader_is_logged_counted_and_closed_with_1011(
    hub: Hub, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fault(self: Session, data: bytes) -> None:
        raise ValueError("injected fault in receive")

    monkeypatch.setattr(Session, "receive", fault)
    ws = FakeSocket()
    task = await connected(hub, stream, ws)
    with caplog.at_level(logging.ERROR, logger="pvwire.stream"):
        await ws.incoming.put({"type": "websocket.receive", "bytes": b"\x91\x12"})
        await asyncio.wait_for(task, 30)
    assert ws.closes == [(1011, "internal error; reconnect to resume")]
    snapshot = hub.snapshot()
    assert snapshot.failures.get("session") == 1 and snapshot.closes_by_code == {1011: 1}
    assert len([r for r in caplog.records if "reader failed" in r.getMessage()]) == 1
