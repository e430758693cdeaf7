"""The control plane: GraphQL queries and mutations (no GraphQL subscriptions: data streams over
the WebSocket). The schema equals protocol/schema.graphql (tests/test_graphql_schema.py).

GraphQL is good for asking and bad for streaming (DESIGN.md section 1), so everything here is a
thin adapter over the hub: resolve, call, convert.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from enum import Enum
from typing import Any, TypeVar

import numpy as np
import strawberry
from graphql import GraphQLError
from strawberry.extensions import MaxTokensLimiter, QueryDepthLimiter
from strawberry.scalars import JSON
from strawberry.types import Info

from .. import __version__
from ..access.identity import Identity
from ..core.archive import Note
from ..core.hub import Hub
from ..core.stats import HubSnapshot
from ..core.subscribe import StreamOptions
from ..errors import ChannelNotFound, ChannelTimeout, PvwireError
from ..format import format_value
from ..limits import (
    MAX_BACKFILL_S,
    MAX_COLUMNS,
    MAX_PUT_TIMEOUT_S,
    MAX_QUERY_TOKENS,
    MAX_RATE_HZ,
    MAX_SEARCH_RESULTS,
    MIN_PIXELS,
    integer,
    shown,
)
from ..logs import LoggingSchema
from ..model import ConnState as ModelConnState
from ..model import Limits as ModelLimits
from ..model import Metadata as ModelMetadata
from ..model import Reading, Severity, alarm_status_name
from ..worker import WorkerIdentity
from .query_cost import QueryCost, ValueBudget, ValueTooLarge

__all__ = ["make_schema"]


@strawberry.enum
class ConnectionState(Enum):
    CONNECTING = "CONNECTING"
    CONNECTED = "CONNECTED"
    DISCONNECTED = "DISCONNECTED"
    FAILED = "FAILED"
    NOT_FOUND = "NOT_FOUND"


# The alarm severities of model.py are GraphQL's `Severity` (its names are the enum's values).
strawberry.enum(Severity)


@strawberry.enum
class AccessLevel(Enum):
    READ = "READ"
    WRITE = "WRITE"


@strawberry.enum
class StreamMode(Enum):
    LATEST = "LATEST"
    ALL = "ALL"


@strawberry.type
class Time:
    seconds: float = strawberry.field(description="POSIX seconds (from the IOC timestamp)")
    nanoseconds: int
    iso: str = strawberry.field(description="ISO 8601, UTC, with nanoseconds")


@strawberry.type
class Alarm:
    severity: Severity
    status: str = strawberry.field(description="EPICS alarm status name, e.g. HIHI, UDF")
    message: str


@strawberry.type
class Limits:
    low: float | None
    high: float | None


@strawberry.type
class Metadata:
    type: str | None
    count: int | None
    description: str | None
    units: str | None
    precision: int | None
    form: str | None
    display: Limits | None
    control: Limits | None
    alarm: Limits | None
    warning: Limits | None
    choices: list[str] | None
    color_mode: str | None = strawberry.field(
        description="images: how the array's dims hold colour (mono, RGB1, RGB2, RGB3, or another"
        " areaDetector mode name); PROTOCOL.md section 4.5"
    )
    writable: bool = strawberry.field(
        description="pvwire's write rules allow puts and the upstream server grants write access"
    )


@strawberry.type
class Channel:
    id: str = strawberry.field(
        description="canonical id, with scheme: ca://NAME, pva://NAME, sim://..."
    )
    value: JSON | None
    display: str | None = strawberry.field(
        description="value formatted for people: precision and units applied, enum as its label"
    )
    time: Time | None
    alarm: Alarm | None
    connection: ConnectionState
    metadata: Metadata
    error: str | None = strawberry.field(
        description="why the channel could not be read; only set in channels(ids), "
        "where one failure must not hide the rest"
    )
    error_code: str | None = strawberry.field(
        description="machine-readable error code (NOT_FOUND, TIMEOUT, BAD_CHANNEL_ID...)"
    )


@strawberry.type
class PutResult:
    id: str
    ok: bool
    error: str | None
    error_code: str | None


@strawberry.type
class StreamChannel:
    sid: int = strawberry.field(
        description="index of the channel in the token; entries on the stream are keyed by it"
    )
    id: str
    access: AccessLevel = strawberry.field(
        description="what the caller may do with the channel: WRITE means puts are allowed "
        "by the access rules (the upstream may still refuse; see metadata.writable)"
    )
    metadata: Metadata | None


@strawberry.type
class StreamRegistration:
    token: str
    expires_at: float = strawberry.field(
        description="POSIX seconds after which the token can no longer be attached"
    )
    stream_path: str = strawberry.field(description="path of the WebSocket to attach the token to")
    channels: list[StreamChannel]


@strawberry.type
class ClientInfo:
    id: int
    address: str
    attachments: int
    channels: int
    queued_bytes: int
    conflated: float
    frames_sent: float
    bytes_sent: float
    connected_seconds: float
    endpoint: str = strawberry.field(description="stream or pvws")
    identity: str = strawberry.field(description="who the client's subscriptions were made by")


@strawberry.type
class UpstreamInfo:
    id: str
    subscribers: int
    updates: float
    update_rate: float
    connection: ConnectionState
    last_update: float | None = strawberry.field(
        description="POSIX seconds of the latest value's timestamp"
    )


@strawberry.type
class ServerInfo:
    version: str
    uptime: float
    tick_ms: float
    writes_enabled: bool
    loop_lag_ms: float
    ticks: float = strawberry.field(description="ticks since start")
    tick_seconds: float = strawberry.field(description="time spent in ticks since start")
    instance: str = strawberry.field(
        description="the `instance` setting (the host name unless configured)"
    )
    pid: int = strawberry.field(description="the process that answered")
    worker: int = strawberry.field(
        description="1..workers under `--workers N` (a replaced worker gets the next number), "
        "0 for a lone process; every worker has its own upstream monitors and clients"
    )
    workers: int = strawberry.field(description="worker processes started on this port")

    @strawberry.field(description="connected stream clients; needs an admin identity")
    def clients(self, info: Info) -> list[ClientInfo]:
        snap = _admin_snapshot(info)
        return [
            ClientInfo(
                id=c.number,
                address=c.address,
                attachments=c.attachments,
                channels=c.channels,
                queued_bytes=c.queued_bytes,
                conflated=float(c.conflated),
                frames_sent=float(c.frames_sent),
                bytes_sent=float(c.bytes_sent),
                connected_seconds=c.connected_seconds,
                endpoint=c.endpoint,
                identity=c.identity,
            )
            for c in snap.clients
        ]

    @strawberry.field(description="open upstream channels; needs an admin identity")
    def channels(self, info: Info) -> list[UpstreamInfo]:
        snap = _admin_snapshot(info)
        return [
            UpstreamInfo(
                id=ch.id,
                subscribers=ch.subscribers,
                updates=float(ch.updates),
                update_rate=ch.update_rate,
                connection=ConnectionState[ModelConnState(ch.state).name],
                last_update=ch.last_update,
            )
            for ch in snap.channels
        ]


def _admin_snapshot(info: Info) -> HubSnapshot:
    """Who is connected from where is for administrators only (an admin group, or without one
    configured, a request from this machine)."""
    hub = _hub(info)
    identity = _identity(info)
    if not hub.is_admin(identity):
        raise GraphQLError(
            f"{identity.describe()} is not an administrator of this server",
            extensions={"code": "FORBIDDEN"},
        )
    snap: HubSnapshot | None = info.context.get("snapshot")
    if snap is None:
        snap = info.context["snapshot"] = hub.snapshot()
    return snap


@strawberry.type(
    description="A channel's recent history as columns, one element per row, oldest first "
    "(DESIGN.md section 7c): every update as it came (resolution 0) or buckets of `resolution` "
    "seconds. A gap row (gap true, value null; for an array channel a row of nulls) is where "
    "the channel was away: a plot breaks its line there. An array channel's value, min and max "
    "hold a list of elements per row (its history is kept with --history-array-max)."
)
class History:
    id: str
    resolution: float = strawberry.field(
        description="seconds per bucket; 0: every update, as the IOC stamped it"
    )
    truncated: bool = strawberry.field(
        description="more rows matched than maxPoints even at the coarsest resolution: the "
        "newest were kept"
    )
    recorded_since: float | None = strawberry.field(
        description="POSIX seconds of the oldest data this resolution still holds"
    )
    seconds: JSON = strawberry.field(
        description="POSIX seconds of each point's IOC timestamp, or of each bucket's start"
    )
    nanoseconds: JSON
    value: JSON = strawberry.field(
        description="the point's value, or a bucket's last one; for an array channel "
        "(--history-array-max) a list of elements per row"
    )
    min: JSON = strawberry.field(
        description="a bucket's lowest value (arrays: element by element; points: the value)"
    )
    max: JSON = strawberry.field(
        description="a bucket's highest value (arrays: element by element; points: the value)"
    )
    mean: JSON = strawberry.field(description="a bucket's mean value (arrays: null)")
    count: JSON = strawberry.field(description="updates in the row (0 for a gap)")
    severity: JSON = strawberry.field(
        description="alarm severity as a number, 0 NO_ALARM to 3 INVALID (buckets: the highest)"
    )
    status: JSON = strawberry.field(description="EPICS alarm status code (buckets: 0)")
    gap: JSON
    archive: HistoryArchive | None = strawberry.field(
        default=None,
        description="the part older than the server's own history, from the facility's "
        "archive (--archiver; a bucket from it holds its mean as its value): null when no "
        "archiver holds this channel",
    )


@strawberry.enum(
    description="What became of a history's part older than the server's own (--archiver)"
)
class ArchivePart(Enum):
    JOINED = strawberry.enum_value(
        "JOINED",
        description="the archive's rows come first, up to "
        "`until`; the server's own from there on, none twice",
    )
    EMPTY = strawberry.enum_value(
        "EMPTY", description="the archive holds nothing there: a gap row stands at `since`"
    )
    MISSING = strawberry.enum_value(
        "MISSING",
        description="the archive could not be read "
        "(`reason` says why): a gap row stands at `since`, the "
        "server's own rows follow",
    )
    NOT_NEEDED = strawberry.enum_value(
        "NOT_NEEDED", description="the server's own history reaches back to `since`"
    )


@strawberry.type(description="The facility's archive behind a history (docs/ARCHIVER.md)")
class HistoryArchive:
    state: ArchivePart
    reason: str | None = strawberry.field(description="why the archive part is missing or empty")
    rows: int = strawberry.field(description="how many of the first rows came from the archive")
    until: float | None = strawberry.field(
        description="POSIX seconds of the seam: the archive's rows are older, the server's not"
    )


@strawberry.input
class PutInput:
    id: str
    value: JSON


@strawberry.input
class SubscribeOptions:
    max_rate: float = strawberry.field(
        default=0.0,
        description="at most this many DATA groups per second for this subscription; "
        f"0 = every tick; at most {shown('max_rate_hz')}",
    )
    mode: StreamMode = StreamMode.LATEST
    max_columns: int = strawberry.field(
        default=0,
        description="1-D arrays of more than 2 x maxColumns elements arrive as the minimum and "
        "maximum of each of maxColumns equal slices, interleaved (metadata `reduced` says so "
        f"and gives the full length); 0 = whole arrays, else at most {shown('max_columns')}. "
        "LATEST mode only",
    )
    max_pixels: int = strawberry.field(
        default=0,
        description="images of more pixels arrive subsampled by a whole factor per axis to at "
        "most maxPixels pixels (metadata `reduced` gives the full dims and the step); "
        f"0 = whole images, else at least {shown('min_pixels')}. LATEST mode only",
    )
    backfill: float = strawberry.field(
        default=0.0,
        description="seconds of recorded history (server clock) each channel sends before its "
        "snapshot, as HISTORY messages (PROTOCOL.md section 2.8); 0 = none, at most "
        f"{shown('max_backfill_s')}",
    )


# --- conversions --------------------------------------------------------------------------------


def _hub(info: Info) -> Hub:
    hub: Hub = info.context["hub"]
    return hub


def _identity(info: Info) -> Identity:
    identity: Identity = info.context["identity"]
    return identity


def _error(exc: PvwireError) -> GraphQLError:
    return GraphQLError(str(exc), extensions={"code": exc.code})


def _json(value: Any) -> Any:
    """A value for the JSON response. Arrays stay numpy arrays: the router encodes them with
    orjson, ~10x faster than lists through the json module, NaN and infinities as null (JSON has
    neither)."""
    if isinstance(value, np.ndarray):
        if value.dtype.byteorder not in "=|" or not value.flags.c_contiguous:
            value = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("="))
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return _json(value.item())
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


def _limits(limits: ModelLimits | None) -> Limits | None:
    if limits is None:
        return None
    low, high = (x if math.isfinite(x) else None for x in limits)
    return None if low is None and high is None else Limits(low=low, high=high)


def _metadata(meta: ModelMetadata) -> Metadata:
    return Metadata(
        type=meta.type,
        count=meta.count,
        description=meta.description,
        units=meta.units,
        precision=meta.precision,
        form=meta.form,
        display=_limits(meta.display),
        control=_limits(meta.control),
        alarm=_limits(meta.alarm),
        warning=_limits(meta.warning),
        choices=list(meta.choices) if meta.choices is not None else None,
        color_mode=meta.color_mode,
        writable=bool(meta.writable),
    )


def _time(seconds: int, nanoseconds: int) -> Time:
    stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return Time(seconds=float(seconds), nanoseconds=nanoseconds, iso=f"{stamp}.{nanoseconds:09d}Z")


def _channel(cid: str, reading: Reading, budget: ValueBudget) -> Channel:
    budget.take(cid, reading.value)  # raises ValueTooLarge before any conversion work
    return Channel(
        id=cid,
        value=_json(reading.value),
        display=format_value(reading.value, reading.meta),
        time=_time(reading.seconds, reading.nanoseconds),
        alarm=Alarm(
            severity=Severity.of(reading.severity),
            status=alarm_status_name(reading.status),
            message=reading.message,
        ),
        connection=ConnectionState.CONNECTED,
        metadata=_metadata(reading.meta),
        error=None,
        error_code=None,
    )


def _failed(cid: str, exc: PvwireError) -> Channel:
    # As the stream says it (PROTOCOL.md section 3, `state`): NOT_FOUND when no server answered,
    # CONNECTING when the channel may still connect (no value within the timeout), FAILED when
    # waiting cannot help (a bad id, an unavailable protocol, access refused, ...); CONNECTED
    # when the value was read but is more than this answer may carry (TOO_LARGE).
    if isinstance(exc, ValueTooLarge):
        state = ConnectionState.CONNECTED
    elif isinstance(exc, ChannelNotFound):
        state = ConnectionState.NOT_FOUND
    elif isinstance(exc, ChannelTimeout):
        state = ConnectionState.CONNECTING
    else:
        state = ConnectionState.FAILED
    return Channel(
        id=cid,
        value=None,
        display=None,
        time=None,
        alarm=None,
        connection=state,
        metadata=_metadata(ModelMetadata()),
        error=str(exc),
        error_code=exc.code,
    )


# --- root types ---------------------------------------------------------------------------------


@strawberry.type(
    description="Limits (PROTOCOL.md section 11; defaults of this server's settings): a query "
    f"nests at most {shown('max_query_depth')} and holds at most {shown('max_query_tokens')}; "
    f"its cost (each field 1, each alias and fragment use again, each id in ids or puts 1) is "
    f"at most {shown('max_query_cost')} per request and {shown('max_cost_per_s')} per "
    f"identity; a response carries at most {shown('max_graphql_elements')} of arrays; "
    f"channels(ids) takes at most {shown('max_channels_per_subscription')}, each id at most "
    f"{shown('max_id_length')}; search returns at most {shown('max_search_results')}"
)
class Query:
    @strawberry.field(
        description="read one channel (from the cache when it is monitored); "
        "errors: NOT_FOUND, TIMEOUT, BAD_CHANNEL_ID"
    )
    async def channel(self, info: Info, id: str, timeout: float = 3.0) -> Channel:
        try:
            cid, reading = await _hub(info).get(id, _clamp_timeout(timeout), _identity(info))
            return _channel(cid, reading, info.context["budget"])
        except PvwireError as exc:
            raise _error(exc) from None

    @strawberry.field(
        description="read several channels; a channel that cannot be read comes back with "
        "its connection (NOT_FOUND, CONNECTING when no value came within the timeout, "
        "CONNECTED for a value too large for this answer, FAILED otherwise), error and "
        "errorCode, instead of failing the query"
    )
    async def channels(self, info: Info, ids: list[str], timeout: float = 3.0) -> list[Channel]:
        hub = _hub(info)
        _check_count(hub, ids)

        async def one(i: str) -> Channel:
            try:
                cid, reading = await hub.get(i, _clamp_timeout(timeout), _identity(info))
                return _channel(cid, reading, info.context["budget"])
            except PvwireError as exc:
                return _failed(i, exc)

        return await _in_slices(one, ids)

    @strawberry.field(
        description="glob pattern (*, ?, [..]) over catalogue, active and sim channels; "
        "ids returned in sorted order"
    )
    def search(self, info: Info, pattern: str, limit: int = 100) -> list[str]:
        return _hub(info).search(pattern, min(limit, MAX_SEARCH_RESULTS), _identity(info))

    @strawberry.field(
        description="recent history of a monitored channel between since and until (POSIX "
        "seconds, IOC time; default: all that is held), as points or, when more than maxPoints, "
        "the finest buckets that fit; an array channel's rows count their elements against "
        "the response's element cap and are fewer when they would not fit it (down to one); "
        "with an archiver holding the channel (--archiver) and a since, what is older than the "
        "server's own history comes from the archive first, in the same resolution (`archive` "
        "says how, and why when it could not); "
        "errors: NO_HISTORY, BAD_CHANNEL_ID, FORBIDDEN, TOO_LARGE"
    )
    async def history(
        self,
        info: Info,
        id: str,
        since: float | None = None,
        until: float | None = None,
        max_points: int = 1000,
    ) -> History:
        hub = _hub(info)
        budget: ValueBudget = info.context["budget"]
        if not 0 < max_points <= budget.limit // HISTORY_COLUMNS:
            raise GraphQLError(
                f"maxPoints must be between 1 and {budget.limit // HISTORY_COLUMNS:,}",
                extensions={"code": "BAD_REQUEST"},
            )
        lo = 0 if since is None else _ns(since)
        hi = 2**62 if until is None else _ns(until)
        try:
            # Every history of one request shares one deadline for its archive reads.
            reach = info.context.get("archive_reach")
            if reach is None:
                reach = info.context["archive_reach"] = hub.archive_reach(_identity(info))
            cid, rows, note = await hub.history_spanning(
                id, lo, hi, max_points, _identity(info), reach
            )
            per_row = HISTORY_COLUMNS
            if rows.value.ndim == 2:
                # An array channel: value, min and max hold a frame per row. Fewer rows are
                # asked for when these do not fit what the response may still carry, so the
                # answer is coarser (or truncated) rather than refused.
                per_row += 3 * (rows.value.shape[1] - 1)
                fit = budget.left // per_row
                if 0 < fit < len(rows):
                    cid, rows = hub.history(id, lo, hi, fit, _identity(info))
            # Every column counts against the response's cap, as array elements do.
            budget.take(cid, np.broadcast_to(np.int8(0), (len(rows) * per_row,)))
        except PvwireError as exc:
            raise _error(exc) from None
        seconds, nanoseconds = np.divmod(rows.t, 1_000_000_000)
        return History(
            id=cid,
            resolution=rows.resolution / 1e9,
            truncated=rows.truncated,
            recorded_since=rows.since / 1e9 if rows.since else None,
            seconds=_json(seconds),
            nanoseconds=_json(nanoseconds),
            value=_json(rows.value),
            min=_json(rows.min),
            max=_json(rows.max),
            mean=_json(rows.mean),
            count=_json(rows.count),
            severity=_json(rows.severity),
            status=_json(rows.status),
            gap=_json(rows.gap),
            archive=None if note is None else _archive(note),
        )

    @strawberry.field
    def server(self, info: Info) -> ServerInfo:
        hub = _hub(info)
        worker = info.context.get("worker") or WorkerIdentity.current(hub.settings.instance)
        snap = hub.snapshot(detail=False)
        return ServerInfo(
            version=__version__,
            uptime=snap.uptime,
            tick_ms=hub.settings.tick_ms,
            writes_enabled=hub.writes_enabled,
            loop_lag_ms=snap.loop_lag * 1000.0,
            ticks=float(snap.ticks),
            tick_seconds=snap.tick_seconds,
            instance=worker.instance,
            pid=worker.pid,
            worker=worker.worker,
            workers=worker.workers,
        )


def _archive(note: Note) -> HistoryArchive:
    return HistoryArchive(
        state=ArchivePart(note.state),
        reason=note.reason or None,
        rows=note.rows,
        until=note.seam / 1e9 if note.seam else None,
    )


# Columns of a `history` answer: each row costs this many elements of the response's cap.
HISTORY_COLUMNS = 10


def _ns(posix_seconds: float) -> int:
    if not math.isfinite(posix_seconds):
        raise GraphQLError(
            "since and until must be finite POSIX seconds", extensions={"code": "BAD_REQUEST"}
        )
    return max(0, min(int(posix_seconds * 1e9), 2**62))


T = TypeVar("T")
R = TypeVar("R")

# Gets and puts are started this many at a time, yielding to the event loop in between: starting
# 2,000 CA gets in one go held the loop (and every stream) for ~400 ms here.
SLICE = 50


async def _in_slices(call: Callable[[T], Awaitable[R]], items: list[T]) -> list[R]:
    tasks: list[asyncio.Task[R]] = []
    for start in range(0, len(items), SLICE):
        tasks += [asyncio.ensure_future(call(x)) for x in items[start : start + SLICE]]
        await asyncio.sleep(0)  # let the tick and other requests run between slices
    return list(await asyncio.gather(*tasks))


def _clamp_timeout(timeout: float) -> float:
    if not timeout > 0:
        raise GraphQLError(
            "timeout must be a positive number of seconds", extensions={"code": "BAD_REQUEST"}
        )
    return min(timeout, MAX_PUT_TIMEOUT_S)


def _check_count(hub: Hub, ids: list[str]) -> None:
    limit = hub.settings.max_channels_per_subscription
    if len(ids) > limit:
        raise GraphQLError(
            f"{len(ids)} channels requested; at most {limit} per request",
            extensions={"code": "TOO_MANY_CHANNELS"},
        )


@strawberry.type(
    description="Limits (PROTOCOL.md section 11; defaults of this server's settings): subscribe "
    f"and putMany take 1 to {shown('max_channels_per_subscription')}, each id at most "
    f"{shown('max_id_length')}; a token lives at most {shown('token_ttl_s')} (less when the "
    f"caller's credentials expire first); puts at most {shown('max_puts_per_s')} per identity; "
    f"a put's timeout at most {shown('max_put_timeout_s')}"
)
class Mutation:
    @strawberry.mutation(
        description="errors: WRITE_DENIED, READ_ONLY, TYPE_MISMATCH, TIMEOUT, NOT_FOUND, "
        "PUT_FAILED (in extensions.code)"
    )
    async def put(
        self, info: Info, id: str, value: JSON, wait: bool = False, timeout: float = 5.0
    ) -> PutResult:
        try:
            cid = await _hub(info).put(id, value, wait, _clamp_timeout(timeout), _identity(info))
        except PvwireError as exc:
            raise _error(exc) from None
        return PutResult(id=cid, ok=True, error=None, error_code=None)

    @strawberry.mutation(
        description="one result per put, in order; a failing put does not stop the others"
    )
    async def put_many(
        self, info: Info, puts: list[PutInput], wait: bool = False, timeout: float = 5.0
    ) -> list[PutResult]:
        hub = _hub(info)
        _check_count(hub, [p.id for p in puts])
        limit = _clamp_timeout(timeout)

        async def one(p: PutInput) -> PutResult:
            try:
                cid = await hub.put(p.id, p.value, wait, limit, _identity(info))
            except PvwireError as exc:
                return PutResult(id=p.id, ok=False, error=str(exc), error_code=exc.code)
            return PutResult(id=cid, ok=True, error=None, error_code=None)

        return await _in_slices(one, puts)

    @strawberry.mutation
    def subscribe(
        self, info: Info, ids: list[str], options: SubscribeOptions | None = None
    ) -> StreamRegistration:
        hub = _hub(info)
        options = options or SubscribeOptions()
        if not ids:
            raise GraphQLError(
                "subscribe needs at least one channel id", extensions={"code": "BAD_REQUEST"}
            )
        _check_count(hub, ids)
        if not 0 <= options.max_rate <= MAX_RATE_HZ or math.isnan(options.max_rate):
            raise GraphQLError(
                f"maxRate must be between 0 (every tick) and {MAX_RATE_HZ:g} Hz",
                extensions={"code": "BAD_REQUEST"},
            )
        _check_reduction(options)
        if not 0 <= options.backfill <= MAX_BACKFILL_S:
            raise GraphQLError(
                f"backfill must be between 0 and {MAX_BACKFILL_S:g} seconds",
                extensions={"code": "BAD_REQUEST"},
            )
        try:
            registration = hub.subscribe(
                ids,
                _identity(info),
                StreamOptions(
                    options.mode.value,
                    options.max_rate,
                    options.max_columns,
                    options.max_pixels,
                    options.backfill,
                ),
            )
        except PvwireError as exc:
            raise _error(exc) from None
        return StreamRegistration(
            token=registration.token,
            expires_at=float(registration.expires_at),
            stream_path="/stream",
            channels=[
                StreamChannel(
                    sid=ch.sid,
                    id=ch.id,
                    access=AccessLevel.WRITE if ch.may_write else AccessLevel.READ,
                    metadata=_metadata(ch.metadata) if ch.metadata is not None else None,
                )
                for ch in registration.channels
            ],
        )


def _check_reduction(options: SubscribeOptions) -> None:
    def bad(message: str) -> GraphQLError:
        return GraphQLError(message, extensions={"code": "BAD_REQUEST"})

    if not 0 <= options.max_columns <= MAX_COLUMNS:
        raise bad(f"maxColumns must be between 0 (whole arrays) and {MAX_COLUMNS}")
    if options.max_pixels < 0 or 0 < options.max_pixels < MIN_PIXELS:
        raise bad(f"maxPixels must be 0 (whole images) or at least {MIN_PIXELS}")
    if (options.max_columns or options.max_pixels) and options.mode != StreamMode.LATEST:
        # ALL mode keeps every update encoded as it came (for scripts); a display that reduces
        # arrays wants the latest one.
        raise bad("maxColumns and maxPixels need mode LATEST")


def make_schema(max_depth: int, max_cost: int = integer("max_query_cost")) -> strawberry.Schema:
    cost = type("BoundedQueryCost", (QueryCost,), {"limit": max_cost})
    return LoggingSchema(
        query=Query,
        mutation=Mutation,
        extensions=[
            # Bound the cost of any one request (DESIGN.md section 7; api/query_cost.py).
            lambda: QueryDepthLimiter(max_depth=max_depth),
            lambda: MaxTokensLimiter(max_token_count=MAX_QUERY_TOKENS),
            cost,
        ],
    )


if __name__ == "__main__":
    # Prints the schema that protocol/schema.graphql must equal (tests/test_graphql_schema.py;
    # scripts/generate_protocol.py writes the file).
    from ..config import Settings

    print(make_schema(Settings().max_query_depth).as_str())
