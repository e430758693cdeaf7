"""Channel Access backend (`ca://NAME`), on libca (aioca's bindings, constants and errors).

Each monitored channel holds two CA subscriptions on the same channel: one for values
(DBR_TIME, DBE_VALUE|DBE_ALARM) and one for properties (DBR_CTRL with count 1, DBE_PROPERTY) so a
change of EGU, limits or enum labels reaches clients without re-sending values. DESC is not part
of any DBR type, so it is read once per connection from `NAME.DESC`.

Channels are pvwire's own (ca_channel.py: a libca context polled from the event loop, scalar
values unpacked in one call): callbacks run on the event loop thread, batched per poll, so the
value callback does O(1) work and creates no task or future. A monitor clears and re-creates its
channel shortly after a disconnect, so it comes back on libca's fast search timer instead of its
10 s disconnect governor; gets and puts of unmonitored names borrow a channel from a small pool
that clears it after use. With --forward-identity, `put_as` writes on a circuit that carries the
user's name (ca_identity.py), after the same type checks and value conversion.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections import OrderedDict
from typing import Any

import numpy as np
from aioca import (
    DBE_ALARM,
    DBE_PROPERTY,
    DBE_VALUE,
    DBR_CHAR_STR,
    FORMAT_CTRL,
    FORMAT_RAW,
    FORMAT_TIME,
    CANothing,
)
from epicscorelibs.ca import cadef

from ..errors import (
    ChannelNotFound,
    ChannelTimeout,
    IocDenied,
    PutRejected,
    TypeMismatch,
)
from ..limits import integer, number
from ..model import ConnState, Limits, Metadata, Reading, Value, alarm_status_name
from .base import Backend, ChannelSink, Monitor
from .ca_channel import CaChannel, CaSubscription, GetChannelPool, channel_counts
from .ca_identity import Address, IdentityCircuits
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
DESC_TIMEOUT = number("ca_desc_timeout_s")

# Re-creating a monitor's channel after a disconnect. A new channel searches at once and then
# backs off (gaps doubling from ~30 ms), so one re-creation finds an IOC that is back within
# ~1 s but not one that takes longer: measured, a channel created 3 / 10 / 25 s before the IOC
# was ready connected 5.6 / 8.5 / 4.0 s after it. So while the channel stays disconnected it is
# renewed every RENEW_PERIOD (the longest search gap stays ~1 s) for RENEW_FAST_FOR seconds,
# then every RENEW_SLOW_PERIOD, which bounds the search traffic of an IOC that is gone for good.
RECREATE_AFTER = 0.1
RENEW_PERIOD = 2.0
RENEW_FAST_FOR = 300.0
RENEW_SLOW_PERIOD = 30.0
# A channel that connects and drops again within this time waits RENEW_PERIOD, not
# RECREATE_AFTER, before it is re-created: a flapping server cannot make it spin.
FLAP_WINDOW = 10.0
# Enum labels kept for puts by label, per name (least recently used dropped beyond this).
MAX_ENUM_CHOICES = integer("ca_max_enum_choices")


def _has_field(name: str) -> bool:
    """True for `X.EGU`, `X.{"dec":...}` and the like: DESC of those is not the record's."""
    return "." in name


def _limits(low: Any, high: Any) -> Limits:
    return (float(low), float(high))


def _is_long_string(name: str) -> bool:
    """`NAME.VAL$`: a long string served as a char array; aioca reads it as str."""
    return name.endswith("$")


def _meta_from_ctrl(
    ctrl: Any, field_type: int, count: int, writable: bool | None, name: str = ""
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


async def _resolve(uri: str, server: str) -> Address:
    """The IPv4 address of libca's `HOST:PORT` for a channel's server (CA is IPv4 only)."""
    host, _, port = server.rpartition(":")
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, int(port), family=socket.AF_INET, type=socket.SOCK_STREAM
        )
    except (OSError, ValueError) as exc:
        raise PutRejected(f"{uri}: no address for its server {server!r}: {exc}") from None
    ip, port_number = infos[0][4][:2]
    return str(ip), int(port_number)


# DBR codes (db_access.h) the identity circuits write with: the channel's native type.
_DBR_STRING, _DBR_ENUM, _DBR_CHAR = 0, 3, 4


def _as_dbr(field_type: int, out: Any, datatype: int | None) -> tuple[Any, int, int]:
    """(data, DBR type, count) for caproto from a value `coerce_put_value` converted: the same
    value libca would send, in the channel's native type (the IOC converts either the same)."""
    if datatype == DBR_CHAR_STR:  # a long string: its UTF-8 bytes and a terminating NUL
        raw = str(out).encode() + b"\0"
        return raw, _DBR_CHAR, len(raw)
    if field_type == DBF_STRING:
        strings = out if isinstance(out, list) else [out]
        return [s.encode() for s in strings], _DBR_STRING, len(strings)
    if isinstance(out, np.ndarray):
        return out, field_type, int(out.size)
    return [out], field_type, 1


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
        "_chan",
        "_closed",
        "_connected",
        "_convert",
        "_ctrl_meta",
        "_desc",
        "_desc_state",
        "_desc_task",
        "_down_at",
        "_dropped_seen",
        "_guard",
        "_meta",
        "_name",
        "_pending",
        "_pool",
        "_renew",
        "_rights",
        "_sink",
        "_subs",
        "_uri",
    )

    # _desc_state values: DESC not asked yet, being read, known (or given up on).
    _DESC_NONE, _DESC_BUSY, _DESC_DONE = 0, 1, 2

    def __init__(
        self, name: str, sink: ChannelSink, pool: GetChannelPool, rights: bool = True
    ) -> None:
        """`rights`: publish pvwire's own access rights as `writable` (False when puts go as
        each user, whose rights at the IOC are not pvwire's: `writable` is then unknown)."""
        self._name = name
        self._rights = rights
        self._pool = pool
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
        self._dropped_seen = 0  # merged-update count already folded into a serial
        self._convert = _converter(name)
        self._guard = CallbackGuard(self._uri, sink)
        self._subs: list[CaSubscription] = []
        self._renew: asyncio.TimerHandle | None = None
        self._down_at = -FLAP_WINDOW  # loop time of the last disconnect
        self._chan = CaChannel(name, self._on_channel, self._on_write_access)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drop_subscriptions()
        if self._renew is not None:
            self._renew.cancel()
            self._renew = None
        self._chan.close()
        if self._desc_task is not None:
            self._desc_task.cancel()
            self._desc_task = None
        self._pending = None

    # -- channel lifecycle (event loop thread) ---------------------------------------------------

    def _on_channel(self, up: bool) -> None:
        if self._closed:
            return
        if up:
            if self._renew is not None:
                self._renew.cancel()
                self._renew = None
            self._drop_subscriptions()
            self._dropped_seen = 0
            chan = self._chan
            self._subs = [
                chan.subscribe(self._on_value, DBE_VALUE | DBE_ALARM, FORMAT_TIME, 0),
                # count=1: property events must not drag a whole waveform along with them.
                chan.subscribe(self._on_ctrl, DBE_PROPERTY, FORMAT_CTRL, 1),
            ]
            return
        self._drop_subscriptions()
        self._on_value(CANothing(self._name, cadef.ECA_DISCONN))
        loop = asyncio.get_running_loop()
        now = loop.time()
        flapping = now - self._down_at < FLAP_WINDOW
        self._down_at = now
        # Clear now: the old channel would otherwise reconnect by itself, up to 10 s late.
        self._chan.close()
        self._chan = CaChannel(self._name, self._on_channel, self._on_write_access)
        self._schedule_renew(RENEW_PERIOD if flapping else RECREATE_AFTER)

    def _schedule_renew(self, delay: float) -> None:
        if self._renew is not None:
            self._renew.cancel()
        # Jitter: the channels of one IOC that went away must not renew in lockstep.
        delay *= random.uniform(0.8, 1.2)
        self._renew = asyncio.get_running_loop().call_later(delay, self._renew_channel)

    def _renew_channel(self) -> None:
        self._renew = None
        if self._closed or self._chan.connected:
            return
        self._chan.close()
        self._chan = CaChannel(self._name, self._on_channel, self._on_write_access)
        down_for = asyncio.get_running_loop().time() - self._down_at
        self._schedule_renew(RENEW_PERIOD if down_for < RENEW_FAST_FOR else RENEW_SLOW_PERIOD)

    def _drop_subscriptions(self) -> None:
        for sub in self._subs:
            sub.close()
        self._subs = []

    # -- subscription callbacks (event loop thread) -----------------------------------------------

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

    def _value(self, update: Any) -> None:
        """`update`: (value, seconds, nanoseconds, severity, status), or CANothing."""
        if self._connected:
            # Hot path: one upstream update, one sink call.
            if isinstance(update, CANothing):
                self._on_disconnect()
                return
            value, secs, nsec, severity, status = update
            # Updates dropped while the loop was far behind (past the queue), counted.
            dropped = self._subs[0].dropped_callbacks
            skipped = dropped - self._dropped_seen
            self._dropped_seen = dropped
            plain = self._convert(value)
            if self._guard.failed:
                self._guard.recover()
            self._sink.on_update(
                plain, secs, nsec, severity, status, alarm_status_name(status), skipped
            )
            return
        if isinstance(update, CANothing):
            self._pending = None
            return
        self._pending = update
        self._maybe_ready()

    def _ctrl(self, ctrl: Any) -> None:
        if isinstance(ctrl, CANothing):
            return
        chan = self._subs[1].channel
        try:
            field_type = cadef.ca_field_type(chan)
            count = cadef.ca_element_count(chan)
            writable = bool(cadef.ca_write_access(chan)) if self._rights else None
        except Exception:  # channel dropped between the event and now; the next one will do
            return
        self._ctrl_meta = _meta_from_ctrl(ctrl, field_type, count, writable, self._name)
        if self._desc_state == self._DESC_NONE:
            self._desc_state = self._DESC_BUSY
            self._desc_task = asyncio.ensure_future(self._read_desc())
        self._publish_meta()
        self._maybe_ready()

    def _on_write_access(self, writable: bool) -> None:
        """The IOC changed pvwire's write access (ACF reloaded, ASG changed): the metadata goes
        out again with the new `writable`, in the next tick. rsrv also sends one more event on
        each subscription then, which re-reads the rights in `_ctrl`, but that event carries no
        value (ECA_NORDACCESS) when read access went too: only this callback sees that change."""
        try:
            meta = self._ctrl_meta
            if meta is None or not self._rights or meta.writable is writable:
                return  # before the first DBR_CTRL event, which reads the rights itself
            self._ctrl_meta = meta.replace(writable=writable)
            self._publish_meta()
        except Exception as exc:
            self._guard.fail(exc)

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
            desc = await self._pool.read(self._name + ".DESC", FORMAT_RAW, DESC_TIMEOUT)
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
        (value, secs, nsec, severity, status), self._pending = self._pending, None
        plain = self._convert(value)  # raises before CONNECTED if the value cannot be sent
        self._connected = True
        self._guard.failed = False
        self._sink.on_connection(ConnState.CONNECTED)
        self._sink.on_update(plain, secs, nsec, severity, status, alarm_status_name(status))


class CaBackend(Backend):
    """`ca://` channels on pvwire's own libca channels (ca_channel.py)."""

    scheme = "ca"

    def __init__(self, forward_identity: bool = False, host_name: str = "") -> None:
        """`forward_identity`: `put_as` writes on a circuit carrying the user's name, and the
        host name sent there is `host_name`, by default this machine's (as libca sends it)."""
        self.forwards_identity = forward_identity
        self._circuits = (
            IdentityCircuits(host_name or socket.gethostname()) if forward_identity else None
        )
        # Enum labels per channel name, for puts by label; refreshed when a label is not found.
        # Bounded: puts to ever new names must not grow it without end.
        self._choices: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._pool = GetChannelPool()

    def monitor(self, name: str, sink: ChannelSink) -> Monitor:
        return CaMonitor(name, sink, self._pool, rights=not self.forwards_identity)

    def channel_counts(self) -> dict[str, int]:
        return channel_counts()

    def _remember_choices(self, name: str, choices: tuple[str, ...]) -> None:
        self._choices[name] = choices
        self._choices.move_to_end(name)
        while len(self._choices) > MAX_ENUM_CHOICES:
            self._choices.popitem(last=False)

    @staticmethod
    async def _connect(chan: CaChannel, timeout: float) -> float:
        """Wait for the channel; return the time left of `timeout`."""
        deadline = time.monotonic() + timeout
        if not await chan.wait_connected(timeout):
            raise ChannelNotFound(f"ca://{chan.name}: no server answered within {timeout:g} s")
        return max(deadline - time.monotonic(), 0.001)

    async def get(self, name: str, timeout: float) -> Reading:
        async with self._pool.borrow(name) as chan:
            left = await self._connect(chan, timeout)
            try:
                field_type, count, writable = chan.field_type, chan.element_count, chan.writable
            except cadef.Disconnected:
                raise ChannelTimeout(f"ca://{name}: disconnected during the get") from None
            aws: list[Any] = [
                chan.get(None, FORMAT_TIME, 0, left),
                chan.get(None, FORMAT_CTRL, 1, left),
            ]
            if not _has_field(name):
                aws.append(self._pool.read(name + ".DESC", FORMAT_RAW, left))
            results = await asyncio.gather(*aws, return_exceptions=True)
        for r in results[:2]:
            if isinstance(r, CANothing | cadef.Disconnected):
                raise ChannelTimeout(f"ca://{name}: get did not complete: {r}") from None
            if isinstance(r, BaseException):
                raise r
        value: Any = results[0]
        ctrl: Any = results[1]
        rights = None if self.forwards_identity else writable  # see CaMonitor's `rights`
        meta = _meta_from_ctrl(ctrl, field_type, count, rights, name)
        if len(results) > 2 and not isinstance(results[2], BaseException):
            meta = meta.replace(description=str(results[2]))
        if field_type == DBF_ENUM and count == 1:
            self._remember_choices(name, meta.choices or ())
        secs, nsec = value.raw_stamp
        return Reading(
            value=_converter(name)(value),
            seconds=secs,
            nanoseconds=nsec,
            severity=value.severity,
            status=value.status,
            message=alarm_status_name(value.status),
            meta=meta,
        )

    async def _enum_choices(
        self, chan: CaChannel, refresh: bool, timeout: float
    ) -> tuple[str, ...]:
        name = chan.name
        choices = self._choices.get(name)
        if choices is None or refresh:
            try:
                ctrl = await chan.get(None, FORMAT_CTRL, 0, timeout)
            except CANothing as e:
                raise ChannelTimeout(f"ca://{name}: reading enum labels failed: {e}") from None
            choices = tuple(getattr(ctrl, "enums", ()))
            self._remember_choices(name, choices)
        return choices

    async def put(self, name: str, value: object, wait: bool, timeout: float) -> None:
        await self._put(name, value, wait, timeout, "")

    async def put_as(self, user: str, name: str, value: object, wait: bool, timeout: float) -> None:
        if self._circuits is None:
            raise RuntimeError("puts as a user need CaBackend(forward_identity=True)")
        await self._put(name, value, wait, timeout, user)

    async def _put(self, name: str, value: object, wait: bool, timeout: float, user: str) -> None:
        """Write through pvwire's own libca channel, or as `user` on that user's circuit.

        Both convert the value the same way, with the type and enum labels read from pvwire's
        libca channel (which also finds the server); only the circuit the put travels on differs.
        """
        deadline = time.monotonic() + timeout
        uri = f"ca://{name}"
        async with self._pool.borrow(name) as chan:
            await self._connect(chan, timeout)
            # Type and access rights of a connected channel are local (no network): always the
            # current ones, so an IOC reloaded with another record type is handled too.
            try:
                field_type, count, writable = chan.field_type, chan.element_count, chan.writable
                server = chan.server if user else ""
            except cadef.Disconnected:
                raise ChannelTimeout(f"{uri}: disconnected before the put") from None
            # pvwire's own access rights say nothing about a user's: their circuit's do.
            if not writable and not user:
                raise IocDenied(f"{uri}: the IOC denies write access")
            type_name = _TYPE_NAMES.get(field_type, "string")
            datatype: int | None = None
            out: Any
            if field_type == DBF_ENUM and count != 1:
                out = coerce_put_value(uri, value, "uint16", True, None)  # ENUM array: numbers
            elif field_type == DBF_ENUM:
                left = max(deadline - time.monotonic(), 0.001)
                choices = await self._enum_choices(chan, False, left)
                if isinstance(value, str) and value not in choices:
                    choices = await self._enum_choices(chan, True, left)
                out = coerce_put_value(uri, value, "enum", False, choices)
            elif field_type == DBF_CHAR and name.endswith("$") and isinstance(value, str):
                # Long string as a char array (the CA `NAME.VAL$` convention).
                out, datatype = value, DBR_CHAR_STR
            else:
                out = coerce_put_value(uri, value, type_name, count != 1, None)
                if type_name == "string" and count == 1 and len(out.encode()) > 39:
                    raise TypeMismatch(f"cannot write a string of more than 39 bytes to {uri}")
            if user:
                address = await _resolve(uri, server)
                data, dbr_type, n = _as_dbr(field_type, out, datatype)
                assert self._circuits is not None
                left = max(deadline - time.monotonic(), 0.001)
                await self._circuits.put(user, address, name, data, dbr_type, n, wait, left)
                return
            left = max(deadline - time.monotonic(), 0.001)
            try:
                await chan.put(out, datatype, wait, left)
            except CANothing as e:
                if e.errorcode == cadef.ECA_TIMEOUT:
                    raise ChannelTimeout(
                        f"{uri}: put did not complete within {timeout:g} s"
                    ) from None
                if e.errorcode == ECA_NOWTACCESS:
                    raise IocDenied(f"{uri}: the IOC denies write access") from None
                raise PutRejected(f"{uri}: {e}") from None
            except cadef.CAException as e:
                if "access" in str(e).lower():
                    raise IocDenied(f"{uri}: the IOC denies write access") from None
                raise PutRejected(f"{uri}: {e}") from None

    async def close(self) -> None:
        if self._circuits is not None:
            self._circuits.close()
        self._pool.close()
