"""The pvws-compatible endpoint: `/pvws/pv` (WebSocket, JSON) and pvws's inspection URLs.

A thin pump around `wire/pvws.py`'s `PvwsSession`, as `stream.py` is around `Session`: a reader
feeds client messages in and carries out writes and pings, a writer sends what the session queued
(the only place that awaits the client). Each PV is an attachment of a one-channel view from the
hub, so `/stream` and `/pvws/pv` clients share one upstream monitor and one encoding per tick.

`/pvws/info`, `/pvws/summary`, `/pvws/socket[/ID]` (GET, DELETE) and `/pvws/pool` answer with
pvws's field names, for administrators only (they show who is connected from where).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from datetime import datetime
from typing import Any, cast

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from ..access.identity import Authenticator, AuthError, Identity
from ..core.clients import Client
from ..core.hub import Hub
from ..core.view import View
from ..errors import PvwireError
from ..wire.codes import GOING_AWAY, INTERNAL, NORMAL, POLICY, TRY_AGAIN
from ..wire.pvws import Opened, Ping, PvSource, PvwsEncoder, PvwsRefused, PvwsSession, Write
from ..wire.session import AttachRefused, SessionLimits
from ..wire.tokens import Claims
from .stream import pump

__all__ = ["PvwsEndpoint", "throttle_rates"]

log = logging.getLogger("pvwire.pvws")

CLOSE_TIMEOUT = 5.0
PUT_TIMEOUT = 5.0


def throttle_rates(env: dict[str, str] | None = None) -> tuple[float, float]:
    """pvws's PV_THROTTLE_MS / PV_ARRAY_THROTTLE_MS as maxRate in Hz (0: every tick).

    pvws throttles to 1 s and 10 s by default because it could not do better; pvwire sends every
    change per tick unless a site sets these.
    """
    env = dict(os.environ) if env is None else env

    def rate(name: str) -> float:
        raw = env.get(name, "").strip()
        if not raw:
            return 0.0
        ms = float(raw)
        return 1000.0 / ms if ms > 0 else 0.0

    scalar = rate("PV_THROTTLE_MS")
    array = rate("PV_ARRAY_THROTTLE_MS") if env.get("PV_ARRAY_THROTTLE_MS") else scalar
    return scalar, array


class _Host:
    """What one pvws connection asks of the hub: open and close one-PV views for its identity."""

    def __init__(self, hub: Hub, identity: Identity, rates: tuple[float, float]) -> None:
        self._hub = hub
        self._identity = identity
        self._rates = rates

    def open(self, name: str, session: PvwsSession, att: int, array: bool) -> Opened:
        hub, who = self._hub, self._identity
        try:
            canonical = hub.resolve(name)[0]
        except PvwireError as exc:
            raise PvwsRefused(str(exc)) from None
        now = int(time.time())
        claims = Claims(
            (canonical,),
            "LATEST",
            self._rates[1] if array else self._rates[0],
            now,
            now,
            who.user,
            tuple(sorted(who.groups)),
            who.source,
            who.address,
        )
        try:
            view = hub.open_view(claims, cast(Client, session), att)
        except AttachRefused as exc:
            raise PvwsRefused(str(exc)) from None
        may_write = hub.control.access(who, canonical).name == "WRITE"
        return Opened(cast(View, view), claims, may_write)

    def close(self, view: PvSource, session: PvwsSession, att: int) -> None:
        self._hub.close_view(cast(View, view), cast(Client, session), att)


class PvwsEndpoint:
    def __init__(self, hub: Hub, authenticator: Authenticator) -> None:
        self.hub = hub
        self.authenticator = authenticator
        self.encoder = PvwsEncoder()
        self.rates = throttle_rates()
        self.sessions: dict[str, PvwsSession] = {}
        self.started = time.time()
        self._ping_unsupported_logged = False
        self._writes: set[asyncio.Task[None]] = set()

    # --- the WebSocket ------------------------------------------------------------------------

    async def serve(self, websocket: WebSocket) -> None:
        hub, settings = self.hub, self.hub.settings
        origin = websocket.headers.get("origin")
        peer = websocket.client.host if websocket.client else ""
        address = self.authenticator.client_address(websocket.headers, peer)
        refusal, code = "", POLICY
        identity = Identity("", address=address)
        try:
            identity = self.authenticator.identify(websocket.headers, peer, "pvws")
        except AuthError as exc:
            refusal = str(exc)
        allowed = settings.allowed_origins
        if allowed and origin is not None and origin not in allowed:
            refusal = f"origin {origin!r} is not allowed"
        elif hub.connections_from(address) >= settings.max_connections_per_address:
            code = TRY_AGAIN
            refusal = f"{settings.max_connections_per_address} connections from {address} already"
        if refusal:
            await websocket.accept()
            await websocket.close(code, refusal)
            hub.count_close(code)
            return
        await websocket.accept()

        wake = asyncio.Event()
        closing = asyncio.Event()
        created: list[PvwsSession] = []

        def on_wake() -> None:
            wake.set()
            if created and created[0].close_request:
                closing.set()

        limits = SessionLimits(
            send_budget=settings.send_budget, stall_timeout=settings.stall_timeout_s
        )
        session = PvwsSession(
            self.hub.client_number(),
            address,
            _Host(hub, identity, self.rates),
            self.encoder,
            limits,
            on_wake,
            self.rates,
        )
        created.append(session)
        self.sessions[session.id] = session
        hub.add_session(cast(Client, session))
        reader = asyncio.create_task(self._read(websocket, session, identity))
        writer = asyncio.create_task(_write(websocket, session, wake))
        closer = asyncio.create_task(closing.wait())
        code = NORMAL
        try:
            await asyncio.wait({reader, writer, closer}, return_when=asyncio.FIRST_COMPLETED)
            if session.close_request:
                code, reason = session.close_request
                writer.cancel()
                reader.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(websocket.close(code, reason), CLOSE_TIMEOUT)
            elif reader.done() and reader.exception() is not None:
                log.error("pvws reader failed", exc_info=reader.exception())
                code = INTERNAL
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(websocket.close(INTERNAL, "internal error"), 1.0)
            elif reader.done():
                code = reader.result()
            else:
                code = 1006
        except asyncio.CancelledError:
            code = GOING_AWAY
            with contextlib.suppress(Exception):
                await asyncio.wait_for(websocket.close(GOING_AWAY, "server shutting down"), 1.0)
            raise
        finally:
            for task in (reader, writer, closer):
                task.cancel()
            self.sessions.pop(session.id, None)
            hub.remove_session(cast(Client, session))
            hub.count_close(code)

    async def _read(self, websocket: WebSocket, session: PvwsSession, identity: Identity) -> int:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return int(message.get("code") or 1005)
            text = message.get("text")
            if text is None:
                data = message.get("bytes")
                text = data.decode(errors="replace") if data is not None else ""
            for command in session.receive(text):
                if isinstance(command, Ping):
                    self._ping(websocket)
                elif isinstance(command, Write):
                    # Not awaited here: a slow put must not hold this client's other messages.
                    task = asyncio.create_task(self._write_pv(session, command, identity))
                    self._writes.add(task)
                    task.add_done_callback(self._writes.discard)
            if session.close_request:
                return session.close_request[0]

    async def _write_pv(self, session: PvwsSession, command: Write, identity: Identity) -> None:
        try:
            await self.hub.put(command.pv, command.value, False, PUT_TIMEOUT, identity)
        except PvwireError as exc:
            session.write_failed(str(exc))
        except Exception as exc:
            log.exception("pvws write to %s failed", command.pv)
            session.write_failed(f"write to {command.pv} failed: {exc}")

    def _ping(self, websocket: WebSocket) -> None:
        """A WebSocket ping frame, which ASGI cannot express: sent through the server's protocol
        object when it is uvicorn's sans-I/O implementation (the one `pvwire serve` runs)."""
        proto = _server_protocol(websocket._send)
        conn = getattr(proto, "conn", None)
        transport = getattr(proto, "transport", None)
        if conn is None or transport is None or not hasattr(conn, "send_ping"):
            if not self._ping_unsupported_logged:
                self._ping_unsupported_logged = True
                log.warning("pvws 'ping': this server's WebSocket implementation cannot ping")
            return
        conn.send_ping(b"")
        transport.write(b"".join(conn.data_to_send()))

    # --- HTTP: pvws's inspection URLs ---------------------------------------------------------

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/pvws/info", self.info, methods=["GET"])
        router.add_api_route("/pvws/summary", self.summary, methods=["GET"])
        router.add_api_route("/pvws/socket", self.socket, methods=["GET"])
        router.add_api_route("/pvws/socket/{sid}", self.socket, methods=["GET"])
        router.add_api_route("/pvws/socket/{sid}", self.delete_socket, methods=["DELETE"])
        router.add_api_route("/pvws/pool", self.pool, methods=["GET"])
        return router

    def _refused(self, request: Request) -> JSONResponse | None:
        peer = request.client.host if request.client else ""
        try:
            path = request.url.path
            identity = self.authenticator.identify(request.headers, peer, f"pvws {path}")
        except AuthError as exc:
            return JSONResponse({"error": str(exc)}, status_code=401)
        if not self.hub.is_admin(identity):
            return JSONResponse(
                {"error": f"{identity.describe()} is not an administrator of this server"},
                status_code=403,
            )
        return None

    async def info(self, request: Request) -> Response:
        if refused := self._refused(request):
            return refused
        started = datetime.fromtimestamp(self.started).strftime("%Y-%m-%d %H:%M:%S")
        body: dict[str, Any] = {"start_time": started, "jre": f"Python {sys.version.split()[0]}"}
        if request.query_params.get("env", "").lower() == "true":
            # pvws lists every variable; here only those that configure this endpoint, since the
            # environment may hold secrets.
            names = ("PV_THROTTLE_MS", "PV_ARRAY_THROTTLE_MS", "EPICS_CA_ADDR_LIST")
            body["env"] = [{n: os.environ[n]} for n in names if n in os.environ]
        return JSONResponse(body)

    def _socket_head(self, s: PvwsSession) -> dict[str, Any]:
        return {
            "id": s.id,
            "created": s.created_ms,
            "last_client_message": s.last_client_message_ms,
            "last_message_sent": s.last_message_sent_ms,
            "queued": s.queued_bytes,
        }

    async def summary(self, request: Request) -> Response:
        if refused := self._refused(request):
            return refused
        sockets = []
        for s in list(self.sessions.values()):
            arrays = sizes = 0
            for pv in s.pvs.values():
                count = pv.view.channels[0].meta.count or 0
                if count > 1:
                    arrays += 1
                    sizes = max(sizes, count)
            head = self._socket_head(s)
            sockets.append({**head, "pvs": len(s.pvs), "arrays": arrays, "max_size": sizes})
        return JSONResponse({"sockets": sockets})

    async def socket(self, request: Request, sid: str | None = None) -> Response:
        if refused := self._refused(request):
            return refused
        sockets = []
        for s in list(self.sessions.values()):
            if sid is not None and s.id != sid:
                continue
            pvs = []
            for name, pv in s.pvs.items():
                ch = pv.view.channels[0]
                value = ch.value
                shown = (
                    f"{type(value).__name__}, size {getattr(value, 'size', 0)}"
                    if hasattr(value, "size")
                    else str(value)
                )
                pvs.append({"name": name, "value": shown})
            sockets.append({**self._socket_head(s), "pvs": pvs})
        return JSONResponse({"sockets": sockets})

    async def delete_socket(self, request: Request, sid: str) -> Response:
        if refused := self._refused(request):
            return refused
        session = self.sessions.get(sid)
        if session is None:
            return JSONResponse({"error": f"no socket {sid!r}"}, status_code=404)
        log.info("DELETE pvws socket %s (%s)", sid, session.address)
        session.request_close(1000, "closed by an administrator")
        return Response(status_code=200)

    async def pool(self, request: Request) -> Response:
        if refused := self._refused(request):
            return refused
        refs: dict[str, int] = {}
        for s in list(self.sessions.values()):
            for pv in s.pvs.values():
                refs[pv.name] = refs.get(pv.name, 0) + 1
        return JSONResponse([{"refs": n, "pv": name} for name, n in refs.items()])


def _server_protocol(send: Any) -> Any:
    """The server's protocol object behind an ASGI `send`: middleware wraps `send` in closures
    (starlette's `sender`), so follow them, a bounded number of steps, to the bound method."""
    for _ in range(16):
        owner = getattr(send, "__self__", None)
        if owner is not None:
            return owner
        cells = dict(zip(send.__code__.co_freevars, send.__closure__ or (), strict=False))
        cell = cells.get("send")
        if cell is None:
            return None
        send = cell.cell_contents
    return None


async def _write(websocket: WebSocket, session: PvwsSession, wake: asyncio.Event) -> None:
    await pump(websocket.send_text, session.next_text, session.sent, wake)
