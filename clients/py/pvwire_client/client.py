"""The asyncio client: GraphQL over httpx for requests, one shared WebSocket for monitors.

The stream layer is a thin pump around the pure pieces: :mod:`.wire` decodes and validates every
message, :class:`.state.ChannelState` merges entries, :mod:`.closecodes` says whether to reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, overload

import httpx

from . import closecodes
from . import graphql as gql
from .batch import Batch, BatchMerger
from .control import DEFAULT_URL
from .errors import PvwireError, ServerUnavailable, StreamClosed, StreamRefused, TooManyChannels
from .graphql import PutResult, Registration
from .login import default_token
from .state import DISCONNECTED, ChannelState
from .transport import Connection, ConnectionClosed, HandshakeError, connect
from .wire import (
    CONN,
    Attached,
    Data,
    Detached,
    Entry,
    Error,
    Hello,
    Message,
    Pong,
    ProtocolError,
    Snapshot,
    decode_message,
    encode_attach,
    encode_detach,
)

__all__ = ["DEFAULT_URL", "Batch", "Client", "TokenSource", "Update"]

log = logging.getLogger("pvwire_client")

SUBPROTOCOL = "pvwire.v1"
# The same protocol with ndarray data padded to 8-byte alignment (PROTOCOL.md section 1), which
# this client skips; offered first, so an older server that knows only SUBPROTOCOL still serves it.
ALIGNED_SUBPROTOCOL = "pvwire.v1.aligned"
# ERROR codes for an ATTACH whose token the server refused (section 7): re-register once.
_RENEW_CODES = {closecodes.BAD_TOKEN, closecodes.TOKEN_EXPIRED}

# The bearer token (the site's OIDC access token, a JWT): a string, or a callable returning one
# (or an awaitable of one), called before every GraphQL request so short-lived tokens refresh.
TokenSource: TypeAlias = str | Callable[[], str | Awaitable[str | None] | None] | None


@dataclass(frozen=True, slots=True)
class Update:
    """One applied entry: the channel's merged state after it, and what the entry changed."""

    channel: ChannelState
    changed: frozenset[str]


@dataclass(eq=False)
class _Sub:
    """One monitor: its registration, its channels' states and the queue its reader fills."""

    ids: list[str]
    options: dict[str, Any]
    reg: Registration
    limit: int
    states: list[ChannelState] = field(default_factory=list)
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    space: asyncio.Event = field(default_factory=asyncio.Event)
    att: int | None = None
    attach_req: int | None = None
    # A token was refused (4401/4402) and this monitor registered again: one more refusal
    # before an ATTACHED ends it, so a server refusing every token causes no loop.
    renewed: bool = False
    registering: bool = False
    # Queue entries as received (Group.raw, for monitor_batches), not as Entry objects.
    raw: bool = False

    def __post_init__(self) -> None:
        self.states = [
            ChannelState(c.id, metadata=c.metadata, access=c.access) for c in self.reg.channels
        ]
        self.space.set()

    def registered(self, reg: Registration) -> None:
        """A new registration: its token, and the access granted now (rules may have changed)."""
        self.reg = reg
        for state, c in zip(self.states, reg.channels, strict=False):
            state.access = c.access

    async def next(self) -> tuple[str, Any]:
        """The next item the stream queued: entries, snapshot, lost, error or end."""
        item = await self.queue.get()
        if self.queue.qsize() < self.limit:
            self.space.set()
        return item


class _Reconnect(Exception):
    """Close this connection with ``code`` and reconnect (e.g. a seq gap, section 2.5)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class Client:
    """A pvwire server: ``async with Client(url) as c: await c.get("ca://X")``.

    ``token`` identifies the user to a server that checks identities: the site's OIDC access
    token as a string, or a callable (plain or async) returning the current one, called before
    each GraphQL request and each re-registration of a monitor. Default: the ``PVWIRE_TOKEN``
    environment variable; ``token=""`` is anonymous even when that is set.

    Reconnects, and re-registrations the server could not answer, wait a full-jitter backoff:
    ``random(0, min(reconnect_max, reconnect_base * 2**attempt))``, the attempt count starting
    again after each HELLO (PROTOCOL.md section 8).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: TokenSource = None,
        timeout: float = 3.0,
        reconnect_base: float = 0.5,
        # A few seconds, not 30: after a 30 s outage a 30 s cap left clients away for up to
        # 23 s after the server was back, 5 s for at most 4.2 s (bench/README.md, bench.resume).
        reconnect_max: float = 5.0,
        queue_size: int = 1024,
        max_message_bytes: int = 256 * 2**20,
        request_timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        stream_url: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.reconnect_base = reconnect_base
        self.reconnect_max = reconnect_max
        self.queue_size = queue_size
        self.max_message_bytes = max_message_bytes
        # Section 2.7: a stream request (ATTACH, DETACH) unanswered this long means the
        # connection is broken: close it with 4000 and reconnect.
        self.request_timeout = request_timeout
        self.stream_url = stream_url
        self._token: TokenSource = default_token() if token is None else token
        self._http = httpx.AsyncClient(transport=transport, timeout=timeout + 10.0)
        self._stream: _Stream | None = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End every monitor (their iterators stop), close the WebSocket and the HTTP client."""
        if self._stream is not None:
            await self._stream.close()
        await self._http.aclose()

    # --- control plane -------------------------------------------------------------------------

    async def _auth_headers(self) -> dict[str, str]:
        token = self._token
        if callable(token):
            got = token()
            token = await got if inspect.isawaitable(got) else got
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _graphql(self, query: str, variables: dict[str, Any], id: str | None = None) -> Any:
        headers = await self._auth_headers()
        try:
            r = await self._http.post(
                f"{self.url}/graphql",
                json={"query": query, "variables": variables},
                headers=headers,
            )
        except httpx.HTTPError as e:
            raise ServerUnavailable(f"cannot reach pvwire server at {self.url}: {e}") from None
        return gql.response_data(self.url, r.status_code, r.content, id)

    @overload
    async def get(self, id: str, /, *, timeout: float | None = None) -> ChannelState: ...
    @overload
    async def get(
        self, id: str, id2: str, /, *ids: str, timeout: float | None = None
    ) -> list[ChannelState]: ...
    async def get(
        self, *ids: str, timeout: float | None = None
    ) -> ChannelState | list[ChannelState]:
        """Read channels; one id gives one state, several a list. Raises on the first failure."""
        results = await self.get_many(ids, timeout=timeout)
        for r in results:
            if isinstance(r, PvwireError):
                raise r
        states = [r for r in results if isinstance(r, ChannelState)]
        return states[0] if len(ids) == 1 else states

    async def get_many(
        self, ids: Iterable[str], *, timeout: float | None = None
    ) -> list[ChannelState | PvwireError]:
        """Read channels; a failing one is returned as its error, in place, not raised."""
        ids = list(ids)
        t = self.timeout if timeout is None else timeout
        data = await self._graphql(gql.Q_CHANNELS, {"ids": ids, "timeout": t})
        return [gql.channel_or_error(c) for c in data["channels"]]

    async def put(
        self, id: str, value: Any, *, wait: bool = False, timeout: float = 5.0
    ) -> PutResult:
        """Write a value (enum labels as strings); raises WriteDenied, TypeMismatch, ..."""
        v = {"id": id, "value": gql.to_json(value), "wait": wait, "timeout": timeout}
        data = await self._graphql(gql.M_PUT, v, id)
        res = gql.put_result(data["put"])
        if not res.ok:
            raise gql.put_error(res)
        return res

    async def put_many(
        self,
        puts: Mapping[str, Any] | Sequence[tuple[str, Any]],
        *,
        wait: bool = False,
        timeout: float = 5.0,
    ) -> list[PutResult]:
        """Write several values; one result each, in order (failures do not raise)."""
        items = list(puts.items()) if isinstance(puts, Mapping) else list(puts)
        v = {
            "puts": [{"id": i, "value": gql.to_json(x)} for i, x in items],
            "wait": wait,
            "timeout": timeout,
        }
        data = await self._graphql(gql.M_PUT_MANY, v)
        return [gql.put_result(r) for r in data["putMany"]]

    async def search(self, pattern: str, limit: int = 100) -> list[str]:
        """Channel ids matching a glob pattern (``*``, ``?``, ``[..]``), sorted."""
        data = await self._graphql(gql.Q_SEARCH, {"p": pattern, "n": limit})
        return list(data["search"])

    async def info(self, id: str, *, timeout: float | None = None) -> dict[str, Any]:
        """The channel's metadata (section 5 form: units, precision, limits, choices, ...)."""
        t = self.timeout if timeout is None else timeout
        data = await self._graphql(gql.Q_INFO, {"id": id, "timeout": t}, id)
        return gql.metadata(data["channel"]["metadata"])

    async def server_info(self) -> dict[str, Any]:
        """The server's status: version, uptime, clients and upstream channels."""
        data = await self._graphql(gql.Q_SERVER, {})
        return dict(data["server"])

    def _backoff(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (0 first): full jitter, capped."""
        return random.uniform(0, min(self.reconnect_max, self.reconnect_base * 2**attempt))

    async def _register(self, ids: Sequence[str], options: dict[str, Any]) -> Registration:
        data = await self._graphql(gql.M_SUBSCRIBE, {"ids": list(ids), "options": options})
        return Registration.from_json(data["subscribe"])

    # --- data plane ----------------------------------------------------------------------------

    async def monitor(
        self,
        ids: str | Iterable[str],
        *,
        max_rate: float = 0,
        mode: Literal["LATEST", "ALL"] = "LATEST",
        max_columns: int = 0,
        max_pixels: int = 0,
    ) -> AsyncGenerator[Update, None]:
        """Yield an Update per applied entry: a first one per channel, then its changes.

        A channel's first update carries its value, or a connection state that says why there
        is none (NOT_FOUND after the server's search time, FAILED, DISCONNECTED) with the reason;
        its ``changed`` names everything known by then. A cold channel's snapshot (still
        connecting, no value) is not yielded: a reader expects a value, not an empty state.
        Survives reconnects (channels show DISCONNECTED meanwhile, then a fresh snapshot) and
        re-registers once when the server refuses its token, retrying with the reconnect
        backoff for as long as the server cannot be reached; raises StreamClosed on terminal
        close codes, StreamRefused when the server refuses or ends this subscription alone, and
        Forbidden or Unauthenticated when (re-)registering is refused. Closing the iterator
        detaches.

        ``max_columns`` and ``max_pixels`` ask the server to reduce big arrays for display
        (PROTOCOL.md section 4.6): a 1-D array of more than ``2 * max_columns`` elements arrives
        as the interleaved minimum and maximum of ``max_columns`` equal slices, an image of more
        than ``max_pixels`` pixels subsampled; ``metadata["reduced"]`` then says so.
        """
        stream, sub = await self._open(ids, max_rate, mode, max_columns, max_pixels)
        # Per channel: what changed before its first update (None once that was yielded).
        held: list[set[str] | None] = [set() for _ in sub.states]
        try:
            while True:
                kind, payload = await sub.next()
                if kind in ("entries", "snapshot"):
                    for e in payload:
                        state = sub.states[e.sid]
                        changed = state.apply(e, baseline=kind == "snapshot")
                        pending = held[e.sid]
                        if pending is not None:
                            pending |= changed
                            if not state.has_news:
                                continue
                            changed, held[e.sid] = pending, None
                        yield Update(copy.copy(state), frozenset(changed))
                elif kind == "lost":
                    for sid, state in enumerate(sub.states):
                        if not state.connected:  # never connected yet, or already down
                            continue
                        gone = Entry(sid, CONN, state=DISCONNECTED, reason=payload)
                        changed = state.apply(gone)
                        if changed:
                            yield Update(copy.copy(state), frozenset(changed))
                elif kind == "error":
                    raise payload
                else:  # "end": the client was closed
                    return
        finally:
            await stream.remove(sub)

    async def monitor_batches(
        self,
        ids: str | Iterable[str],
        *,
        max_rate: float = 0,
        mode: Literal["LATEST", "ALL"] = "LATEST",
        max_columns: int = 0,
        max_pixels: int = 0,
    ) -> AsyncGenerator[Batch, None]:
        """Yield a Batch per frame: the channels it changed, merged into the monitor's states.

        The same channels, states, reconnects and errors as :meth:`monitor`, without an object
        and a copy of the state per update (see :class:`~pvwire_client.batch.Batch`): for
        readers of many channels, e.g. 1,000 at 10 Hz.
        """
        stream, sub = await self._open(ids, max_rate, mode, max_columns, max_pixels, raw=True)
        merger = BatchMerger(sub.states)
        try:
            while True:
                kind, payload = await sub.next()
                if kind in ("entries", "snapshot"):
                    batch = merger.entries(payload, snapshot=kind == "snapshot")
                elif kind == "lost":
                    batch = merger.lost(payload)
                elif kind == "error":
                    raise payload
                else:  # "end": the client was closed
                    return
                if batch is not None:
                    yield batch
        finally:
            await stream.remove(sub)

    async def _open(
        self,
        ids: str | Iterable[str],
        max_rate: float,
        mode: str,
        max_columns: int = 0,
        max_pixels: int = 0,
        *,
        raw: bool = False,
    ) -> tuple[_Stream, _Sub]:
        """Register the channels and attach their token on the shared stream."""
        id_list = [ids] if isinstance(ids, str) else list(ids)
        options: dict[str, Any] = {"maxRate": float(max_rate), "mode": mode}
        if max_columns or max_pixels:
            # Sent only when asked for: a server without these options still serves the rest.
            options.update(maxColumns=int(max_columns), maxPixels=int(max_pixels))
        reg = await self._register(id_list, options)
        sub = _Sub(id_list, options, reg, self.queue_size, raw=raw)
        if self._stream is None:
            self._stream = _Stream(self)
        stream = self._stream
        await stream.add(sub)
        return stream, sub


class _Stream:
    """The Client's one WebSocket: attaches every monitor's token, reconnects, routes entries."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.subs: list[_Sub] = []
        self.ws: Connection | None = None
        self.ready = False  # HELLO received on self.ws: new subs attach at once
        self.closing = False
        self.wanted = asyncio.Event()
        self.by_req: dict[int, _Sub] = {}
        self.by_att: dict[int, _Sub] = {}
        self.detaching: set[int] = set()
        self.sent_at: dict[int, float] = {}  # req -> loop time, for requests not answered yet
        # An ERROR answering no request, kept for the DETACHED that may follow it at once: the
        # server says why it ends an attachment (e.g. 4403 naming the channel) just before.
        self.notice: Error | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.next_req = 1
        self.seq = 0
        self.hello: Hello | None = None
        self.task: asyncio.Task[None] | None = None

    # --- monitors come and go ------------------------------------------------------------------

    async def add(self, sub: _Sub) -> None:
        self.subs.append(sub)
        self.wanted.set()
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name="pvwire-stream")
        elif self.ready:
            with contextlib.suppress(ConnectionClosed, OSError):  # the reader reconnects
                await self._attach(sub)

    async def remove(self, sub: _Sub) -> None:
        if sub in self.subs:
            self.subs.remove(sub)
        sub.space.set()  # unblock a reader waiting for room in this queue
        if not self.subs:
            self.wanted.clear()
        att, sub.att = sub.att, None
        if att is not None:
            self.by_att.pop(att, None)
            await self._send_detach(att)

    def _fail(self, sub: _Sub, exc: Exception) -> None:
        if sub in self.subs:
            self.subs.remove(sub)
        if not self.subs:
            self.wanted.clear()
        sub.queue.put_nowait(("error", exc))

    async def close(self) -> None:
        self.closing = True
        for sub in list(self.subs):
            sub.queue.put_nowait(("end", None))
            sub.space.set()
        self.subs.clear()
        self.wanted.set()
        for t in list(self.tasks):
            t.cancel()
        if self.ws is not None:
            await self.ws.close(closecodes.NORMAL, "client closed")
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    # --- connection loop -----------------------------------------------------------------------

    def _url(self) -> str:
        if self.client.stream_url is not None:
            return self.client.stream_url
        path = self.subs[0].reg.stream_path if self.subs else "/stream"
        url = httpx.URL(self.client.url).join(path)
        return str(url.copy_with(scheme="wss" if url.scheme == "https" else "ws"))

    async def _run(self) -> None:
        attempt = 0
        while not self.closing:
            await self.wanted.wait()
            if self.closing:
                break
            try:
                ws = await connect(
                    self._url(),
                    subprotocols=[ALIGNED_SUBPROTOCOL, SUBPROTOCOL],
                    max_size=self.client.max_message_bytes,
                    open_timeout=10,
                )
            except (OSError, HandshakeError, TimeoutError) as e:
                self._lost(f"cannot connect: {e}")
            else:
                self.hello = None
                code, reason = await self._session(ws)
                if self.hello is not None:
                    # The server answered: the next loss starts a new outage, whose first retry
                    # comes within reconnect_base. A server refusing before HELLO (1013
                    # TRY_AGAIN, an overloaded proxy) keeps the backoff growing.
                    attempt = 0
                if self.closing:
                    break
                self._closed(code, reason)
            if self.subs:
                await asyncio.sleep(self.client._backoff(attempt))
                attempt += 1

    def _closed(self, code: int, reason: str) -> None:
        """Apply the close code's class (section 8) to the monitors: a close concerns them all
        (a refused token is answered per attachment with ERROR, see _dispatch)."""
        if not closecodes.is_reconnect(code):
            for sub in list(self.subs):
                self._fail(sub, StreamClosed(code, reason))
        self._lost(
            f"stream closed: {code} {closecodes.name(code)}" + (f" ({reason})" if reason else "")
        )

    def _lost(self, reason: str) -> None:
        for sub in self.subs:
            sub.queue.put_nowait(("lost", reason))

    async def _session(self, ws: Connection) -> tuple[int, str]:
        """Run one connection until it closes; return the close code and reason."""
        self.ws, self.ready, self.seq = ws, False, 0
        self.by_req.clear()
        self.by_att.clear()
        self.detaching.clear()
        self.sent_at.clear()
        for sub in self.subs:
            sub.att = sub.attach_req = None
        try:
            async with asyncio.timeout(10):
                hello = decode_message(_binary(await ws.recv()))
            if not isinstance(hello, Hello):
                raise ProtocolError(f"first message must be HELLO, got {type(hello).__name__}")
            if hello.version != 1:
                why = f"server speaks protocol version {hello.version}, not 1"
                for sub in list(self.subs):
                    self._fail(sub, StreamClosed(closecodes.UNSUPPORTED, why))
                await ws.close(closecodes.NORMAL, "unsupported protocol version")
                return closecodes.UNSUPPORTED, why
            self.hello = hello
            # Section 2.1: silence longer than 2 x heartbeat + 1 s means a dead connection.
            watchdog = 2 * hello.heartbeat_ms / 1000 + 1
            self.ready = True
            for sub in list(self.subs):
                await self._attach(sub)
            loop = asyncio.get_running_loop()
            while True:
                wait = watchdog
                if self.sent_at:
                    oldest = min(self.sent_at.values())
                    wait = min(wait, oldest + self.client.request_timeout - loop.time())
                try:
                    async with asyncio.timeout(max(wait, 0.0)):
                        data = await ws.recv()
                except TimeoutError:
                    raise _Reconnect(
                        closecodes.HEARTBEAT_TIMEOUT, self._silence(watchdog)
                    ) from None
                await self._dispatch(decode_message(_binary(data)))
        except ConnectionClosed as e:  # the code received, else the one sent, else 1006
            return e.code, e.reason
        except _Reconnect as e:
            await ws.close(e.code, e.reason)
            return e.code, e.reason
        except ProtocolError as e:
            # Section 1: after a malformed message this connection's state may be wrong; close
            # with 1002 and reconnect (with backoff): the snapshots restore the state.
            log.warning("pvwire stream: %s; reconnecting", e)
            await ws.close(closecodes.PROTOCOL_ERROR, str(e)[:100])
            return closecodes.PROTOCOL_ERROR, str(e)
        except TimeoutError:
            await ws.close(closecodes.HEARTBEAT_TIMEOUT, "no HELLO")
            return closecodes.HEARTBEAT_TIMEOUT, "no HELLO within 10 s"
        except OSError as e:
            return closecodes.ABNORMAL, str(e)
        finally:
            self.ws, self.ready = None, False
            for sub in self.subs:
                sub.att = None

    async def _attach(self, sub: _Sub) -> None:
        if self.ws is None or sub.att is not None or sub.attach_req is not None or sub.registering:
            return
        if sub.reg.expires_at < time.time() + 1:
            # Section 7: an expired token is re-registered through GraphQL first, in a task of
            # its own: the reader goes on meanwhile (heartbeats, the other monitors' data).
            sub.registering = True
            self._spawn(self._renew(sub))
            return
        await self._send_attach(sub)

    async def _send_attach(self, sub: _Sub) -> None:
        ws = self.ws
        if ws is None or sub.att is not None or sub.attach_req is not None:
            return
        req = self._req()
        sub.attach_req = req
        self.by_req[req] = sub
        self.sent_at[req] = asyncio.get_running_loop().time()
        await ws.send(encode_attach(req, sub.reg.token))

    async def _reregister(self, sub: _Sub) -> bool:
        """A fresh token for ``sub`` (the token source is asked again); False if it ended.

        An unreachable server (down, restarting, a proxy answering 502/503) is waited for with
        the reconnect backoff, for as long as the monitor is open: the subscription is the
        user's, an outage must not end it. Any other failure ends this monitor alone.
        """
        sub.registering = True
        attempt = 0
        try:
            while True:
                try:
                    reg = await self.client._register(sub.ids, sub.options)
                    break
                except ServerUnavailable as e:
                    if sub not in self.subs or self.closing:
                        return False
                    delay = self.client._backoff(attempt)
                    if attempt == 0:
                        sub.queue.put_nowait(("lost", f"cannot register again: {e}"))
                    log.warning(
                        "pvwire: registering %d channel(s) again failed (%s); retry %d in %.1f s",
                        len(sub.ids), e, attempt + 1, delay,
                    )  # fmt: skip
                    attempt += 1
                    await asyncio.sleep(delay)
                except Exception as e:  # a PvwireError, or the application's token source failing
                    self._fail(sub, e)
                    return False
        finally:
            sub.registering = False
        if sub not in self.subs:
            return False
        sub.registered(reg)
        return True

    async def _renew(self, sub: _Sub) -> None:
        """Register again and attach the new token (the answer to ERROR 4401/4402, or a token
        known to be expired); without a connection now, the next HELLO attaches it."""
        if await self._reregister(sub) and self.ready:
            with contextlib.suppress(ConnectionClosed, OSError):  # the reader reconnects
                await self._send_attach(sub)

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send_detach(self, att: int) -> None:
        ws = self.ws
        if ws is None:
            return
        self.detaching.add(att)
        req = self._req()
        self.sent_at[req] = asyncio.get_running_loop().time()
        with contextlib.suppress(ConnectionClosed, OSError):
            await ws.send(encode_detach(req, att))

    def _req(self) -> int:
        req, self.next_req = self.next_req, self.next_req + 1
        return req

    def _silence(self, watchdog: float) -> str:
        """Why the wait for a message ended: a request unanswered, or the watchdog."""
        if self.sent_at:
            req, at = min(self.sent_at.items(), key=lambda kv: kv[1])
            waited = asyncio.get_running_loop().time() - at
            if waited >= self.client.request_timeout:
                return f"no answer to request {req} within {self.client.request_timeout:.0f} s"
        return f"no message for {watchdog:.1f} s"

    def _check_seq(self, seq: int) -> None:
        if seq != self.seq + 1:
            raise _Reconnect(closecodes.PROTOCOL_ERROR, f"seq gap: {self.seq} then {seq}")
        self.seq = seq

    async def _dispatch(self, msg: Message) -> None:
        notice, self.notice = self.notice, None
        if isinstance(msg, Data):
            self._check_seq(msg.seq)
            for g in msg.groups:
                sub = self.by_att.get(g.att)
                if sub is not None:
                    _check_sids(sub, g.raw)
                    await self._deliver(sub, ("entries", g.raw if sub.raw else g.entries))
        elif isinstance(msg, Snapshot):
            self._check_seq(msg.seq)
            sub = self.by_att.get(msg.att)
            if sub is not None:
                _check_sids(sub, msg.raw)
                await self._deliver(sub, ("snapshot", msg.raw if sub.raw else msg.entries))
        elif isinstance(msg, Attached):
            self.sent_at.pop(msg.req, None)
            sub = self.by_req.pop(msg.req, None)
            if sub is None:
                raise ProtocolError(f"ATTACHED answers unknown req {msg.req}")
            sub.attach_req = None
            if sub not in self.subs:  # the monitor closed while attaching
                await self._send_detach(msg.att)
                return
            expected = tuple(c.id for c in sub.reg.channels)
            if msg.ids != expected:
                raise ProtocolError(f"ATTACHED ids {list(msg.ids)} differ from the token's")
            sub.att = msg.att
            sub.renewed = False
            self.by_att[msg.att] = sub
        elif isinstance(msg, Detached):
            if msg.req is not None:
                self.sent_at.pop(msg.req, None)
            sub = self.by_att.pop(msg.att, None)
            self.detaching.discard(msg.att)
            if msg.req is None and sub is not None:
                sub.att = None
                if notice is not None:
                    self._fail(sub, StreamRefused(notice.code, notice.message))
                else:
                    why = "the server ended the subscription"
                    self._fail(sub, PvwireError(why, code="DETACHED"))
        elif isinstance(msg, Error):
            if msg.req is not None:
                self.sent_at.pop(msg.req, None)
            sub = self.by_req.pop(msg.req, None) if msg.req is not None else None
            if sub is not None:
                self._refused(sub, msg)
            else:
                self.notice = msg
                log.warning("pvwire stream error %d: %s", msg.code, msg.message)
        elif isinstance(msg, Pong):
            pass
        # HEARTBEAT only resets the watchdog; unknown kinds are ignored (section 1).

    def _refused(self, sub: _Sub, msg: Error) -> None:
        """The server answered ``sub``'s ATTACH with ERROR; only this monitor is concerned."""
        sub.attach_req = None
        if sub not in self.subs:  # the monitor closed while attaching
            return
        if msg.code in _RENEW_CODES and not sub.renewed:
            # Expired, or signed with a key the server no longer has (a restart without a
            # shared key): register again with a fresh identity token, once.
            sub.renewed = True
            sub.registering = True
            self._spawn(self._renew(sub))
        elif msg.code == closecodes.TOO_MANY_CHANNELS:
            self._fail(sub, TooManyChannels(f"attach refused: {msg.code} {msg.message}"))
        else:
            self._fail(sub, StreamRefused(msg.code, msg.message))

    async def _deliver(self, sub: _Sub, item: tuple[str, Any]) -> None:
        # Bounded per monitor: a slow consumer holds the reader, TCP pushes back and the server
        # conflates for us (section 9); the watchdog only counts time spent waiting in recv().
        while sub.queue.qsize() >= sub.limit and sub in self.subs:
            sub.space.clear()
            await sub.space.wait()
        if sub in self.subs:
            sub.queue.put_nowait(item)


def _binary(data: str | bytearray) -> bytearray:
    if isinstance(data, str):
        raise ProtocolError("text WebSocket message (the stream is binary MessagePack only)")
    return data


def _check_sids(sub: _Sub, raw: tuple[list[Any], ...]) -> None:
    n = len(sub.states)
    for e in raw:
        if e[0] >= n:
            raise ProtocolError(f"entry sid {e[0]} out of range for {n} channels")
