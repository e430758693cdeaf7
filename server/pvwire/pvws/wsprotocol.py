"""uvicorn's WebSocket protocol (websockets-sansio) with one addition: complete WebSocket frames
in one transport write.

ASGI sends one WebSocket message per `send`, and uvicorn writes each to the socket at once: one
`send()` system call per message. `/stream` sends one message per tick, but pvws sends one JSON
message per PV update, and that write per message was 51 % of the server's CPU (py-spy, 10 pvws
clients x 200 PVs at 10 Hz). A connection whose scope lists the `pvwire.frames` extension may
send `{"type": "websocket.send", "pvwire.frames": data}`, where `data` is complete, unmasked
server frames (frames.py makes them); they go to the socket as they are, in one write. The
extension's `write` does the same without the ASGI layers between (Starlette's WebSocket and the
middlewares' `send` wrappers, which do nothing with a WebSocket's data) and websockets'
framing; with 500 `/stream` screens what a frame costs is now the write itself (py-spy: ~15 % of
the server, the loopback TCP stack).

The connection keeps its place in the connection table (api/connections.py), counted at accept
by the HTTP protocol that read its upgrade request (api/http_protocol.py), until it closes.
Everything else is uvicorn's own behaviour.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request
from websockets.protocol import State

from ..api.connections import STATE_KEY, Connections, Ticket

__all__ = ["FRAMES", "WebSocketProtocol"]

FRAMES = "pvwire.frames"  # the scope extension and the message key


class WebSocketProtocol(WebSocketsSansIOProtocol):
    ticket: Ticket | None = None
    table: Connections | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        table = self.app_state.get(STATE_KEY)
        if isinstance(table, Connections):
            self.table, self.ticket = table, table.take_over(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ticket is not None and self.table is not None:
            self.table.release(self.ticket)
        super().connection_lost(exc)

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        # The application task was created but has not run yet: it sees the extension.
        scope: Any = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][FRAMES] = {"write": self.write_frames}

    # uvicorn names the message's type only in its private `uvicorn._types`.
    async def send(self, message: Any) -> None:
        frames: Any = message.get(FRAMES) if message["type"] == "websocket.send" else None
        if frames is None:
            await super().send(message)
            return
        await self.write_frames(frames)

    async def write_frames(self, frames: bytes) -> None:
        """Complete server frames to the socket, in one write, once its buffer has room."""
        await self.writable.wait()  # uvicorn's flow control: the transport's buffer is full
        if self.disconnected or self.close_sent or self.conn.state is not State.OPEN:
            raise ClientDisconnected()
        if not self.handshake_complete or self.initial_response is not None:
            raise RuntimeError("pvwire.frames before the WebSocket was accepted")
        self.transport.write(frames)
