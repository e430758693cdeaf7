"""Every HTTP request body bounded, before the application sees it (pure ASGI middleware).

Installed outermost, so nothing inside it (authentication, GraphQL parsing, any route) runs for
a body beyond the bound:
- a `Content-Length` above the bound is answered 413 at once, and not one byte of the body is
  read;
- a body without one (chunked) is counted as the application reads it; the chunk that crosses
  the bound is answered 413 and the application's read fails, so at most the bound plus one
  chunk (the server's read size) is ever held.

The answer closes the connection (`Connection: close`): a client that keeps sending costs the
server nothing more. WebSocket and lifespan scopes pass through (`max_in_bytes` bounds
WebSocket messages).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

__all__ = ["BodyLimit", "BodyTooLarge"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTooLarge(Exception):
    """Raised by `receive` to the application once its body crosses the bound."""


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, setting: str = "max_request_bytes") -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.setting = setting  # named in the answer, so an operator knows what to raise

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self.refuse(send, declared)
            return
        await _Bounded(self, receive, send).run(scope)

    def message(self, size: int | None) -> str:
        what = f"{size:,} bytes" if size is not None else "more than that"
        return (
            f"request body too large: at most {self.max_bytes:,} bytes (setting "
            f"{self.setting}), this one {what}"
        )

    async def refuse(self, send: Send, size: int | None) -> None:
        # GraphQL-shaped, as every other refusal of the control plane (api/graphql_http.py).
        error = {"message": self.message(size), "extensions": {"code": "TOO_LARGE"}}
        body = orjson.dumps({"errors": [error]})
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _Bounded:
    """One request whose body is counted as the application reads it."""

    def __init__(self, limit: BodyLimit, receive: Receive, send: Send) -> None:
        self.limit = limit
        self._receive = receive
        self._send = send
        self.received = 0
        self.started = False  # the application's response has begun
        self.refused = False  # this middleware answered 413: the application's sends are dropped

    async def run(self, scope: Scope) -> None:
        # Answered in `receive` already, or the response had begun: nothing more to say.
        with contextlib.suppress(BodyTooLarge):
            await self.limit.app(scope, self.receive, self.send)

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit.max_bytes:
                if not self.started:
                    self.refused = True
                    await self.limit.refuse(self._send, None)
                raise BodyTooLarge(self.limit.message(None))
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


def _content_length(scope: Scope) -> int | None:
    """The declared length, if any. One that is not a number is the server's to refuse (uvicorn
    answers 400); the count bounds the body in any case."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            if not (text.isascii() and text.isdigit()):
                return None
            digits = text.lstrip("0") or "0"
            return int(digits) if len(digits) <= 18 else 10**18  # int() refuses 4,300 digits
    return None
