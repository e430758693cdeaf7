"""The `/stream` WebSocket: admission and the session; all protocol logic lives in `Session`
(wire/session.py), and the connection's life in `run_connection` (connection.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from starlette.websockets import WebSocket

from .. import __version__
from ..access.identity import Authenticator
from ..core.hub import Hub
from ..pvws.frames import binary_frame
from ..pvws.wsprotocol import FRAMES
from ..wire import codec as wire
from ..wire.codes import UNSUPPORTED
from ..wire.session import Session, SessionLimits
from .connection import Message, Wakeup, admission_refusal, close_reason, refuse, run_connection

__all__ = ["ALIGNED_SUBPROTOCOL", "SUBPROTOCOL", "router", "serve_stream"]

log = logging.getLogger("pvwire.stream")

SUBPROTOCOL = "pvwire.v1"
# The same protocol with ndarray data aligned by nil padding in entries arrays (PROTOCOL.md
# section 1): only for clients that say they skip the padding, since a client built before it
# would treat a nil entry as malformed and reconnect over and over.
ALIGNED_SUBPROTOCOL = "pvwire.v1.aligned"


def _limits(hub: Hub) -> SessionLimits:
    s = hub.settings
    return SessionLimits(
        send_budget=s.send_budget,
        stall_timeout=s.stall_timeout_s,
        heartbeat=s.heartbeat_s,
        max_channels=s.max_channels_per_connection,
        max_attachments=s.max_attachments_per_connection,
        waiting_bytes=s.max_in_bytes,
    )


def _hello(hub: Hub) -> bytes:
    s = hub.settings
    return wire.encode_hello(
        f"pvwire/{__version__} {s.instance}",
        round(s.tick_ms),
        round(s.heartbeat_s * 1000),
        s.max_in_bytes,
    )


def router(hub: Hub, authenticator: Authenticator) -> APIRouter:
    """The `/stream` WebSocket route."""
    r = APIRouter()

    @r.websocket("/stream")
    async def stream(websocket: WebSocket) -> None:
        await serve_stream(websocket, hub, authenticator)

    return r


async def serve_stream(websocket: WebSocket, hub: Hub, authenticator: Authenticator) -> None:
    origin = websocket.headers.get("origin")
    peer = websocket.client.host if websocket.client else ""
    address = authenticator.client_address(websocket.headers, peer)
    refused = admission_refusal(hub, origin)
    if refused is not None:
        await refuse(websocket, hub, *refused)
        return
    offered = list(websocket.scope.get("subprotocols") or [])
    aligned = ALIGNED_SUBPROTOCOL in offered
    hello = _hello(hub)
    if offered and not aligned and SUBPROTOCOL not in offered:
        # A browser fails the handshake (1006, no reason) when the server selects none of the
        # subprotocols it offered, so select its first offer, send HELLO (first on every
        # connection, PROTOCOL.md section 2.1: it says which version this server speaks), then
        # say why with 4406. A client offering none (older clients, curl, wscat) is served.
        await websocket.accept(subprotocol=offered[0])
        await websocket.send_bytes(hello)
        await websocket.close(
            UNSUPPORTED, close_reason(f"this server speaks {SUBPROTOCOL}; offered {offered}")
        )
        hub.count_close(UNSUPPORTED)
        return
    await websocket.accept(
        subprotocol=ALIGNED_SUBPROTOCOL if aligned else SUBPROTOCOL if offered else None
    )
    wakeup = Wakeup()
    session = Session(
        hub.client_number(),
        address,
        hub,
        hello,
        _limits(hub),
        wakeup,
        aligned=aligned,
        opener=hub.opener,
    )

    def handle(message: Message) -> None:
        data = message.get("bytes")
        if data is not None:
            session.receive(data)
        elif message.get("text") is not None:
            session.receive_text()

    # Straight to the socket where the server's protocol offers it (pvws/wsprotocol.py).
    write = websocket.scope.get("extensions", {}).get(FRAMES, {}).get("write")
    send = websocket.send_bytes if write is None else _framed(write)
    await run_connection(
        websocket, hub, session, wakeup, handle, send, session.next_frame, session.sent, log
    )


def _framed(write: Callable[[bytes], Awaitable[None]]) -> Callable[[bytes], Awaitable[None]]:
    """Each message as one binary frame through the protocol's `write`."""

    async def send(message: bytes) -> None:
        await write(binary_frame(message))

    return send
