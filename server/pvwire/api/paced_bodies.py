"""HTTP response bodies handed to the server a piece at a time over TLS (pure ASGI middleware),
so that the server's flow control sees what waits unsent.

uvicorn writes a body message into its transport at once, whatever its size. Over plain TCP
what the socket does not take waits in that transport, which pauses its writer, and the write
deadline (api/http_protocol.py) drops a connection whose answer makes no progress. Over TLS,
uvloop encrypts a body given whole and hands all of it to the TCP transport beneath before any
of it waits: the TLS transport then holds nothing unsent, never pauses its writer, and the
deadline never started for an answer nobody read (three 20 MB answers: +138 MB, for good). In
pieces of `PIECE_BYTES`, the pieces after the socket filled wait in the TLS transport, which
pauses its writer at its high-water mark (512 KiB); uvicorn then awaits room before each piece,
and the deadline sees the bytes waiting (the same three: dropped after 10 s).

Only `https` scopes (the server's own TLS; behind a TLS-terminating proxy the scheme is
`http`), and only bodies longer than a piece, are split; a body's bytes and its `more_body`
come out as they went in. Plain HTTP keeps its one write: a client that half-closes its end
after its request still gets all of an answer written before the server read that end.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["PIECE_BYTES", "PacedBodies"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PIECE_BYTES = 64 * 1024  # uvloop's high-water mark of a TCP transport


class PacedBodies:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def paced(message: Message) -> None:
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if len(body) <= PIECE_BYTES:
                await send(message)
                return
            more = bool(message.get("more_body", False))
            for at in range(0, len(body), PIECE_BYTES):
                piece = body[at : at + PIECE_BYTES]
                last = at + PIECE_BYTES >= len(body)
                await send({"type": "http.response.body", "body": piece,
                            "more_body": more or not last})  # fmt: skip

        await self.app(scope, receive, paced)
