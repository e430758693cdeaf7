"""Channel Access backend (`ca://NAME`), built on aioca.

Each monitored channel holds two CA subscriptions on the same channel: one for values
(DBR_TIME, DBE_VALUE|DBE_ALARM) and one for properties (DBR_CTRL with count 1, DBE_PROPERTY) so a
change of EGU, limits or enum labels reaches clients without re-sending values. DESC is not part
of any DBR type, so it is read once per connection from `NAME.DESC`.

aioca calls plain (non-async) callbacks directly on the event loop thread, batched per loop
iteration, so the value callback does O(1) work and creates no task or future.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aioca import (
    DBE_PROPERTY,
    DBR_CHAR_STR,
    FORMAT_CTRL,
    FORMAT_TIME,
    CANothing,
    caget,
    cainfo,
    camonitor,
    caput,
    connect,
    purge_channel_caches,
)
from epicscorelibs.ca import cadef

from ..errors import (
    ChannelNotFound,
    ChannelTimeout,
    PutRejected,
    ReadOnlyChannel,
    TypeMismatch,
)
from ..model import ALARM_STATUS_NAMES, ConnState, Limits, Metadata, Reading, Value
from .base import Backend, ChannelSink, Monitor
from .convert import coerce_put_value
from .values import CallbackGuard, long_string, wire_value

__all__ = ["CaBackend", "CaMonitor"]

log = logging.getLogger(__name__)

# DBF field types as returned by ca_field_type (db_access.h).
DBF_STRING, DBF_SHORT, DBF_FLOAT, DBF_ENUM, DBF_CHAR, DBF_LONG, DBF_DOUBLE = range(7)
_TYPE_NAMES = {
    DBF_STRING: "string",
    DBF_SHORT: "int16",
    DBF_FLOAT: "float32",
    DBF_ENUM: "enum",
    DBF_CHAR: "uint8",
    DBF_LONG: "int32",
    DBF_DOUBLE: "float64",
}
_FLOAT_TYPES = (DBF_FLOAT, DBF_DOUBLE)
# caerr.h: DEFMSG(CA_K_WARNING, 47); epicscorelibs' cadef only names a few codes.
ECA_NOWTACCESS = 376

# How long a monitor waits for NAME.DESC before it publishes metadata without a description:
# DESC lives on the same IOC, so it normally answers within milliseconds.
DESC_TIMEOUT = 2.0

_STATUS_NAMES = ALARM_STATUS_NAMES
_N_STATUS = len(_STATUS_NAMES)


def _status_name(status: int) -> str:
    return _STATUS_NAMES[status] if 0 <= status < _N_STATUS else f"STATUS_{status}"


def _has_field(name: str) -> bool:
    """True for `X.EGU`, `X.{"dec":...}` and the like: DESC of those is not the record's."""
    return "." in name


def _limits(low: Any, high: Any) -> Limits:
    return (float(low), float(high))


def _is_long_string(name: str) -> bool:
    """`NAME.VAL$`: a long string served as a char array; aioca reads it as str."""
    return name.endswith("$")


def _meta_from_ctrl(
    ctrl: Any, field_type: int, count: int, writable: bool, name: str = ""
) -> Metadata:
    """Metadata from a DBR_CTRL value (or DBR_TIME for strings, which have no CTRL form)."""
    type_name = _TYPE_NAMES.get(field_type, "string")
    if field_type == DBF_CHAR and _is_long_string(name):
        # The value is text; `count` stays the most bytes it can hold.
        return Metadata(type="string", count=count, writable=writable)
    if field_type == DBF_ENUM and count != 1:
        # An ENUM array (waveform FTVL=ENUM): CA serves no labels for it, only the numbers.
        return Metadata(type="uint16", count=count, writable=writable)
    if field_type == DBF_ENUM:
        return Metadata(
            type="enum",
            count=count,
            choices=tuple(getattr(ctrl, "enums", ())),
            writable=writable,
        )
    if field_type == DBF_STRING or not hasattr(ctrl, "units"):
        return Metadata(type=type_name, count=count, writable=writable)
    precision = getattr(ctrl, "precision", None) if field_type in _FLOAT_TYPES else 0
    return Metadata(
        type=type_name,
        count=count,
        units=ctrl.units,
        precision=precision,
        display=_limits(ctrl.lower_disp_limit, ctrl.upper_disp_limit),
        control=_limits(ctrl.lower_ctrl_limit, ctrl.upper_ctrl_limit),
        alarm=_limits(ctrl.lower_alarm_limit, ctrl.upper_alarm_limit),
        warning=_limits(ctrl.lower_warning_limit, ctrl.upper_warning_limit),
        writable=writable,
    )


def _plain(value: Any) -> Value:
    """aioca's ca_float/ca_int/ca_str/ca_array carry per-update attributes; hand on plain types.

    Numeric arrays become a plain ndarray *view* (no copy of the data); STRING arrays, which
    aioca gives as numpy `<U` arrays, become lists of str (PROTOCOL.md section 4); anything the
    wire cannot carry raises UnsupportedValue (the value contract, upstream/values.py).
    """
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    return wire_value(value)


def _converter(name: str) -> Any:
    """The value conversion of a channel name: text for `NAME.VAL$`, else `_plain`."""
    return long_string if _is_long_string(name) else _plain


class CaMonitor:
    """One monitored CA channel: value + property subscriptions, DESC read once per connect."""

    __slots__ = (
        "_closed",
        "_connected",
        "_convert",
        "_ctrl_meta",
        "_desc",
        "_desc_state",
        "_desc_task",
        "_dropped_seen",
        "_guard",
        "_meta",
        "_name",
        "_pending",
        "_sink",
        "_subs",
        "_uri",
    )

    # _desc_state values: DESC not asked yet, being read, known (or given up on).
    _DESC_NONE, _DESC_BUSY, _DESC_DONE = 0, 1, 2

    def __init__(self, name: str, sink: ChannelSink) -> None:
        self._name = name
        self._uri = f"ca://{name}"
        self._sink = sink
        self._closed = False
        self._connected = False
        self._ctrl_meta: Metadata | None = None
        self._meta: Metadata | None = None
        self._desc: str | None = None
        # Names with a field have no DESC of their own: treat it as already known (absent).
        self._desc_state = self._DESC_DONE if _has_field(name) else self._DESC_NONE
        self._desc_task: asyncio.Task[None] | None = None
        # A value that arrived before the metadata was complete; delivered once it is.
        self._pending: Any = None
        self._dropped_seen = 0  # aioca's merged-update count already folded into a serial
        self._convert = _converter(name)
        self._guard = CallbackGuard(self._uri, sink)
        self._subs = [
            camonitor(
                name,
                self._on_value,
                format=FORMAT_TIME,
                notify_disconnect=True,
            ),
            # count=1: property events must not drag a whole waveform along with them.
            camonitor(
                name,
                self._on_ctrl,
                events=DBE_PROPERTY,
                format=FORMAT_CTRL,
                count=1,
            ),
        ]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sub in self._subs:
            sub.close()
        if self._desc_task is not None:
            self._desc_task.cancel()
            self._desc_task = None
        self._pending = None

    # -- aioca callbacks (event loop thread) ---------------------------------------------------

    # aioca ends a subscription whose callback raises: each callback contains its own failures
    # to this channel (FAILED with the reason) and a later good update recovers it.

    def _on_value(self, value: Any) -> None:
        try:
            self._value(value)
        except Exception as exc:
            self._guard.fail(exc)

    def _on_ctrl(self, ctrl: Any) -> None:
        try:
            self._ctrl(ctrl)
        except Exception as exc:
            self._guard.fail(exc)

    def _value(self, value: Any) -> None:
        if self._connected:
            # Hot path: one upstream update, one sink call.
            if isinstance(value, CANothing):
                self._on_disconnect()
                return
            secs, nsec = value.raw_stamp
            status = value.status
            # aioca merges updates that arrive while the event loop is busy, and counts them.
            dropped = self._subs[0].dropped_callbacks
            skipped = dropped - self._dropped_seen
            self._dropped_seen = dropped
            plain = self._convert(value)
            if self._guard.failed:
                self._guard.recover()
            self._sink.on_update(
                plain, secs, nsec, value.severity, status, _status_name(status), skipped
            )
            return
        if isinstance(value, CANothing):
            self._pending = None
            return
        self._pending = value
        self._maybe_ready()

    def _ctrl(self, ctrl: Any) -> None:
        if isinstance(ctrl, CANothing):
            return
        chan = self._subs[1].channel
        try:
            field_type = cadef.ca_field_type(chan)
            count = cadef.ca_element_count(chan)
            writable = bool(cadef.ca_write_access(chan))
        except Exception:  # channel dropped between the event and now; the next one will do
            return
        self._ctrl_meta = _meta_from_ctrl(ctrl, field_type, count, writable, self._name)
        if self._desc_state == self._DESC_NONE:
            self._desc_state = self._DESC_BUSY
            self._desc_task = asyncio.ensure_future(self._read_desc())
        self._publish_meta()
        self._maybe_ready()

    def _on_disconnect(self) -> None:
        self._connected = False
        self._pending = None
        self._guard.failed = False  # DISCONNECTED replaces FAILED; CONNECTED follows a reconnect
        # Read DESC again after the reconnect: the IOC may have been reloaded with a new one.
        if not _has_field(self._name) and self._desc_state == self._DESC_DONE:
            self._desc_state = self._DESC_NONE
        self._sink.on_connection(ConnState.DISCONNECTED, "IOC disconnected")

    # -- helpers --------------------------------------------------------------------------------

    async def _read_desc(self) -> None:
        try:
            desc = await caget(self._name + ".DESC", timeout=DESC_TIMEOUT)
            self._desc = str(desc)
        except asyncio.CancelledError:
            raise
        except Exception:  # no DESC field (e.g. a non-record server): publish without it
            log.debug("no DESC for %s", self._uri, exc_info=True)
        if self._closed:
            return
        self._desc_state = self._DESC_DONE
        self._desc_task = None
        try:
            self._publish_meta()
            self._maybe_ready()
        except Exception as exc:
            self._guard.fail(exc)

    def _publish_meta(self) -> None:
        if self._ctrl_meta is None or self._desc_state != self._DESC_DONE:
            return
        meta = self._ctrl_meta
        if self._desc is not None:
            meta = meta.replace(description=self._desc)
        if meta != self._meta:
            self._meta = meta
            self._sink.on_meta(meta)

    def _maybe_ready(self) -> None:
        """Report CONNECTED and the held value once metadata has gone out (base.py's order)."""
        if self._connected or self._pending is None or self._meta is None:
            return
        value, self._pending = self._pending, None
        plain = self._convert(value)  # raises before CONNECTED if the value cannot be sent
        self._connected = True
        self._guard.failed = False
        self._sink.on_connection(ConnState.CONNECTED)
        secs, nsec = value.raw_stamp
        status = value.status
        self._sink.on_update(plain, secs, nsec, value.severity, status, _status_name(status))


class CaBackend(Backend):
    """`ca://` channels through aioca. One process-wide libca context (aioca's)."""

    scheme = "ca"

    def __init__(self) -> None:
        # Enum labels per channel name, for puts by label; refreshed when a label is not found.
        self._choices: dict[str, tuple[str, ...]] = {}

    def monitor(self, name: str, sink: ChannelSink) -> Monitor:
        return CaMonitor(name, sink)

    async def _connect(self, name: str, timeout: float) -> float:
        """Wait for the channel; return the time left of `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            await connect(name, timeout=timeout)
        except CANothing:
            raise ChannelNotFound(f"ca://{name}: no server answered within {timeout:g} s") from None
        return max(deadline - time.monotonic(), 0.001)

    async def get(self, name: str, timeout: float) -> Reading:
        left = await self._connect(name, timeout)
        info = await cainfo(name, timeout=left)
        aws: list[Any] = [
            caget(name, format=FORMAT_TIME, timeout=left),
            caget(name, format=FORMAT_CTRL, count=1, timeout=left),
        ]
        if not _has_field(name):
            aws.append(caget(name + ".DESC", timeout=left, throw=False))
        try:
            results = await asyncio.gather(*aws)
        except CANothing as e:
            raise ChannelTimeout(f"ca://{name}: get did not complete: {e}") from None
        value, ctrl = results[0], results[1]
        meta = _meta_from_ctrl(ctrl, info.datatype, info.count, bool(info.write), name)
        if len(results) > 2 and not isinstance(results[2], CANothing):
            meta = meta.replace(description=str(results[2]))
        if info.datatype == DBF_ENUM and info.count == 1:
            self._choices[name] = meta.choices or ()
        secs, nsec = value.raw_stamp
        return Reading(
            value=_converter(name)(value),
            seconds=secs,
            nanoseconds=nsec,
            severity=value.severity,
            status=value.status,
            message=_status_name(value.status),
            meta=meta,
        )

    async def _enum_choices(self, name: str, refresh: bool, timeout: float) -> tuple[str, ...]:
        choices = self._choices.get(name)
        if choices is None or refresh:
            try:
                ctrl = await caget(name, format=FORMAT_CTRL, timeout=timeout)
            except CANothing as e:
                raise ChannelTimeout(f"ca://{name}: reading enum labels failed: {e}") from None
            choices = tuple(getattr(ctrl, "enums", ()))
            self._choices[name] = choices
        return choices

    async def put(self, name: str, value: object, wait: bool, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        uri = f"ca://{name}"
        await self._connect(name, timeout)
        # cainfo on a connected channel is local (no network): always the current type and
        # access rights, so an IOC reloaded with another record type is handled too.
        info = await cainfo(name, timeout=max(deadline - time.monotonic(), 0.001))
        if not info.write:
            raise ReadOnlyChannel(f"{uri}: the IOC denies write access")
        type_name = _TYPE_NAMES.get(info.datatype, "string")
        datatype: int | None = None
        out: Any
        if info.datatype == DBF_ENUM and info.count != 1:
            out = coerce_put_value(uri, value, "uint16", True, None)  # ENUM array: numbers
        elif info.datatype == DBF_ENUM:
            left = max(deadline - time.monotonic(), 0.001)
            choices = await self._enum_choices(name, False, left)
            if isinstance(value, str) and value not in choices:
                choices = await self._enum_choices(name, True, left)
            out = coerce_put_value(uri, value, "enum", False, choices)
        elif info.datatype == DBF_CHAR and name.endswith("$") and isinstance(value, str):
            # Long string as a char array (the CA `NAME.VAL$` convention).
            out, datatype = value, DBR_CHAR_STR
        else:
            out = coerce_put_value(uri, value, type_name, info.count != 1, None)
            if type_name == "string" and info.count == 1 and len(out.encode()) > 39:
                raise TypeMismatch(f"cannot write a string of more than 39 bytes to {uri}")
        left = max(deadline - time.monotonic(), 0.001)
        try:
            await caput(name, out, datatype=datatype, wait=wait, timeout=left)
        except CANothing as e:
            if e.errorcode == cadef.ECA_TIMEOUT:
                raise ChannelTimeout(f"{uri}: put did not complete within {timeout:g} s") from None
            if e.errorcode == ECA_NOWTACCESS:
                raise ReadOnlyChannel(f"{uri}: the IOC denies write access") from None
            raise PutRejected(f"{uri}: {e}") from None
        except cadef.CAException as e:
            if "access" in str(e).lower():
                raise ReadOnlyChannel(f"{uri}: the IOC denies write access") from None
            raise PutRejected(f"{uri}: {e}") from None

    async def close(self) -> None:
        # aioca keeps every channel it ever opened (it has no per-channel close); purging the
        # caches closes them, so no libca callback targets an event loop that is going away.
        purge_channel_caches()
