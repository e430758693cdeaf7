"""The pvws-compatible endpoint: `/pvws/pv` (WebSocket, JSON), `/pvws/pvget` and pvws's
inspection URLs.

Admission and the session only, as `api/stream.py` is for `/stream`: the connection's life is
`run_connection` (api/connection.py), the protocol `session.py`'s `PvwsSession`. Each PV is an
attachment of a one-channel view from the hub, so `/stream` and `/pvws/pv` clients share one
upstream monitor and one encoding per tick.

`/pvws/info` answers everyone (cs-web-lib 0.10 fetches it from the browser and switches host only
on 200; it holds no client data). `/pvws/summary`, `/pvws/socket[/ID]` (GET, DELETE) and
`/pvws/pool` answer with pvws's field names, for administrators only (they show who is connected
from where), from snapshots of the sessions (snapshot.py).

A pvws `ping` asks the server to send a WebSocket ping, which keeps proxies from dropping an idle
connection (pvws.js sends it when idle; a browser cannot see the ping). ASGI cannot express a
ping; the server's own keepalive (uvicorn's, every `ws_ping_interval_s`, 20 s by default) pings
every connection anyway, so `ping` needs no answer of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from ..access.identity import Authenticator, AuthError, Identity
from ..access.ratelimit import RateLimiter
from ..api.connection import Message, Wakeup, admission_refusal, refuse, run_connection
from ..core import fanout
from ..core.channel import Channel
from ..core.hub import Hub
from ..errors import (
    BadChannelId,
    ChannelNotFound,
    ChannelTimeout,
    Forbidden,
    PvwireError,
    TooManyChannels,
)
from ..limits import integer, number
from ..model import VALUE, ConnState, Metadata, Reading, Value
from ..wire.codes import NORMAL, POLICY
from ..wire.session import AttachRefused, SessionLimits
from ..wire.tokens import Claims
from .encoder import Entry, PvwsEncoder
from .messages import Write
from .pv import Opened, Pv, PvSource, PvwsRefused
from .session import PvwsSession, Splicer
from .snapshot import PvwsSocketSnapshot, snapshot
from .wsprotocol import FRAMES

__all__ = ["PvwsEndpoint", "throttle_rates"]

log = logging.getLogger("pvwire.pvws")

PUT_TIMEOUT = number("pvws_put_timeout_s")
WRITES_IN_FLIGHT = integer("pvws_writes_in_flight")
PVGET_PER_S = number("pvget_per_s")
PVGET_IN_FLIGHT = integer("pvget_in_flight")
# Every client's plain updates spliced compiled where built (core/_fanout.c), reading the slots
# of these classes (a TypeError here names one that a class does not declare).
SPLICER: Splicer | None = None
if fanout.SPLICER is not None:
    SPLICER = fanout.SPLICER(Pv, Channel, Entry, ConnState.CONNECTED, VALUE)
# pvget's answer to each error, by HTTP status.
_STATUS = {
    BadChannelId: 400,
    Forbidden: 403,
    ChannelNotFound: 404,
    TooManyChannels: 429,
    ChannelTimeout: 504,
}


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
            view = hub.open_view(claims, session, att)
        except AttachRefused as exc:
            raise PvwsRefused(str(exc)) from None
        return Opened(view, claims, hub.may_write(who, canonical))

    def close(self, view: PvSource, session: PvwsSession, att: int) -> None:
        self._hub.close_view(view, session, att)


@dataclass(frozen=True, slots=True)
class _Read:
    """A get's reading as the pvws encoder reads a channel's state (encoder.py ChannelState)."""

    value: Value
    seconds: int
    nanoseconds: int
    severity: int
    meta: Metadata
    state: ConnState = ConnState.CONNECTED
    updates: int = 1
    known: int = VALUE
    fault: str = ""
    id: str = ""  # canonical: the encoder sends CA's DBR_CHAR arrays as pvws does (docs/PVWS.md)

    @classmethod
    def of(cls, canonical: str, reading: Reading) -> _Read:
        return cls(
            reading.value,
            reading.seconds,
            reading.nanoseconds,
            reading.severity,
            reading.meta,
            id=canonical,
        )


class PvwsEndpoint:
    def __init__(self, hub: Hub, authenticator: Authenticator) -> None:
        self.hub = hub
        self.authenticator = authenticator
        self.encoder = PvwsEncoder()
        # pvget's own: a one-shot read must not replace what the subscribers' shared texts were
        # made from (it is never acquired, so each read is encoded on its own).
        self._reads = PvwsEncoder()
        self.rates = throttle_rates()
        self.sessions: dict[str, PvwsSession] = {}
        self.started = time.time()
        self._writes: set[asyncio.Task[None]] = set()
        self._in_flight: dict[int, int] = {}  # writes not yet done, by session number
        # Shared with /stream: opening takes a time per loop pass over both (core/opener.py).
        self.opener = hub.opener
        # pvget, as GraphQL's gets: a rate per identity, and few at once per address (each get
        # of a channel not monitored is an upstream search, for up to get_timeout_s).
        self._pvget_rate = RateLimiter(PVGET_PER_S, 2 * PVGET_PER_S)
        self._pvgets: dict[str, int] = {}  # client address's bound key -> pvgets not answered

    # --- the WebSocket ------------------------------------------------------------------------

    async def serve(self, websocket: WebSocket) -> None:
        hub, settings = self.hub, self.hub.settings
        origin = websocket.headers.get("origin")
        peer = websocket.client.host if websocket.client else ""
        address = self.authenticator.client_address(websocket.headers, peer)
        # Admitted first, then identified: a refused connection costs no JWT verification and
        # writes no refusal line (its address's bound was checked at accept, api/connections.py).
        refused = admission_refusal(hub, origin)
        if refused is not None:
            await refuse(websocket, hub, *refused)
            return
        try:
            identity = self.authenticator.identify(websocket.headers, peer, "pvws")
        except AuthError as exc:
            await refuse(websocket, hub, POLICY, str(exc))
            return
        await websocket.accept()
        wakeup = Wakeup()
        limits = SessionLimits(
            send_budget=settings.send_budget,
            stall_timeout=settings.stall_timeout_s,
            max_channels=settings.max_channels_per_connection,
        )
        session = PvwsSession(
            hub.client_number(),
            address,
            _Host(hub, identity, self.rates),
            self.encoder,
            limits,
            wakeup,
            self.rates,
            max_per_subscribe=settings.max_channels_per_subscription,
            opener=self.opener,
            image_bytes_per_s=settings.pvws_image_bytes_per_s,
            splicer=SPLICER,
        )

        def handle(message: Message) -> None:
            text = message.get("text")
            if text is None:
                data = message.get("bytes")
                text = data.decode(errors="replace") if data is not None else ""
            for command in session.receive(text):
                if isinstance(command, Write):
                    self._start_write(session, command, identity)
                # A Ping needs nothing: the server's keepalive pings (module docstring).

        self.sessions[session.id] = session
        try:
            write = websocket.scope.get("extensions", {}).get(FRAMES, {}).get("write")
            if write is not None:
                # Every message queued since the last write, in one write (wsprotocol.py).
                await run_connection(
                    websocket, hub, session, wakeup, handle, write,
                    session.next_frames, session.frames_written, log,
                )  # fmt: skip
            else:
                await run_connection(
                    websocket, hub, session, wakeup, handle, websocket.send_text,
                    session.next_text, session.sent, log,
                )  # fmt: skip
        finally:
            self.sessions.pop(session.id, None)

    def _start_write(self, session: PvwsSession, command: Write, identity: Identity) -> None:
        """Start a write, unless this connection has WRITES_IN_FLIGHT not done yet: each is a
        task, and a client's burst of writes must not make one task per message."""
        in_flight = self._in_flight.get(session.number, 0)
        if in_flight >= WRITES_IN_FLIGHT:
            message = (
                f"Cannot write {command.pv}: {in_flight} writes of this connection are not done "
                "yet, the most one may have (pvws_writes_in_flight)"
            )
            session.write_failed(message)
            self.hub.refused_put(command.pv, command.value, identity, "too_many_writes", message)
            return
        self._in_flight[session.number] = in_flight + 1
        # Not awaited here: a slow put must not hold this client's other messages.
        task = asyncio.create_task(self._write_pv(session, command, identity))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_pv(self, session: PvwsSession, command: Write, identity: Identity) -> None:
        try:
            await self._put(session, command, identity)
        finally:
            left = self._in_flight.pop(session.number, 1) - 1
            if left > 0:
                self._in_flight[session.number] = left

    async def _put(self, session: PvwsSession, command: Write, identity: Identity) -> None:
        try:
            await self.hub.put(command.pv, command.value, False, PUT_TIMEOUT, identity)
        except PvwireError as exc:
            session.write_failed(str(exc))
        except Exception as exc:
            log.exception("pvws write to %s failed", command.pv)
            session.write_failed(f"write to {command.pv} failed: {exc}")

    # --- HTTP: pvget and pvws's inspection URLs -----------------------------------------------

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/pvws/pvget", self.pvget, methods=["GET"])
        router.add_api_route("/pvws/info", self.info, methods=["GET"])
        router.add_api_route("/pvws/summary", self.summary, methods=["GET"])
        router.add_api_route("/pvws/socket", self.socket, methods=["GET"])
        router.add_api_route("/pvws/socket/{sid}", self.socket, methods=["GET"])
        router.add_api_route("/pvws/socket/{sid}", self.delete_socket, methods=["DELETE"])
        router.add_api_route("/pvws/pool", self.pool, methods=["GET"])
        return router

    def _identify(self, request: Request) -> Identity:
        peer = request.client.host if request.client else ""
        # The operation names the URL in the audit line of a refused authentication.
        return self.authenticator.identify(request.headers, peer, f"pvws {request.url.path}")

    def _refused(self, request: Request) -> JSONResponse | None:
        try:
            identity = self._identify(request)
        except AuthError as exc:
            return JSONResponse({"error": str(exc)}, status_code=401)
        if not self.hub.is_admin(identity):
            return JSONResponse(
                {"error": f"{identity.describe()} is not an administrator of this server"},
                status_code=403,
            )
        return None

    async def pvget(self, request: Request) -> Response:
        """One read (pvws-springboot's `GET /pvws/pvget?name=PV`): the update a `/pvws/pv` client
        gets first for the PV, metadata and value, under the same access rules; an error as
        `{"type": "error", "pv", "code", "message"}` with a 4xx/5xx status."""
        name = request.query_params.get("name", "")

        def error(status: int, code: str, message: str) -> JSONResponse:
            body = {"type": "error", "pv": name, "code": code, "message": message}
            return JSONResponse(body, status_code=status)

        allowed = self.hub.settings.allowed_origins
        origin = request.headers.get("origin")
        if allowed and origin is not None and origin not in allowed:
            return error(403, "ORIGIN_NOT_ALLOWED", f"origin {origin!r} is not allowed")
        try:
            identity = self._identify(request)
        except AuthError as exc:
            return error(401, exc.code, str(exc))
        if not name:
            return error(400, "BAD_REQUEST", "pvget needs a PV name: /pvws/pvget?name=PV")
        if not self._pvget_rate.take(identity.rate_key):
            why = f"{identity.describe()} sent more than {PVGET_PER_S:g} pvgets per second"
            return error(429, "RATE_LIMITED", f"{why} (pvget_per_s); slow down")
        address = identity.bound_key
        waiting = self._pvgets.get(address, 0)
        if waiting >= PVGET_IN_FLIGHT:
            why = f"{waiting} pvgets from {address} are not answered yet, the most one address"
            return error(429, "TOO_MANY_REQUESTS", f"{why} may have (pvget_in_flight)")
        self._pvgets[address] = waiting + 1
        try:
            canonical, reading = await self.hub.get(name, self.hub.settings.get_timeout_s, identity)
        except PvwireError as exc:
            status = next((v for k, v in _STATUS.items() if isinstance(exc, k)), 502)
            return error(status, exc.code, str(exc))
        finally:
            left = self._pvgets.pop(address, 1) - 1
            if left > 0:
                self._pvgets[address] = left
        readonly = not reading.meta.writable
        text = self._reads.text(name, _Read.of(canonical, reading), True, True, readonly)
        return Response(text, media_type="application/json")

    async def info(self, request: Request) -> Response:
        """Everyone may read this: when the server started and what runs it. The environment
        (`?env=true`) names the site's networks (EPICS_CA_ADDR_LIST): administrators only."""
        started = datetime.fromtimestamp(self.started).strftime("%Y-%m-%d %H:%M:%S")
        body: dict[str, Any] = {"start_time": started, "jre": f"Python {sys.version.split()[0]}"}
        if request.query_params.get("env", "").lower() == "true" and not self._refused(request):
            # pvws lists every variable; here only those that configure this endpoint, since the
            # environment may hold secrets.
            names = ("PV_THROTTLE_MS", "PV_ARRAY_THROTTLE_MS", "EPICS_CA_ADDR_LIST")
            body["env"] = [{n: os.environ[n]} for n in names if n in os.environ]
            return JSONResponse(body)
        # cs-web-lib 0.10 fetches this from the page's own origin, usually another host, to pick
        # a server: without this header the browser hides the 200 from it. It names no client
        # and carries no credentials, so any origin may read it.
        return JSONResponse(body, headers={"Access-Control-Allow-Origin": "*"})

    def _snapshots(self) -> list[PvwsSocketSnapshot]:
        return [snapshot(s) for s in list(self.sessions.values())]

    async def summary(self, request: Request) -> Response:
        if refused := self._refused(request):
            return refused
        sockets = []
        for s in self._snapshots():
            arrays = [pv.count for pv in s.pvs if pv.count > 1]
            sockets.append(
                {
                    **_head(s),
                    "pvs": len(s.pvs),
                    "arrays": len(arrays),
                    "max_size": max(arrays, default=0),
                }
            )
        return JSONResponse({"sockets": sockets})

    async def socket(self, request: Request, sid: str | None = None) -> Response:
        if refused := self._refused(request):
            return refused
        sockets = [
            {**_head(s), "pvs": [{"name": pv.name, "value": pv.shown} for pv in s.pvs]}
            for s in self._snapshots()
            if sid is None or s.id == sid
        ]
        return JSONResponse({"sockets": sockets})

    async def delete_socket(self, request: Request, sid: str) -> Response:
        if refused := self._refused(request):
            return refused
        if not self.close_socket(sid, "closed by an administrator"):
            return JSONResponse({"error": f"no socket {sid!r}"}, status_code=404)
        return Response(status_code=200)

    def close_socket(self, sid: str, reason: str) -> bool:
        """Ask connection `sid` to close with 1000, through the session's own close request (its
        pump sends the close and releases it as for any other close); False if there is none."""
        session = self.sessions.get(sid)
        if session is None:
            return False
        log.info("closing pvws socket %s (%s): %s", sid, session.address, reason)
        session.request_close(NORMAL, reason)
        return True

    async def pool(self, request: Request) -> Response:
        if refused := self._refused(request):
            return refused
        refs: dict[str, int] = {}
        for s in self._snapshots():
            for pv in s.pvs:
                refs[pv.name] = refs.get(pv.name, 0) + 1
        return JSONResponse([{"refs": n, "pv": name} for name, n in refs.items()])


def _head(s: PvwsSocketSnapshot) -> dict[str, Any]:
    return {
        "id": s.id,
        "created": s.created_ms,
        "last_client_message": s.last_client_message_ms,
        "client_messages": s.client_messages,  # pvwire's own: pvws's summary has no count
        "last_message_sent": s.last_message_sent_ms,
        "queued": s.queued_bytes,
    }
