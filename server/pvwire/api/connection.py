"""One WebSocket connection's life, the same for both endpoints (`/stream` and `/pvws/pv`).

An endpoint admits the connection (or refuses it with `refuse`), builds its session, and hands
both to `run_connection`, which does the rest: two tasks per connection, a reader feeding the
client's messages to the endpoint and a writer sending what the session queued; the close the
session asks for; the release of the session; the close code counted once. The writer is the only
place that awaits the client, so a client that stops reading blocks only its own writer and the
hub never waits (DESIGN.md section 9: a broadcaster awaiting `send` per client let one stalled
client cut healthy clients from 10 to ~2 frames/s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..core.clients import Client
from ..core.hub import Hub
from ..limits import number
from ..wire.codes import INTERNAL, NORMAL, POLICY, RESTART, TRY_AGAIN

__all__ = [
    "CLOSE_TIMEOUT",
    "SHUTDOWN_CLOSE_TIMEOUT",
    "Message",
    "Wakeup",
    "close_reason",
    "pump",
    "refuse",
    "run_connection",
]

T = TypeVar("T", bytes, str)
Message = Mapping[str, Any]  # an ASGI `websocket.receive` event

# Seconds to deliver a close frame before dropping the connection, for both endpoints. A close
# the session asked for (4008 SLOW above all; both endpoints have the same flow control) waits
# behind the frames the client has not read yet: uvicorn writes it only once the socket's buffer
# drains. Waiting this long lets a client that resumes reading see 4008 instead of 1006 (pvws
# waited 5 s, after which a pvws client saw 1006 and could not tell it was too slow). The session
# is released before the wait, so only the socket is kept meanwhile; uvicorn's keepalive (20 s
# ping + 20 s timeout) ends a client that never resumes with 1011 before this.
CLOSE_TIMEOUT = number("close_timeout_s")
# Seconds for the close frame when the server is stopping: it must not hold the shutdown.
SHUTDOWN_CLOSE_TIMEOUT = number("shutdown_close_timeout_s")


class Wakeup:
    """The session's wake-up callback and what it sets: `wake` for the writer, `closing` when the
    session asked to close (a close decided outside the reader, e.g. 4008 in housekeeping).

    Made before the session, whose constructor calls it (the stream session queues HELLO there),
    and told the session once it exists (`watch`)."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.closing = asyncio.Event()
        self._session: Client | None = None

    def watch(self, session: Client) -> None:
        self._session = session
        self()

    def __call__(self) -> None:
        self.wake.set()
        if self._session is not None and self._session.close_request:
            self.closing.set()


def admission_refusal(hub: Hub, origin: str | None) -> tuple[int, str] | None:
    """Why a WebSocket with `origin` is not admitted (close code and reason), the same for both
    endpoints: the server draining, or an origin not allowed. Browsers always send Origin; a
    client without one is not a browser (Python, Node). Connections per address are counted
    before this, at accept, HTTP and WebSocket together (api/connections.py): one too many never
    gets to the upgrade."""
    settings = hub.settings
    if hub.refusing_connections:
        # Before HELLO, so the client's backoff grows rather than it coming back at once.
        return TRY_AGAIN, "this server is stopping (drain): connect to another one"
    allowed = settings.allowed_origins
    if allowed and origin is not None and origin not in allowed:
        return POLICY, f"origin {origin!r} is not allowed"
    return None


async def refuse(websocket: WebSocket, hub: Hub, code: int, reason: str) -> None:
    """Close a connection the endpoint does not admit, with `code` and `reason`.

    The handshake selects the client's first offered subprotocol: a browser fails a handshake in
    which the server selects none of its offers, and the application then sees 1006 (a reconnect
    code) instead of `code` (1008 and 1013 mean stop, or back off; PROTOCOL.md section 8). A
    client that offers none gets none."""
    offered = list(websocket.scope.get("subprotocols") or [])
    await websocket.accept(subprotocol=offered[0] if offered else None)
    await websocket.close(code, close_reason(reason))
    hub.count_close(code)


def close_reason(text: str) -> str:
    """`text` cut to what a close frame holds, 123 bytes of UTF-8, on a character boundary: a
    longer reason makes the close itself fail (the reasons name what the client sent, an Origin
    or subprotocols, which may be long and hold any character)."""
    return text.encode()[:123].decode(errors="ignore")


async def run_connection(
    websocket: WebSocket,
    hub: Hub,
    session: Client,
    wakeup: Wakeup,
    handle: Callable[[Message], None],
    send: Callable[[T], Awaitable[None]],
    next_item: Callable[[], T | None],
    sent: Callable[[int], None],
    log: logging.Logger,
) -> None:
    """Serve an accepted connection until it ends: `handle` gets each client message, the writer
    sends `next_item()` with `send` whenever `wakeup` fires; returns once the session is released
    and the close is counted."""
    wakeup.watch(session)
    hub.add_session(session)
    reader = asyncio.create_task(_read(websocket, session, handle))
    writer = asyncio.create_task(pump(send, next_item, sent, wakeup.wake))
    closer = asyncio.create_task(wakeup.closing.wait())
    code = NORMAL
    try:
        await asyncio.wait({reader, writer, closer}, return_when=asyncio.FIRST_COMPLETED)
        if session.close_request:
            code, reason = session.close_request
            await _close(websocket, hub, session, (reader, writer), code, reason, CLOSE_TIMEOUT)
        elif failed := _failed(reader, "reader") or _failed(writer, "writer"):
            # A fault in the session's own code on either side (the writer's is the catch-up run
            # by `sent`): that session alone ends, logged once and counted as the tick's are.
            side, exc = failed
            log.error("%s client %s: %s failed", session.endpoint, session.number, side,
                      exc_info=exc)  # fmt: skip
            hub.count_failure("session")
            code = INTERNAL
            await _close(
                websocket, hub, session, (reader, writer), code,
                "internal error; reconnect to resume", CLOSE_TIMEOUT,
            )  # fmt: skip
        elif reader.done():
            code = reader.result()
        else:
            code = 1006  # the writer lost the connection
    except asyncio.CancelledError:
        # The server is stopping. On SIGTERM uvicorn has already closed every WebSocket with 1012
        # (its own shutdown, before the application's tasks are cancelled), so any other
        # cancellation gets the same code, on both endpoints: clients come back, maybe to another
        # replica (pvws used 1001, which says the same to clients but is what proxies send;
        # PROTOCOL.md section 8 keeps 1001 for them).
        code = RESTART
        await _close(
            websocket,
            hub,
            session,
            (reader, writer),
            code,
            "server shutting down",
            SHUTDOWN_CLOSE_TIMEOUT,
        )
        raise
    finally:
        for task in (reader, writer, closer):
            task.cancel()
        hub.remove_session(session)  # idempotent: released already when the server closed
        hub.count_close(code)


async def _close(
    websocket: WebSocket,
    hub: Hub,
    session: Client,
    tasks: tuple[asyncio.Task[Any], ...],
    code: int,
    reason: str,
    timeout: float,
) -> None:
    """Stop reading and writing, release the session, then send the close frame.

    The release comes first: nothing more is queued after the close frame, and the frame may wait
    up to `timeout` behind unread data, while the session's views hold upstream monitors."""
    for task in tasks:
        task.cancel()
    hub.remove_session(session)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(websocket.close(code, reason), timeout)


def _failed(task: asyncio.Task[Any], side: str) -> tuple[str, BaseException] | None:
    """(`side`, the exception) when `task` ended by raising, else None."""
    if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
        return side, exc
    return None


async def _read(websocket: WebSocket, session: Client, handle: Callable[[Message], None]) -> int:
    """Hand client messages to the endpoint; returns the client's close code, or the session's
    when the session asked to close."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return int(message.get("code") or 1005)
        handle(message)
        if session.close_request:
            return session.close_request[0]


async def pump(
    send: Callable[[T], Awaitable[None]],
    next_item: Callable[[], T | None],
    sent: Callable[[int], None],
    wake: asyncio.Event,
) -> None:
    """A connection's writer: send what the session queued whenever it wakes; the only place
    that awaits the client, so a client that stops reading blocks only itself.

    Only `send` may fail because the client went away; a fault in the session's own code
    (`next_item`, or `sent` and the catch-up it runs) raises out of here, for `run_connection`
    to log, count and close with 1011 (it once ended such a connection as 1006, unseen)."""
    while True:
        await wake.wait()
        wake.clear()
        while (item := next_item()) is not None:
            try:
                await send(item)
            except (WebSocketDisconnect, RuntimeError, OSError):
                # The client went away mid-send; the reader sees the disconnect and ends it.
                return
            sent(len(item))
