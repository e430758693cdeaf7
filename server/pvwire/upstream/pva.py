"""PVAccess backend (`pva://NAME`), built on p4p's client with `nt=False` (raw `Value`s, no NT
unwrapping per update).

Gets and puts use p4p's asyncio client. With --forward-identity, `put_as` writes on a connection
that carries the user's name (pva_identity.py), after the same type checks and value conversion.
Monitors are pvxs subscriptions of pvwire's own (pva_ingest.py, _pvaingest.cpp), drained in
batches on the event loop: no coroutine, no GIL on pvxs's thread, no loop wake-up per update, and
an ordinary update read in C++ (bench/README.md, "Per-update cost, fourth pass", has the figures
against p4p's asyncio client).

A PVA update carries the whole structure, metadata included, with the set of fields that changed
since the previous one. An ordinary update changes only value and time (`Value.changedSet()`);
metadata is rebuilt, and compared with the last one sent, and the alarm re-read, only when
something else changed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from p4p import _p4p
from p4p.client.asyncio import Context, Disconnected, RemoteError
from p4p.client.raw import Cancelled, Finished

from ..errors import (
    BackendUnavailable,
    ChannelNotFound,
    ChannelTimeout,
    IocDenied,
    PutRejected,
    TypeMismatch,
)
from ..limits import integer
from ..model import ALARM_STATUS_NAMES, ConnState, Limits, Metadata, Reading, Value, dtype_name
from .base import Backend, ChannelSink, Monitor
from .convert import coerce_put_value
from .ntndarray import color_mode, decode_ntndarray, frame_dtype
from .pva_identity import IdentityConnections, PvaSearch, Unreachable
from .pva_ingest import QUEUE_SIZE, UNAVAILABLE, PvaIngest
from .values import CallbackGuard, long_string, wire_value

if TYPE_CHECKING:
    from .pva_ingest import Subscription  # not there at run time when the module is missing

# p4p's C method, without the Python wrapper's frame (`Value.changedSet` adds ~0.2 µs).
_changed_set = _p4p._Value.changedSet

__all__ = ["PvaBackend", "PvaMonitor"]

log = logging.getLogger(__name__)

# pvData type codes (p4p Type.aspy) to metadata `type`.
_CODE_NAMES = {
    "?": "bool",
    "s": "string",
    "b": "int8",
    "B": "uint8",
    "h": "int16",
    "H": "uint16",
    "i": "int32",
    "I": "uint32",
    "l": "int64",
    "L": "uint64",
    "f": "float32",
    "d": "float64",
}
_NT_SCALAR = "epics:nt/NTScalar:"
_NT_SCALAR_ARRAY = "epics:nt/NTScalarArray:"
_NT_ENUM = "epics:nt/NTEnum:"
_NT_NDARRAY = "epics:nt/NTNDArray:"
_NT_TABLE = "epics:nt/NTTable:"
_META_FIELDS = ("display", "control", "valueAlarm")

# Value decoders, chosen once per connection from the structure's id and value type.
_SCALAR, _BOOL, _ARRAY, _BOOL_ARRAY, _ENUM, _NDARRAY, _TABLE, _STRUCT, _LONG_STRING = range(9)

# Put types remembered per name (see PvaBackend._types).
MAX_TYPES = integer("pva_max_types")

# What an ordinary update changes (`Value.changedSet()`): value and time. Anything else (alarm,
# metadata, enum labels) sends the update down the slow path that re-reads them (_pvaingest.cpp
# applies the same rule to the fast path).
_PLAIN_CHANGES = frozenset(
    (
        "value",
        "value.index",
        "timeStamp",
        "timeStamp.secondsPastEpoch",
        "timeStamp.nanoseconds",
        "timeStamp.userTag",
    )
)


@dataclass(frozen=True, slots=True)
class _Shape:
    """How to read one structure: decoder, which fields hold metadata, time and alarm."""

    kind: int
    type_name: str
    is_array: bool
    meta_fields: tuple[str, ...]
    has_time: bool
    has_alarm: bool

    @property
    def fast(self) -> bool:
        """Whether the fast path reads it (`value` as p4p gives it, and a timeStamp)."""
        return self.kind in (_SCALAR, _ARRAY) and self.has_time


def _shape(v: Any, name: str = "") -> _Shape:
    t = v.type()
    keys = set(t.keys())
    nt_id = v.getID()
    code = t.aspy("value") if "value" in keys else None
    has_time = "timeStamp" in keys
    has_alarm = "alarm" in keys
    meta_fields = tuple(f for f in _META_FIELDS if f in keys)
    if nt_id.startswith(_NT_ENUM):
        return _Shape(_ENUM, "enum", False, (*meta_fields, "value.choices"), has_time, has_alarm)
    if nt_id.startswith(_NT_NDARRAY):
        # The colour mode, element type and shape may change with any frame's attributes,
        # codec or dims: metadata is rebuilt when they change (and sent only if it differs).
        nd_fields = (*meta_fields, "attribute", "codec", "dimension")
        return _Shape(_NDARRAY, "ndarray", True, nd_fields, has_time, has_alarm)
    if nt_id.startswith(_NT_TABLE):
        return _Shape(_TABLE, "table", False, (), has_time, has_alarm)
    if isinstance(code, str) and (
        nt_id.startswith((_NT_SCALAR, _NT_SCALAR_ARRAY)) or code.lstrip("a") in _CODE_NAMES
    ):
        is_array = code.startswith("a")
        if name.endswith("$") and code in ("ab", "aB"):
            # `NAME.VAL$`: QSRV serves a long string as a char array; clients get the text.
            return _Shape(_LONG_STRING, "string", False, meta_fields, has_time, has_alarm)
        type_name = _CODE_NAMES.get(code.lstrip("a"), "struct")
        if type_name == "bool":
            kind = _BOOL_ARRAY if is_array else _BOOL
        else:
            kind = _ARRAY if is_array else _SCALAR
        return _Shape(kind, type_name, is_array, meta_fields, has_time, has_alarm)
    return _Shape(_STRUCT, "struct", False, (), has_time, has_alarm)


def _decode(kind: int, v: Any) -> Value:
    """The value of `v` in a form of PROTOCOL.md section 4 (the value contract, values.py)."""
    if kind in (_SCALAR, _ARRAY):
        return wire_value(v["value"])  # p4p: int/float/str, ndarray, or list of str
    if kind == _ENUM:
        return int(v["value.index"])
    if kind == _BOOL:
        return int(v["value"])
    if kind == _BOOL_ARRAY:
        # The wire has no bool dtype: a uint8 view of the same memory (no copy).
        return np.asarray(v["value"]).view(np.uint8)
    if kind == _NDARRAY:
        return wire_value(decode_ntndarray(v))
    if kind == _LONG_STRING:
        return long_string(v["value"])
    if kind == _TABLE:
        return wire_value(v["value"].todict())
    # Any other structure: p4p's todict gives nested dicts, ndarrays, lists for structure and
    # union arrays, and for a union the value of its selected member (None if none).
    return wire_value(v.todict())


def _limits(sub: dict[str, Any], low: str, high: str) -> Limits | None:
    if low in sub and high in sub:
        return (float(sub[low]), float(sub[high]))
    return None


def _meta(shape: _Shape, v: Any) -> Metadata:
    if shape.kind in (_TABLE, _STRUCT):
        return Metadata(type=shape.type_name)
    type_name = shape.type_name
    if shape.kind == _LONG_STRING:
        return Metadata(type="string", count=1)
    color = None
    if shape.kind == _NDARRAY:
        type_name = dtype_name(frame_dtype(v))
        color = color_mode(v)
    display: dict[str, Any] = v["display"].todict() if "display" in shape.meta_fields else {}
    control: dict[str, Any] = v["control"].todict() if "control" in shape.meta_fields else {}
    alarm: dict[str, Any] = v["valueAlarm"].todict() if "valueAlarm" in shape.meta_fields else {}
    form = display.get("form")
    form_name = None
    if isinstance(form, dict) and 0 <= form.get("index", -1) < len(form.get("choices", ())):
        form_name = form["choices"][form["index"]]
    choices = tuple(v["value.choices"]) if shape.kind == _ENUM else None
    return Metadata(
        type=type_name,
        # PVA has no maximum element count (CA's NELM); the current length changes with
        # every update, so arrays leave `count` unknown.
        count=None if shape.is_array else 1,
        description=display.get("description"),
        units=display.get("units"),
        precision=display.get("precision"),
        form=form_name,
        display=_limits(display, "limitLow", "limitHigh"),
        control=_limits(control, "limitLow", "limitHigh"),
        alarm=_limits(alarm, "lowAlarmLimit", "highAlarmLimit"),
        warning=_limits(alarm, "lowWarningLimit", "highWarningLimit"),
        choices=choices,
        color_mode=color,
    )


def _time(shape: _Shape, v: Any) -> tuple[int, int]:
    if shape.has_time:
        return v["timeStamp.secondsPastEpoch"], v["timeStamp.nanoseconds"]
    # a structure without a timeStamp: stamp it on arrival
    secs, nsec = divmod(time.time_ns(), 1_000_000_000)
    return secs, nsec


def _alarm(shape: _Shape, v: Any) -> tuple[int, int, str]:
    if shape.has_alarm:
        message = v["alarm.message"]
        # PVA's status is pvData's code (1 = DEVICE ...), not EPICS menuAlarmStat; QSRV names the
        # record's menuAlarmStat status in the message, which PROTOCOL.md section 3 asks for.
        return v["alarm.severity"], _STATUS_BY_NAME.get(message, 0), message
    return 0, 0, ""


_STATUS_BY_NAME = {name: number for number, name in enumerate(ALARM_STATUS_NAMES)}


@dataclass(frozen=True, slots=True)
class _PutType:
    type_name: str
    is_array: bool
    choices: tuple[str, ...] | None


class PvaMonitor:
    """One pvxs subscription feeding one sink, drained in batches on the loop (pva_ingest.py).

    An ordinary update of a connected scalar or array (only value and time changed) goes from
    the subscription straight to the sink's `on_update` in C++, with the alarm this monitor last
    read (`Subscription.fast`). Everything else comes here through `_item`, which turns that
    fast path on again when the next update may take it.
    """

    __slots__ = (
        "_alarm",
        "_backend",
        "_closed",
        "_connected",
        "_fast",
        "_guard",
        "_ingest",
        "_meta",
        "_name",
        "_shape",
        "_sink",
        "_sub",
    )

    def __init__(self, backend: PvaBackend, name: str, sink: ChannelSink) -> None:
        self._backend = backend
        self._name = name
        self._sink = sink
        self._closed = False
        self._connected = False
        # Whether an ordinary update may take the fast path: connected, not failed, and a scalar
        # or array with a timeStamp (`_Shape.fast`).
        self._fast = False
        self._shape: _Shape | None = None
        self._meta: Metadata | None = None
        self._alarm: tuple[int, int, str] = (0, 0, "")
        self._sub: Subscription | None = None
        # The context this monitor subscribes on, closed() on it (the backend may have a new one).
        self._ingest = backend.ingest()
        self._guard = CallbackGuard(f"pva://{name}", sink)
        backend.monitored[name] = backend.monitored.get(name, 0) + 1
        self._subscribe()

    def _subscribe(self) -> None:
        self._sub = self._ingest.subscribe(
            self._name, self._sink.on_update, self._item, self._failed
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sub is not None:
            self._sub.close()
            self._sub = None
            self._ingest.closed()
        backend = self._backend
        left = backend.monitored.pop(self._name, 1) - 1
        if left > 0:
            backend.monitored[self._name] = left
        else:
            backend.release(self._name)

    def _item(self, item: Any) -> None:
        """Anything but an ordinary update on the fast path: p4p's Value or exception.

        A failure in one update stays in this channel (CallbackGuard: FAILED with the reason, a
        later good update recovers it).
        """
        try:
            self._event(item, None)
        except Exception as exc:
            self._fast = False  # the next update comes here again, which recovers
            self._guard.fail(exc)
            return
        if self._fast and self._sub is not None:
            self._sub.fast(*self._alarm)

    def _failed(self, exc: BaseException) -> None:
        """The sink's `on_update` raised on the fast path (which is off now)."""
        self._fast = False
        self._guard.fail(exc)

    def _event(self, v: Any, changed: set[str] | None) -> None:
        shape = self._shape
        if self._connected and shape is not None and not isinstance(v, Exception):
            if changed is None:
                changed = _changed_set(v, False, False)
            if not changed <= _PLAIN_CHANGES:
                # Something besides value and time changed (rare): check metadata and re-read the
                # alarm. An ordinary update skips both (1.4 µs for changedSet against 2.5 µs for
                # `changed(*meta_fields)` plus 1.2 µs for the alarm's three fields, measured).
                if shape.meta_fields and v.changed(*shape.meta_fields):
                    self._publish_meta(shape, v)
                self._alarm = _alarm(shape, v)
            secs, nsec = _time(shape, v)
            value = _decode(shape.kind, v)
            if self._guard.failed:
                self._guard.recover()
            self._fast = shape.fast
            self._sink.on_update(value, secs, nsec, *self._alarm)
            return
        if isinstance(v, Exception):
            self._fast = False
            self._on_exception(v)
            return
        # First update after (re)connecting: the structure may differ from before (IOC reload).
        shape = self._shape = _shape(v, self._name)
        value = _decode(shape.kind, v)  # raises before CONNECTED if the value cannot be sent
        self._publish_meta(shape, v)
        self._alarm = _alarm(shape, v)
        self._connected = True
        self._guard.failed = False
        self._sink.on_connection(ConnState.CONNECTED)
        secs, nsec = _time(shape, v)
        self._sink.on_update(value, secs, nsec, *self._alarm)
        self._fast = shape.fast

    def _publish_meta(self, shape: _Shape, v: Any) -> None:
        meta = _meta(shape, v)
        self._backend.remember(self._name, shape, meta)
        if meta != self._meta:
            self._meta = meta
            self._sink.on_meta(meta)

    def _on_exception(self, e: Exception) -> None:
        # Finished first: p4p's Finished is a Disconnected.
        if isinstance(e, Finished):
            # The server ended the subscription; pvxs delivers nothing more, so subscribe again.
            if self._connected or self._guard.failed:
                self._connected = False
                self._guard.failed = False
                self._sink.on_connection(ConnState.DISCONNECTED, "subscription finished")
            if self._sub is not None:
                self._sub.close()
                self._ingest.closed()
            self._subscribe()
        elif isinstance(e, Disconnected):
            # Only a channel that was connected (or failed) can become DISCONNECTED.
            if self._connected or self._guard.failed:
                self._connected = False
                self._guard.failed = False
                self._sink.on_connection(ConnState.DISCONNECTED, "server disconnected")
        elif isinstance(e, Cancelled):
            pass
        else:
            self._connected = False
            self._sink.on_connection(ConnState.FAILED, str(e) or type(e).__name__)


def _write_error(uri: str, value: object, type_name: str, e: Exception) -> Exception:
    text = str(e)
    lower = text.lower()
    if isinstance(e, RemoteError):
        if any(w in lower for w in ("denied", "permission", "not permitted", "read-only")):
            return IocDenied(f"{uri}: {text}")
        return PutRejected(f"{uri}: {text}")
    return TypeMismatch(f"cannot write {value!r:.60} to {uri} ({type_name}): {text}")


class _UnavailableMonitor:
    """A pva:// monitor without the compiled module: FAILED, saying why and how to build it."""

    __slots__ = ("_handle",)

    def __init__(self, sink: ChannelSink, reason: str) -> None:
        # Reported from the loop, not from inside monitor(): the caller is still setting up.
        loop = asyncio.get_running_loop()
        self._handle: asyncio.Handle | None = loop.call_soon(
            sink.on_connection, ConnState.FAILED, reason
        )

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def _converted(name: str, value: object, put_type: _PutType) -> tuple[str, Any]:
    """The field a put writes (`value`, or `value.index` of an enum) and `value` converted to
    its type; ("", value) for a structure, whose fields p4p assigns (its errors: TypeMismatch)."""
    uri = f"pva://{name}"
    if put_type.type_name == "enum":
        return "value.index", coerce_put_value(uri, value, "enum", False, put_type.choices)
    if put_type.type_name in ("struct", "table", "ndarray"):
        return "", value
    payload = coerce_put_value(uri, value, put_type.type_name, put_type.is_array, None)
    if name.endswith("$") and put_type.type_name == "string":
        # `NAME.VAL$` is a char array upstream: the text's bytes and its terminating NUL.
        payload = np.frombuffer(payload.encode() + b"\0", dtype=np.uint8)
    return "value", payload


class PvaBackend(Backend):
    """`pva://` channels through one p4p asyncio Context, created on first use.

    The context reads EPICS_PVA_* from the environment when it is created, so creating it late
    lets the process set its environment first.

    Without the compiled module (pva_ingest.UNAVAILABLE) every pva:// channel is unavailable,
    gets and puts included (they would work through p4p, but a PVA that answers gets and never
    updates is harder to diagnose than one that says what is missing).
    """

    scheme = "pva"

    def __init__(
        self, queue_size: int = QUEUE_SIZE, forward_identity: bool = False, host_name: str = ""
    ) -> None:
        """`forward_identity`: `put_as` writes on a connection carrying the user's name, with
        `host_name` as the host sent there, by default this machine's (as pvxs sends it)."""
        self.unavailable = UNAVAILABLE
        self.forwards_identity = forward_identity
        self._connections = (
            IdentityConnections(host_name or socket.gethostname()) if forward_identity else None
        )
        self._search = PvaSearch()
        if UNAVAILABLE is not None:
            log.error("pva:// channels are unavailable: %s", UNAVAILABLE)
        self._ctx: Context | None = None
        self._queue_size = queue_size
        # Per channel name, what a put needs: its type and enum labels, learned from monitors
        # and gets. A name in here has answered at least once, so a later get timeout means
        # "slow or gone" (ChannelTimeout) rather than "never found" (ChannelNotFound).
        # Bounded (least recently used dropped first): gets of ever new names must not grow it.
        self._types: OrderedDict[str, _PutType] = OrderedDict()
        # Open monitors per channel name: p4p keeps their channels for gets and puts (release).
        self.monitored: dict[str, int] = {}
        self._ingest: PvaIngest | None = None

    def context(self) -> Context:
        if self._ctx is None:
            self._ctx = Context("pva", nt=False)
        return self._ctx

    def ingest(self) -> PvaIngest:
        """The monitors' context, drained on the running loop (the first monitor's)."""
        if self._ingest is None:
            self._ingest = PvaIngest(asyncio.get_running_loop(), self._queue_size)
        return self._ingest

    def remember(self, name: str, shape: _Shape, meta: Metadata) -> None:
        self._types[name] = _PutType(shape.type_name, shape.is_array, meta.choices)
        self._types.move_to_end(name)
        while len(self._types) > MAX_TYPES:
            self._types.popitem(last=False)

    def release(self, name: str) -> None:
        """Close p4p's cached channel for `name` unless the name is monitored.

        p4p keeps every channel it opened in its context's cache; without this, gets of names
        no server has would leave channels searching for the life of the process. A monitored
        name keeps its channel, so that gets and puts of it need no new search each time.
        """
        if self._ctx is not None and name not in self.monitored:
            self._ctx.disconnect(name)

    def monitor(self, name: str, sink: ChannelSink) -> Monitor:
        if self.unavailable is not None:
            return _UnavailableMonitor(sink, self.unavailable)
        return PvaMonitor(self, name, sink)

    def _check_available(self, name: str) -> None:
        if self.unavailable is not None:
            raise BackendUnavailable(f"pva://{name}: {self.unavailable}")

    async def _get_value(self, name: str, timeout: float) -> Any:
        self._check_available(name)
        try:
            return await asyncio.wait_for(self.context().get(name), timeout)
        except TimeoutError:
            if name in self._types:
                raise ChannelTimeout(f"pva://{name}: no answer within {timeout:g} s") from None
            raise ChannelNotFound(
                f"pva://{name}: no server answered within {timeout:g} s"
            ) from None
        except RemoteError as e:
            raise ChannelNotFound(f"pva://{name}: {e}") from None
        finally:
            self.release(name)

    async def get(self, name: str, timeout: float) -> Reading:
        v = await self._get_value(name, timeout)
        shape = _shape(v, name)
        meta = _meta(shape, v)
        self.remember(name, shape, meta)
        secs, nsec = _time(shape, v)
        sev, stat, msg = _alarm(shape, v)
        return Reading(
            value=_decode(shape.kind, v),
            seconds=secs,
            nanoseconds=nsec,
            severity=sev,
            status=stat,
            message=msg,
            meta=meta,
        )

    async def _put_type(self, name: str, value: object, timeout: float) -> _PutType:
        put_type = self._types.get(name)
        if put_type is None or (
            put_type.type_name == "enum"
            and isinstance(value, str)
            and value not in (put_type.choices or ())
        ):
            # Unknown channel, or a label we do not know yet: learn the type (and labels) first.
            await self.get(name, timeout)
            put_type = self._types[name]
        return put_type

    async def put_as(self, user: str, name: str, value: object, wait: bool, timeout: float) -> None:
        """Convert as `put` does, then write on `user`'s own connection to the server: only the
        value of an NTScalar, NTScalarArray or NTEnum (the field the IOC's record holds)."""
        if self._connections is None:
            raise RuntimeError("puts as a user need PvaBackend(forward_identity=True)")
        self._check_available(name)
        deadline = time.monotonic() + timeout
        uri = f"pva://{name}"
        put_type = await self._put_type(name, value, timeout)
        path, payload = _converted(name, value, put_type)
        if not path:
            raise TypeMismatch(
                f"cannot write {uri} ({put_type.type_name}) as a user: puts that carry the "
                "user's name write scalars, strings, enums and numeric arrays (NTScalar, "
                "NTEnum, NTScalarArray)"
            )
        remembered = self._search.known(name) is not None
        for attempt in (1, 2):
            address = await self._search.find(name, max(deadline - time.monotonic(), 0.001))
            left = max(deadline - time.monotonic(), 0.001)
            try:
                await self._connections.put(user, address, name, path, payload, wait, left)
                return
            except Unreachable:
                # A remembered server that is gone (an IOC restarted elsewhere): nothing was
                # sent, so search again and put once more.
                self._search.forget(name)
                if attempt == 2 or not remembered:
                    raise
            except (ChannelNotFound, PutRejected, ChannelTimeout):
                self._search.forget(name)  # the server may have moved: search again next time
                raise

    async def put(self, name: str, value: object, wait: bool, timeout: float) -> None:
        self._check_available(name)
        deadline = time.monotonic() + timeout
        uri = f"pva://{name}"
        put_type = await self._put_type(name, value, timeout)
        path, payload = _converted(name, value, put_type)
        if path == "value.index":
            payload = {path: payload}
        left = max(deadline - time.monotonic(), 0.001)
        try:
            # get=False: no extra round trip to read the current value before writing.
            await asyncio.wait_for(self.context().put(name, payload, wait=wait, get=False), left)
        except TimeoutError:
            raise ChannelTimeout(f"{uri}: put did not complete within {timeout:g} s") from None
        except (RemoteError, ValueError, TypeError, KeyError) as e:
            raise _write_error(uri, value, put_type.type_name, e) from None
        finally:
            self.release(name)

    def peer_refusals(self) -> dict[str, int]:
        """pva_identity.PEER_REASONS, counted by the put connections and the search."""
        if self._connections is None:
            return {}
        counts = dict(self._connections.refusals.counts)
        counts["search_reply"] += self._search.refused
        return counts

    async def close(self) -> None:
        if self._connections is not None:
            self._connections.close()
        self._search.close()
        if self._ingest is not None:
            self._ingest.close()
            self._ingest = None
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
