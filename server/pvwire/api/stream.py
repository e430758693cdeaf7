"""The `/stream` WebSocket: a thin pump around `Session` (all protocol logic lives there).

Two tasks per connection: a reader feeding `session.receive`, and a writer sending what the session
queued. The writer is the only place that awaits the client, so a client that stops reading blocks
only its own writer; the hub never waits (DESIGN.md section 9: a broadcaster awaiting `send` per
client let one stalled client cut healthy clients from 10 to ~2 frames/s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.websockets import WebSocket, WebSocketDisconnect

from .. import __version__
from ..access.identity import Authenticator
from ..core.hub import Hub
from ..wire import codec as wire
from ..wire.codes import INTERNAL, NORMAL, POLICY, RESTART, TRY_AGAIN, UNSUPPORTED
from ..wire.session import Session, SessionLimits

__all__ = ["ALIGNED_SUBPROTOCOL", "SUBPROTOCOL", "pump", "serve_stream"]

T = TypeVar("T", bytes, str)

log = logging.getLogger("pvwire.stream")

SUBPROTOCOL = "pvwire.v1"
# The same protocol with ndarray data aligned by nil padding in entries arrays (PROTOCOL.md
# section 1): only for clients that say they skip the padding, since a client built before it
# would treat a nil entry as malformed and reconnect over and over.
ALIGNED_SUBPROTOCOL = "pvwire.v1.aligned"
# Seconds to deliver a close frame before dropping the connection. A close the session asked for
# (4008 SLOW above all) waits behind the frames the client has not read yet: uvicorn writes it only
# once the socket's buffer drains. Waiting this long lets a client that resumes reading see 4008
# instead of 1006; the session is released at once, so only the socket is kept meanwhile (uvicorn's
# keepalive, 20 s ping + 20 s timeout, ends a client that never resumes with 1011 before this).
CLOSE_TIMEOUT = 60.0
SHUTDOWN_CLOSE_TIMEOUT = 1.0


def _limits(hub: Hub) -> SessionLimits:
    s = hub.settings
    return SessionLimits(
        send_budget=s.send_budget,
        stall_timeout=s.stall_timeout_s,
        heartbeat=s.heartbeat_s,
        max_channels=s.max_channels_per_connection,
        max_attachments=s.max_attachments_per_connection,
    )


async def serve_stream(websocket: WebSocket, hub: Hub, authenticator: Authenticator) -> None:
    settings = hub.settings
    origin = websocket.headers.get("origin")
    peer = websocket.client.host if websocket.client else ""
    address = authenticator.client_address(websocket.headers, peer)
    refusal = ""
    if settings.allowed_origins and origin is not None and origin not in settings.allowed_origins:
        # Browsers always send Origin; a client without one is not a browser (Python, Node).
        code, refusal = POLICY, f"origin {origin!r} is not allowed"
    elif hub.connections_from(address) >= settings.max_connections_per_address:
        code = TRY_AGAIN
        refusal = f"{settings.max_connections_per_address} connections from {address} already"
    if refusal:
        await websocket.accept()
        await websocket.close(code, refusal)
        hub.count_close(code)
        return
    offered = list(websocket.scope.get("subprotocols") or [])
    aligned = ALIGNED_SUBPROTOCOL in offered
    if offered and not aligned and SUBPROTOCOL not in offered:
        # A browser fails the handshake (1006, no reason) when the server selects none of the
        # subprotocols it offered, so select its first offer, then say why with 4406. A client
        # offering none (older clients, curl, wscat) is served.
        await websocket.accept(subprotocol=offered[0])
        await websocket.close(
            UNSUPPORTED, f"this server speaks {SUBPROTOCOL}; offered {offered}"[:123]
        )
        hub.count_close(UNSUPPORTED)
        return
    await websocket.accept(
        subprotocol=ALIGNED_SUBPROTOCOL if aligned else SUBPROTOCOL if offered else None
    )

    wake = asyncio.Event()
    closing = asyncio.Event()
    hello = wire.encode_hello(
        f"pvwire/{__version__} {settings.instance}",
        round(settings.tick_ms),
        round(settings.heartbeat_s * 1000),
        settings.max_in_bytes,
    )

    created: list[Session] = []  # the session calls on_wake from its constructor (HELLO)

    def on_wake() -> None:
        wake.set()
        if created and created[0].close_request:
            closing.set()

    session = Session(
        hub.client_number(), address, hub, hello, _limits(hub), on_wake, aligned=aligned
    )
    created.append(session)
    hub.add_session(session)
    reader = asyncio.create_task(_read(websocket, session))
    writer = asyncio.create_task(_write(websocket, session, wake))
    closer = asyncio.create_task(closing.wait())
    code = NORMAL
    try:
        await asyncio.wait({reader, writer, closer}, return_when=asyncio.FIRST_COMPLETED)
        if session.close_request:
            code, reason = session.close_request
            writer.cancel()
            reader.cancel()
            # Nothing more is queued after the close frame: release the attachments now rather
            # than after the close frame got through (CLOSE_TIMEOUT).
            hub.remove_session(session)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(websocket.close(code, reason), CLOSE_TIMEOUT)
        elif reader.done() and (exc := reader.exception()) is not None:
            log.exception("stream reader failed", exc_info=exc)
            code = INTERNAL
            with contextlib.suppress(Exception):
                await asyncio.wait_for(websocket.close(INTERNAL, "internal error"), CLOSE_TIMEOUT)
        elif reader.done():
            code = reader.result()
        else:
            code = 1006  # the writer lost the connection
    except asyncio.CancelledError:
        # Server shutting down. On SIGTERM uvicorn has already closed every WebSocket with 1012
        # (its own shutdown, before the application's tasks are cancelled); this covers other
        # cancellations with the same code, so clients come back (maybe to another replica).
        code = RESTART
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                websocket.close(RESTART, "server shutting down"), SHUTDOWN_CLOSE_TIMEOUT
            )
        raise
    finally:
        for task in (reader, writer, closer):
            task.cancel()
        hub.remove_session(session)
        hub.count_close(code)


async def _read(websocket: WebSocket, session: Session) -> int:
    """Feed client messages to the session; returns the client's close code."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return int(message.get("code") or 1005)
        data = message.get("bytes")
        if data is not None:
            session.receive(data)
        elif message.get("text") is not None:
            session.receive_text()
        if session.close_request:
            return session.close_request[0]


async def _write(websocket: WebSocket, session: Session, wake: asyncio.Event) -> None:
    await pump(websocket.send_bytes, session.next_frame, session.sent, wake)


async def pump(
    send: Callable[[T], Awaitable[None]],
    next_item: Callable[[], T | None],
    sent: Callable[[int], None],
    wake: asyncio.Event,
) -> None:
    """A connection's writer (both endpoints): send what the session queued whenever it wakes;
    the only place that awaits the client, so a client that stops reading blocks only itself."""
    try:
        while True:
            await wake.wait()
            wake.clear()
            while (item := next_item()) is not None:
                await send(item)
                sent(len(item))
    except (WebSocketDisconnect, RuntimeError, OSError):
        # The client went away mid-send; the reader sees the disconnect and ends the session.
        return
