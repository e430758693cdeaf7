"""The asyncio client: GraphQL over httpx for requests, one shared WebSocket for monitors.

The stream layer is a thin pump around the pure pieces: :class:`.session.Session` holds the
protocol's state (it decodes every message with :mod:`.wire`, routes entries, answers, asks for
closes, says when to reconnect), :class:`.state.ChannelState` merges entries. The pump owns the
socket, the clock, the backoff and the GraphQL re-registrations.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import random
import ssl
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, overload

import httpx

from . import closecodes
from . import graphql as gql
from .backfill import past_states
from .batch import Batch, BatchMerger
from .control import DEFAULT_URL
from .entry import FIELD_NAMES
from .errors import (
    ProtocolError,
    PvwireError,
    ServerUnavailable,
    StreamClosed,
    StreamRefused,
    TooManyChannels,
)
from .graphql import PutResult, Registration
from .history import Q_HISTORY, HistoryRows, history_rows
from .login import default_token
from .session import (
    Backfill,
    Closed,
    Connected,
    Entries,
    Event,
    Failed,
    Lost,
    Malformed,
    Renew,
    ServerError,
    Session,
)
from .state import ChannelState, link_lost
from .transport import Connection, ConnectionClosed, HandshakeError, connect
from .wire import History

__all__ = ["DEFAULT_URL", "Batch", "Client", "TokenSource", "Update"]

log = logging.getLogger("pvwire_client")

SUBPROTOCOL = "pvwire.v1"
# The same protocol with ndarray data padded to 8-byte alignment (PROTOCOL.md section 1), which
# this client skips; offered first, so an older server that knows only SUBPROTOCOL still serves it.
ALIGNED_SUBPROTOCOL = "pvwire.v1.aligned"

# The bearer token (the site's OIDC access token, a JWT): a string, or a callable returning one
# (or an awaitable of one), called before every GraphQL request so short-lived tokens refresh.
TokenSource: TypeAlias = str | Callable[[], str | Awaitable[str | None] | None] | None


@dataclass(frozen=True, slots=True)
class Update:
    """One applied entry: the channel's merged state after it, and what the entry changed."""

    channel: ChannelState
    changed: frozenset[str]
    # A recorded update from before the subscription (``monitor(..., backfill=S)``), not a
    # live one: its ``channel`` is that moment's value, time and alarm, with ``serial`` None.
    past: bool = False


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
    registering: bool = False

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

    @property
    def ids_attached(self) -> tuple[str, ...]:
        """The channel ids the token names, as the registration gave them (ATTACHED must match)."""
        return tuple(c.id for c in self.reg.channels)

    async def next(self) -> tuple[str, Any]:
        """The next item the stream queued: entries, snapshot, history, lost, error or end."""
        item = await self.queue.get()
        if self.queue.qsize() < self.limit:
            self.space.set()
        return item


class Client:
    """A pvwire server: ``async with Client(url) as c: await c.get("ca://X")``.

    ``token`` identifies the user to a server that checks identities: the site's OIDC access
    token as a string, or a callable (plain or async) returning the current one, called before
    each GraphQL request and each re-registration of a monitor. Default: the ``PVWIRE_TOKEN``
    environment variable; ``token=""`` is anonymous even when that is set.

    Reconnects, and re-registrations the server could not answer, wait a full-jitter backoff:
    ``random(0, min(reconnect_max, reconnect_base * 2**attempt))``, the attempt count starting
    again after each HELLO (PROTOCOL.md section 8). A server draining (close 4012) is left at
    once: the reconnect waits only ``random(0, N ms)``, N what the server said (at most
    ``reconnect_max``).

    ``https://`` and ``wss://`` are verified against the system's trusted certificates, or
    against ``ca_file`` (PEM: a site's own CA) when given, for GraphQL and the stream alike.
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
        ca_file: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # The system's store (OpenSSL's default paths, SSL_CERT_FILE), or the site's CA.
        self.ssl_context = ssl.create_default_context(cafile=ca_file)
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
        self._http = httpx.AsyncClient(
            transport=transport, timeout=timeout + 10.0, verify=self.ssl_context
        )
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

    async def history(
        self,
        id: str,
        since: float | None = None,
        until: float | None = None,
        *,
        max_points: int = 1000,
    ) -> HistoryRows:
        """A channel's past between ``since`` and ``until`` (POSIX seconds, IOC time; default:
        all the server holds), in about ``max_points`` rows: every update, or the finest
        buckets that fit. With an archiver behind the server (``--archiver``) and a ``since``,
        the past older
        than the server's own history comes from the facility's archive, joined by the server
        at the seam in the same resolution: ``rows.archive`` says how many rows came from it.
        When the archive could not be read (the archiver down, too slow, answering garbage),
        the rows are the recent part alone after a gap row at ``since``, and
        ``rows.archive_missing`` says why (``rows.describe()`` too). Raises NoHistory when
        neither holds anything of the channel, Forbidden, BadChannelId, TooLarge."""
        variables = {"id": id, "since": since, "until": until, "max": max_points}
        data = await self._graphql(Q_HISTORY, variables, id)
        return history_rows(data["history"])

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
        backfill: float = 0,
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

        ``backfill`` = S seconds: first the channels' last S seconds as the server recorded them
        (PROTOCOL.md section 2.8), as Updates with ``past`` True, oldest first, then the live
        ones; the first live value is the one after the last past one. After a reconnect the
        past rows the reader already had are not yielded again, and those a slow backfill left
        out (a gap row said so) are: older than the live ones yielded since, still ``past``
        True, in time order among themselves. An array channel's past values
        (a server started with ``--history-array-max``) are float64 ndarrays, one per row.
        """
        stream, sub = await self._open(
            ids, max_rate, mode, max_columns, max_pixels, backfill=backfill
        )
        # Per channel: what changed before its first update (None once that was yielded).
        held: list[set[str] | None] = [set() for _ in sub.states]
        # Per channel: its past, held until its first update is yielded. The past comes before
        # the snapshot, and so before the metadata: held, its rows read as the channel's type
        # says (an integer channel's as integers, as the live ones), and still come first.
        early: list[list[History]] = [[] for _ in sub.states]
        try:
            while True:
                kind, payload = await sub.next()
                if kind == "history":
                    # The session checked the sid against the attachment's channels.
                    sid = payload.sid
                    if held[sid] is not None:
                        early[sid].append(payload)
                        continue
                    for past, what, _ in past_states(payload, sub.states[sid]):
                        yield Update(past, what, past=True)
                elif kind in ("entries", "snapshot"):
                    for e in payload:
                        state = sub.states[e[0]]
                        changed = FIELD_NAMES[state.merge(e, kind == "snapshot")]
                        pending = held[e[0]]
                        if pending is not None:
                            pending |= changed
                            if not state.has_news:
                                continue
                            changed, held[e[0]] = frozenset(pending), None
                            for history in early[e[0]]:
                                for past, what, _ in past_states(history, state):
                                    yield Update(past, what, past=True)
                            early[e[0]] = []
                        yield Update(copy.copy(state), changed)
                elif kind == "lost":
                    for sid, state in enumerate(sub.states):
                        bits = link_lost(state, sid, payload)
                        if bits:
                            yield Update(copy.copy(state), FIELD_NAMES[bits])
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
        stream, sub = await self._open(ids, max_rate, mode, max_columns, max_pixels)
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
        backfill: float = 0,
    ) -> tuple[_Stream, _Sub]:
        """Register the channels and attach their token on the shared stream."""
        id_list = [ids] if isinstance(ids, str) else list(ids)
        options: dict[str, Any] = {"maxRate": float(max_rate), "mode": mode}
        if max_columns or max_pixels:
            # Sent only when asked for: a server without these options still serves the rest.
            options.update(maxColumns=int(max_columns), maxPixels=int(max_pixels))
        if backfill:
            options["backfill"] = float(backfill)
        reg = await self._register(id_list, options)
        sub = _Sub(id_list, options, reg, self.queue_size)
        if self._stream is None:
            self._stream = _Stream(self)
        stream = self._stream
        await stream.add(sub)
        return stream, sub


class _Stream:
    """The Client's one WebSocket: the pump around the :class:`Session` (socket, clock, backoff,
    re-registrations); the session decides what to send, apply, close and retry."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.session = Session(request_timeout=client.request_timeout)
        self.subs: list[_Sub] = []
        self.ws: Connection | None = None
        # Connections this stream has ended whose TCP the server has not closed yet; each ends
        # within CLOSE_TIMEOUT (10 s), so this holds those of the last 10 s, and close() drops
        # them (a loop closed with one open leaks its socket).
        self.ending: set[Connection] = set()
        self.closing = False
        self.wanted = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.task: asyncio.Task[None] | None = None
        self.answered = False  # the current connection's HELLO arrived
        self.drained_within: float | None = None  # the last close was a drain's (4012)
        self.handling = False  # a coroutine is handing the session's events on

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _expiry(self, reg: Registration) -> float:
        """The token's expiry (wall clock, from the server) on the session's clock."""
        return self._now() + (reg.expires_at - time.time())

    # --- monitors come and go ------------------------------------------------------------------

    async def add(self, sub: _Sub) -> None:
        self.subs.append(sub)
        self.session.add(
            sub,
            sub.reg.token,
            sub.ids_attached,
            expires_at=self._expiry(sub.reg),
            backfill=bool(sub.options.get("backfill")),
            now=self._now(),
        )
        self.wanted.set()
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name="pvwire-stream")
        await self._pump()

    async def remove(self, sub: _Sub) -> None:
        if sub in self.subs:
            self.subs.remove(sub)
        sub.space.set()  # unblock a reader waiting for room in this queue
        if not self.subs:
            self.wanted.clear()
        self.session.remove(sub, self._now())
        await self._pump()

    def _fail(self, sub: _Sub, exc: Exception) -> None:
        if sub in self.subs:
            self.subs.remove(sub)
        if not self.subs:
            self.wanted.clear()
        self.session.remove(sub, self._now())
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
        # Each of these has sent its Close; the client may end TCP itself (RFC 6455 7.1.1).
        for ws in self.ending:
            ws.abort()
        self.ending.clear()

    # --- the pump ------------------------------------------------------------------------------

    async def _pump(self) -> None:
        """Send what the session asks to send, then hand its events on."""
        await self._send()
        if self.handling:
            return  # the coroutine handing events on takes these too, in order
        self.handling = True
        try:
            while (event := self.session.next_event()) is not None:
                await self._event(event)
                await self._send()
        finally:
            self.handling = False

    async def _send(self) -> None:
        data = self.session.data_to_send()
        ws = self.ws
        if ws is None:
            return
        with contextlib.suppress(ConnectionClosed, OSError):  # the reader sees the close
            for message in data:
                await ws.send(message)

    async def _event(self, event: Event) -> None:
        if isinstance(event, Entries):
            sub = event.key
            assert isinstance(sub, _Sub)
            await self._deliver(sub, ("snapshot" if event.snapshot else "entries", event.raw))
        elif isinstance(event, Backfill):
            sub = event.key
            assert isinstance(sub, _Sub)
            # Only `monitor(..., backfill=S)` asks for it; batch readers never get it.
            if sub.options.get("backfill"):
                await self._deliver(sub, ("history", event.history))
        elif isinstance(event, Lost):
            for sub in self.subs:
                sub.queue.put_nowait(("lost", event.reason))
        elif isinstance(event, Failed):
            assert isinstance(event.key, _Sub)
            self._fail(event.key, _failure(event))
        elif isinstance(event, Renew):
            assert isinstance(event.key, _Sub)
            self._spawn(self._renew(event.key))
        elif isinstance(event, Connected):
            self.answered = True
        elif isinstance(event, Closed):
            self.drained_within = event.within
        elif isinstance(event, Malformed):
            log.warning("pvwire stream: %s; reconnecting", event.message)
        elif isinstance(event, ServerError):
            log.warning("pvwire stream error %d: %s", event.code, event.message)
        # Attach and PingAnswered (no ping API here) need nothing more.

    async def _deliver(self, sub: _Sub, item: tuple[str, Any]) -> None:
        # Bounded per monitor: a slow consumer holds the reader, TCP pushes back and the server
        # conflates for us (section 9); the watchdog only counts time spent waiting in recv().
        while sub.queue.qsize() >= sub.limit and sub in self.subs:
            sub.space.clear()
            await sub.space.wait()
        if sub in self.subs:
            sub.queue.put_nowait(item)

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
            self.answered, self.drained_within = False, None
            try:
                ws = await connect(
                    self._url(),
                    subprotocols=[ALIGNED_SUBPROTOCOL, SUBPROTOCOL],
                    max_size=self.client.max_message_bytes,
                    open_timeout=10,
                    ssl=self.client.ssl_context,
                )
            except (OSError, HandshakeError, TimeoutError) as e:
                self.session.connect_failed(str(e))
            else:
                await self._connection(ws)
                if self.closing:
                    break
            await self._pump()  # the close's Lost or Failed events
            if self.answered:
                # The server answered: the next loss starts a new outage, whose first retry
                # comes within reconnect_base. A server refusing before HELLO (1013
                # TRY_AGAIN, an overloaded proxy) keeps the backoff growing.
                attempt = 0
            if self.subs and self.drained_within is not None:
                # The server is draining: elsewhere at once, spread over what it said
                # (PROTOCOL.md section 8); a failure of that reconnect backs off from 0.
                within = min(self.drained_within, self.client.reconnect_max)
                await asyncio.sleep(random.uniform(0, within))
                attempt = 0
            elif self.subs:
                await asyncio.sleep(self.client._backoff(attempt))
                attempt += 1

    async def _connection(self, ws: Connection) -> None:
        """Run one connection until it closes; the session learns how it ended."""
        session, loop = self.session, asyncio.get_running_loop()
        self.ws = ws
        session.connection_made(loop.time())
        try:
            while True:
                await self._pump()
                if session.close_request is not None:
                    # Not waiting for the answer: after a heartbeat timeout the server may be
                    # gone, and the loss is reported (and the reconnect starts) now, not after
                    # CLOSE_TIMEOUT.
                    code, reason = session.close_request
                    ws.start_close(code, reason[:100])
                    session.connection_lost(code, reason)
                    return
                try:
                    async with asyncio.timeout_at(session.deadline()):
                        data = await ws.recv()
                except TimeoutError:
                    session.timer(loop.time())
                    continue
                session.receive(data, loop.time())
        except ConnectionClosed as e:  # the code received, else the one sent, else 1006
            session.connection_lost(e.code, e.reason)
        except OSError as e:
            session.connection_lost(closecodes.ABNORMAL, str(e))
        finally:
            self.ws = None
            self.ending = {c for c in self.ending if not c.closed}
            if not ws.closed:
                self.ending.add(ws)

    # --- re-registration -----------------------------------------------------------------------

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
        """Register again and hand the session the new token (the answer to ERROR 4401/4402,
        or a token known to be expired); without a connection now, the next HELLO attaches it."""
        if await self._reregister(sub):
            self.session.set_token(
                sub, sub.reg.token, sub.ids_attached, expires_at=self._expiry(sub.reg),
                now=self._now(),
            )  # fmt: skip
            await self._pump()

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def _failure(event: Failed) -> Exception:
    """The exception a monitor raises for a subscription the session ended."""
    if event.kind == "refused":
        assert event.code is not None
        if event.code == closecodes.TOO_MANY_CHANNELS:
            return TooManyChannels(f"attach refused: {event.code} {event.message}")
        return StreamRefused(event.code, event.message)
    if event.kind == "ended":
        if event.code is not None:
            return StreamRefused(event.code, event.message)
        return PvwireError(event.message, code="DETACHED")
    if event.kind == "closed":
        assert event.code is not None
        return StreamClosed(event.code, event.message)
    return ProtocolError(event.message)
