"""The pvws protocol (ornl-epics/pvws) for one client connection, with no I/O.

pvws is JSON over a WebSocket at `/pvws/pv`: the client sends `subscribe` (alias `monitor`),
`clear`, `list`, `write`, `ping`, `echo`; the server sends `update` messages shaped as pvws's
`Vtype2Json` writes them (metadata, `vtype` and `severity` with a PV's first value, then the
severity only when it changes; `readonly` first and on change; arrays as little-endian base64),
`list` and `error`. Web UIs that speak it today (cs-web-lib, dbwr, pvws.js) work unchanged.

Engine (the same as `/stream`, DESIGN.md section 7a): each PV a client subscribes to is one
attachment of a one-channel view shared with every other client of that channel, driven by the
tick. The JSON of a channel's state is made once (`PvwsEncoder`, per PV name and per variant:
with or without metadata, severity, readonly) and the same string is queued for every client that
needs that variant; the per-client part is only which variant. Flow control is `/stream`'s: past
`send_budget` queued the session merges (latest state per PV), and a queue that makes no progress
for `stall_timeout` closes the connection with 4008.

Differences from pvws, on purpose: a severity change is sent for every type (pvws drops it for
arrays and for a value whose type changed, e.g. after a disconnect); metadata is sent again when
it changes (pvws sends it only once); a refused subscription or a bad PV name is answered with an
`error` message (pvws only logs it), and so is a PV whose channel fails (pvws shows it as
disconnected only), to clients that read errors (`_may_read_errors`: not to
Grafana's, which takes every message for data); updates are not throttled unless PV_THROTTLE_MS /
PV_ARRAY_THROTTLE_MS say so. docs/PVWS.md has the whole comparison, message by message and type
by type (`TYPES`).
"""

from __future__ import annotations

import base64
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson

from ..limits import integer
from ..model import VALUE, ConnState, Metadata, Severity
from ..wire.flow import FlowControl, FlowView
from ..wire.session import SessionLimits
from ..wire.tokens import Claims
from .frames import text_frames

__all__ = [
    "CA_TYPES",
    "CLIENT_MESSAGES",
    "TYPES",
    "ChannelState",
    "Opened",
    "Ping",
    "PvSource",
    "PvwsEncoder",
    "PvwsHost",
    "PvwsRefused",
    "PvwsSession",
    "PvwsType",
    "Write",
    "utf8_size",
]

log = logging.getLogger("pvwire.pvws")

# pvws names the EPICS severities as model.py does, except NO_ALARM, which it calls NONE.
SEVERITIES = tuple("NONE" if s == Severity.NO_ALARM else s.name for s in Severity)
# The client messages pvws handles (WebSocket.java), all handled here too (docs/PVWS.md section 2).
CLIENT_MESSAGES = ("subscribe", "monitor", "clear", "list", "write", "ping", "echo")
# Errors kept for a client not yet known to read them (then dropped).
MAX_HELD_ERRORS = integer("pvws_max_held_errors")
# Most bytes of messages joined into one socket write (`next_frames`); caproto batches up to
# 64 KiB too. A tick of 200 changed PVs is ~30 KB of JSON.
WRITE_BATCH = 64 * 1024
_CONNECTED = ConnState.CONNECTED
UNDEFINED = "UNDEFINED"  # pvws's severity of a disconnected PV (Phoebus' Alarm.disconnected())


@dataclass(frozen=True, slots=True)
class PvwsType:
    """How pvws sends one value type: Phoebus' VType names and the array's base64 field."""

    scalar: str  # vtype of a scalar
    array: str  # vtype of an array
    field: str  # the array's member: b64dbl, b64flt, b64srt, b64int or b64byt
    packed: str  # the dtype its elements are packed as (little-endian)


# Value type (metadata `type`, or an array's dtype) -> how pvws sends it, as pvws does: its
# Vtype2Json packs VDoubleArray, VFloatArray, VShortArray and VByteArray as themselves and every
# other VNumberArray as int32 (`getInt`: int64 and uint32 keep their low 32 bits), and Phoebus'
# PVA decoder makes VUByteArray, VUShortArray... of unsigned arrays, which are not VByteArray or
# VShortArray. So a PVA ubyte[] travels as b64int (0..255 stays 0..255 in every client) while a
# byte[] is b64byt, which cs-web-lib decodes as signed. docs/PVWS.md has the table with what
# cs-web-lib shows; tests/test_pvws_types.py checks it over CA and PVA.
TYPES = {
    "float64": PvwsType("VDouble", "VDoubleArray", "b64dbl", "<f8"),
    "float32": PvwsType("VFloat", "VFloatArray", "b64flt", "<f4"),
    "int64": PvwsType("VLong", "VLongArray", "b64int", "<i4"),
    "uint64": PvwsType("VULong", "VULongArray", "b64int", "<i4"),
    "int32": PvwsType("VInt", "VIntArray", "b64int", "<i4"),
    "uint32": PvwsType("VUInt", "VUIntArray", "b64int", "<i4"),
    "int16": PvwsType("VShort", "VShortArray", "b64srt", "<i2"),
    "uint16": PvwsType("VUShort", "VUShortArray", "b64int", "<i4"),
    "int8": PvwsType("VByte", "VByteArray", "b64byt", "i1"),
    "uint8": PvwsType("VUByte", "VUByteArray", "b64int", "<i4"),
    # pvws has no mapping for PVA booleans (it sends their text); bytes 0/1 read in every client.
    "bool": PvwsType("VBoolean", "VBooleanArray", "b64byt", "u1"),
}
# CA's DBR_CHAR (FTVL CHAR and UCHAR alike) is one type, which Phoebus' CA client reads as Java
# (signed) bytes: pvws sends VByte / VByteArray as b64byt, and so does pvwire.
CA_TYPES = {**TYPES, "uint8": PvwsType("VByte", "VByteArray", "b64byt", "u1")}
_OTHER_ARRAY = PvwsType("VNumber", "VNumberArray", "b64int", "<i4")


class ChannelState(Protocol):
    """What the encoder reads of a channel (core/channel.py's Channel)."""

    @property
    def id(self) -> str: ...
    @property
    def value(self) -> Any: ...
    @property
    def seconds(self) -> int: ...
    @property
    def nanoseconds(self) -> int: ...
    @property
    def severity(self) -> int: ...
    @property
    def meta(self) -> Metadata: ...
    @property
    def state(self) -> ConnState: ...
    @property
    def updates(self) -> int: ...
    @property
    def known(self) -> int: ...
    @property
    def fault(self) -> str: ...


class PvSource(Protocol):
    """A one-channel view (core/view.py)."""

    @property
    def channels(self) -> Sequence[ChannelState]: ...


@dataclass(frozen=True, slots=True)
class Opened:
    view: PvSource
    claims: Claims  # the identity it was opened for: the hub checks it again when rules change
    may_write: bool  # the access rules let this identity write the channel


class PvwsRefused(Exception):
    """A PV name the host cannot open (bad name, not readable by this identity)."""


class PvwsHost(Protocol):
    def open(self, name: str, session: PvwsSession, att: int, array: bool) -> Opened: ...
    def close(self, view: PvSource, session: PvwsSession, att: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Ping:
    """The client asked to be pinged: send a WebSocket ping frame."""


@dataclass(frozen=True, slots=True)
class Write:
    """The client writes `value` to subscribed PV `pv`; answer a failure with `write_failed`."""

    pv: str
    value: float | str


# --- the encoder: one JSON text per PV name, channel state and variant -----------------------


def _number(x: float) -> Any:
    """A display limit as Jackson writes a double: non-finite numbers as strings."""
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _json(obj: object) -> str:
    return orjson.dumps(obj).decode()


def _display(meta: Metadata) -> str:
    out: dict[str, Any] = {"units": meta.units or "", "description": meta.description}
    if meta.precision is not None:
        out["precision"] = meta.precision
    for (lo, hi), limits in (
        (("min", "max"), meta.display),
        (("warn_low", "warn_high"), meta.warning),
        (("alarm_low", "alarm_high"), meta.alarm),
    ):
        if limits is not None:
            out[lo], out[hi] = _number(limits[0]), _number(limits[1])
    return _json(out)[1:-1]


def _types(ch: ChannelState) -> dict[str, PvwsType]:
    return CA_TYPES if ch.id.startswith("ca://") else TYPES


def _scalar_vtype(ch: ChannelState, value: object) -> str:
    known = _types(ch).get(ch.meta.type or "")
    if known is not None:
        return known.scalar
    return "VDouble" if isinstance(value, float) else "VLong"


def _value_parts(ch: ChannelState) -> tuple[str, str, bool]:
    """(vtype, the value's JSON members, whether display metadata applies) of the state."""
    value, meta = ch.value, ch.meta
    if isinstance(value, np.ndarray):
        arr = value.reshape(-1)  # images travel flattened, as pvws sends any array
        kind = "bool" if meta.type == "bool" or arr.dtype.kind == "b" else arr.dtype.name
        how = _types(ch).get(kind, _OTHER_ARRAY)
        data = np.ascontiguousarray(arr, dtype=how.packed)  # no copy when already packed so
        text = base64.b64encode(data.data).decode("ascii")
        return how.array, f'"{how.field}":"{text}"', True
    if meta.type == "enum" and isinstance(value, int):
        choices = meta.choices or ()
        label = choices[value] if 0 <= value < len(choices) else str(value)
        return "VEnum", f'"value":{value},"text":{_json(label)}', False
    if isinstance(value, bool):
        return "VBoolean", f'"value":{int(value)}', True
    if isinstance(value, float):
        shown = repr(value) if math.isfinite(value) else '"NaN"'
        return _scalar_vtype(ch, value), f'"value":{shown}', True
    if isinstance(value, int):
        return _scalar_vtype(ch, value), f'"value":{value}', True
    if isinstance(value, str):
        return "VString", f'"text":{_json(value)}', False
    if isinstance(value, list) and all(type(x) is str for x in value):
        # pvws sends what Java's toString() gives for types it does not map (VStringArray).
        return "VStringArray", f'"text":{_json("[" + ", ".join(value) + "]")}', False
    # Structures and tables: pvws passes them as text; JSON text is at least parseable.
    return "VType", f'"text":{_json(_json_safe(value))}', False


def _json_safe(value: object) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except TypeError:
        return str(value)


class _Entry:
    __slots__ = ("disconnected_at", "head", "plain", "refs", "texts", "version")

    def __init__(self, name: str) -> None:
        self.head = '{"type":"update","pv":' + _json(name)
        self.refs = 0
        self.version: tuple[object, ...] = ()
        self.texts: dict[tuple[bool, bool, bool | None], str] = {}
        self.disconnected_at: tuple[int, int] = (0, 0)
        # (updates, meta, text) of the last value-only text of a connected state (`value_text`)
        self.plain: tuple[int, Metadata | None, str] = (-1, None, "")


class PvwsEncoder:
    """The hub-wide cache of pvws texts: a channel's change is encoded once per variant, however
    many clients watch it (the variant is all that differs between clients)."""

    def __init__(self, wall: Callable[[], int] = time.time_ns) -> None:
        self._entries: dict[str, _Entry] = {}
        self._wall = wall
        self.encoded = 0  # texts made, for tests and benchmarks: once per state and variant
        # The last write's messages and their frames: clients watching the same PVs get the
        # same texts in the same order at a tick, so the first client's frames serve the rest.
        self._last_texts: list[str] = []
        self._last_frames = b""

    def acquire(self, name: str) -> _Entry:
        """Count a client of `name`; its entry, where the texts of `name` are kept."""
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry(name)
        entry.refs += 1
        return entry

    def release(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is not None:
            entry.refs -= 1
            if entry.refs <= 0:
                del self._entries[name]

    def frames(self, texts: list[str]) -> bytes:
        """`texts` as WebSocket text frames for one write (frames.text_frames), made once for
        every client sent the same texts at a tick."""
        # A list compares its items by identity first: the texts shared by every client compare
        # without reading their characters.
        if texts != self._last_texts:
            self._last_texts = texts
            self._last_frames = text_frames(texts)
        return self._last_frames

    def value_text(self, name: str, ch: ChannelState) -> str:
        """`text(name, ch, False, False, None)` of a connected `ch`: the update most sent, looked
        up by what it depends on (the value's update count and the metadata that types it)."""
        entry = self._entries.get(name)
        if entry is not None:
            updates, meta, text = entry.plain
            if updates == ch.updates and meta is ch.meta:
                return text
            text = self.text(name, ch, False, False, None)
            entry.plain = (ch.updates, ch.meta, text)
            return text
        return self.text(name, ch, False, False, None)

    def text(
        self, name: str, ch: ChannelState, meta: bool, severity: bool, readonly: bool | None
    ) -> str:
        """The update for `ch`'s current state, with metadata and/or severity and/or readonly."""
        entry = self._entries.get(name)
        if entry is None:  # not acquired (a caller's slip): still correct, just not shared
            entry = _Entry(name)
        version = (ch.updates, ch.meta, ch.state, ch.fault)
        if entry.version != version:
            entry.version = version
            entry.texts = {}
            if ch.state != ConnState.CONNECTED:
                entry.disconnected_at = divmod(self._wall(), 1_000_000_000)
        key = (meta, severity, readonly)
        text = entry.texts.get(key)
        if text is None:
            text = entry.texts[key] = self._encode(entry, ch, meta, severity, readonly)
            self.encoded += 1
        return text

    def _encode(
        self, entry: _Entry, ch: ChannelState, meta: bool, severity: bool, readonly: bool | None
    ) -> str:
        parts = [entry.head]
        if not connected(ch):
            # pvws (Phoebus core-pv) shows a disconnect as a NaN double with severity UNDEFINED,
            # stamped with the time it was noticed.
            parts.append(f',"severity":"{UNDEFINED}","value":"NaN"')
            seconds, nanos = entry.disconnected_at
        else:
            vtype, members, display = _value_parts(ch)
            if meta:
                parts.append(f',"vtype":"{vtype}"')
                if vtype == "VEnum":
                    parts.append(f',"labels":{_json(list(ch.meta.choices or ()))}')
                elif display:
                    parts.append("," + _display(ch.meta))
            if meta or severity:
                parts.append(f',"severity":"{severity_name(ch.severity)}"')
            parts.append("," + members)
            seconds, nanos = ch.seconds, ch.nanoseconds
        if readonly is not None:
            parts.append(',"readonly":true' if readonly else ',"readonly":false')
        parts.append(f',"seconds":{seconds},"nanos":{nanos}}}')
        return "".join(parts)


def severity_name(severity: int) -> str:
    return SEVERITIES[severity] if 0 <= severity < len(SEVERITIES) else UNDEFINED


def failure(ch: ChannelState) -> str:
    """Why `ch` cannot be served, or "" when it has not failed (it may still be connecting or
    disconnected): a value the encoder could not carry, or the upstream's reason for FAILED
    (Channel.reason: a PVA error, a value the backend cannot serve, the local PV cap)."""
    if ch.fault:
        return ch.fault
    if ch.state == ConnState.FAILED:
        # Read where it exists: the states the encoder also reads (a get's reading) have none.
        return str(getattr(ch, "reason", "")) or "failed"
    return ""


def connected(ch: ChannelState) -> bool:
    return ch.state == ConnState.CONNECTED and not ch.fault and bool(ch.known & VALUE)


# --- one connection ------------------------------------------------------------------------


class _Pv:
    """One subscribed PV of one client, and what that client has been sent of it."""

    __slots__ = (
        "array",
        "att",
        "ch",
        "entry",
        "failure",
        "image",
        "level",
        "meta",
        "name",
        "readonly",
        "severity",
        "shown",
        "view",
        "writes",
    )

    def __init__(self, name: str, att: int, opened: Opened) -> None:
        self.name = name
        self.att = att
        self.view = opened.view
        self.ch = opened.view.channels[0]  # the view's one channel, read at every update
        self.writes = opened.may_write
        self.array = False  # opened at the array rate
        self.image = False  # its value is an image: sent within the connection's image budget
        self.shown = False  # the client has a value (not a disconnect) of it
        self.meta: Metadata | None = None  # metadata last sent; None: nothing sent yet
        self.severity = ""
        self.level = -1  # the severity number of `severity`
        self.entry: _Entry | None = None  # the encoder's, once acquired
        self.failure = ""  # the channel's failure last reported with an error ("": none)
        self.readonly: bool | None = None


class PvwsSession(FlowView[str]):
    endpoint = "pvws"

    def __init__(
        self,
        number: int,
        address: str,
        host: PvwsHost,
        encoder: PvwsEncoder,
        limits: SessionLimits,
        wake: Callable[[], None],
        rates: tuple[float, float] = (0.0, 0.0),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_per_subscribe: int = integer("max_channels_per_subscription"),
        opener: Callable[[PvwsSession], None] | None = None,
        image_bytes_per_s: float = 0.0,
    ) -> None:
        self.number = number
        self.id = str(number)  # pvws's socket id, as /pvws/socket lists it
        self.address = address
        self.limits = limits
        self.rates = rates  # (scalar, array) maxRate in Hz; 0 = every tick
        self._host = host
        self._encoder = encoder
        self._clock = clock
        self._wall = wall
        self.connected_at = clock()
        self.created_ms = round(wall() * 1000)
        self.last_client_message_ms = self.created_ms
        self.client_messages = 0  # every message received, read or refused (admin pages)
        self.last_message_sent_ms = 0
        self.pvs: dict[str, _Pv] = {}  # subscription order, as `list` answers
        self._by_att: dict[int, _Pv] = {}
        self.attachments: dict[int, PvSource] = {}
        self.claims: dict[int, Claims] = {}
        self.channel_count = 0
        self._next_att = 1
        self._flow: FlowControl[str] = FlowControl(
            limits.send_budget, limits.stall_timeout, clock, wake, self._catch_up, utf8_size
        )
        self.max_per_subscribe = max_per_subscribe
        # Names subscribed but not opened yet, in order. Opening costs a resolve and a view per
        # name: `opener` is told there are some and opens them a few per event-loop pass
        # (`open_pending`), so a subscribe of thousands holds nobody; None opens them at once.
        self._opening: dict[str, None] = {}
        self._opener = opener
        self._popped = 0  # UTF-8 bytes of the text `next_text` gave last
        # Images cost what a client can use: their frames are paced to `image_bytes_per_s`
        # (each frame's bytes owed, then paid off at that rate before the next goes; no burst).
        # A frame that comes while owing waits, and newer ones replace it.
        self.image_bytes_per_s = image_bytes_per_s
        self._image_tokens = 0.0  # bytes owed, as a negative number; 0: a frame may go
        self._image_at = clock()
        self._images_waiting: dict[int, None] = {}  # atts of images held back
        self.images_held = 0  # image frames replaced while held back (never sent)
        self._pending: dict[int, None] = {}  # atts changed while behind
        self._tick: list[int] = []
        self._reopen: list[_Pv] = []
        self.conflated = 0
        self.bad_messages = 0
        self._messages = 0  # valid client messages received
        self.reads_errors = False  # see _may_read_errors
        self._held: list[str] = []  # errors kept until the client shows it reads them
        self.errors_dropped = 0  # errors never sent: past MAX_HELD_ERRORS while held
        self._writing = (0, 0)  # messages and characters of the frames being written

    # --- incoming -----------------------------------------------------------------------------

    def receive(self, text: str) -> list[Ping | Write]:
        """Handle one client message; returns what the endpoint must do (pings, writes)."""
        self.last_client_message_ms = round(self._wall() * 1000)
        self.client_messages += 1
        if self.close_request or self._flow.flooded():
            return []
        try:
            return self._handle(text)
        except _BadMessage as exc:
            # pvws logs and answers nothing; logged once per connection, counted always, so a
            # client repeating a bad message cannot flood the log.
            self.bad_messages += 1
            if self.bad_messages == 1:
                log.warning("pvws client %s (%s): %s", self.id, self.address, exc)
            return []

    def _handle(self, text: str) -> list[Ping | Write]:
        try:
            msg = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise _BadMessage(f"not JSON ({exc}): {_shorten(text)}") from None
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind is None:
            raise _BadMessage(f"Missing 'type' in {_shorten(text)}")
        self._messages += 1
        if not self.reads_errors and _may_read_errors(self._messages, kind, msg):
            self.reads_errors = True
            held, self._held = self._held, []
            for error in held:
                self._queue_text(error)
        if kind in ("subscribe", "monitor"):
            self._subscribe_all(_pvs(msg, text))
        elif kind == "clear":
            for name in _pvs(msg, text):
                pv = self.pvs.pop(name, None)
                if pv is not None:
                    self._release(pv)
                self._opening.pop(name, None)
        elif kind == "list":
            self._queue_text(_json({"type": "list", "pvs": [*self.pvs, *self._opening]}))
        elif kind == "write":
            if "pv" not in msg:
                raise _BadMessage(f"Missing 'pv' in {_shorten(text)}")
            if "value" not in msg:
                raise _BadMessage(f"Missing 'value' in {_shorten(text)}")
            name, value = _text(msg["pv"]), msg["value"]
            if name in self._opening:
                # Opened now (one name): a write goes to a PV the access rules let it open, and
                # one that cannot open is answered as unknown, as if it had been opened first.
                del self._opening[name]
                self._subscribe(name)
            if name not in self.pvs:
                self.write_failed(f"Cannot write unknown PV {name}")
                return []
            is_number = isinstance(value, int | float) and not isinstance(value, bool)
            return [Write(name, float(value) if is_number else _text(value))]
        elif kind == "ping":
            return [Ping()]
        elif kind == "echo":
            self._queue_text(text)
        else:
            raise _BadMessage(f"Unknown message type: {_shorten(text)}")
        return []

    def _subscribe_all(self, names: list[str]) -> None:
        if len(names) > self.max_per_subscribe:
            # As GraphQL's `subscribe` refuses more ids: the names are what the client asks,
            # refused whole before any work, and the PVs already held go on.
            self.write_failed(
                f"Cannot subscribe to {len(names):,} PVs in one message: the most is "
                f"{self.max_per_subscribe:,} (max_channels_per_subscription)"
            )
            return
        for name in names:
            if name in self.pvs or name in self._opening:
                continue
            held = self.channel_count + len(self._opening)
            if held >= self.limits.max_channels:
                # Each PV holds an upstream channel: without a bound one connection could open
                # them until the server runs out of memory, for every other client too.
                self.write_failed(
                    f"Cannot subscribe to {name}: this connection holds {held:,} PVs, "
                    "the most one may (max_channels_per_connection)"
                )
                continue
            self._opening[name] = None
        if not self._opening:
            return
        if self._opener is None:
            self.open_pending(len(self._opening))
        else:
            self._opener(self)

    @property
    def opening(self) -> int:
        """Names subscribed and not opened yet."""
        return len(self._opening)

    def open_pending(self, limit: int) -> int:
        """Open up to `limit` of the names waiting, in subscription order; how many were
        tried. Each is answered as it opens (its value if the channel has one, or an error)."""
        tried = 0
        while self._opening and tried < limit and not self.close_request:
            name = next(iter(self._opening))
            del self._opening[name]
            tried += 1
            self._subscribe(name)
        return tried

    def _subscribe(self, name: str) -> None:
        att = self._next_att
        try:
            opened = self._host.open(name, self, att, False)
        except PvwsRefused as exc:
            self.write_failed(f"Cannot subscribe to {name}: {exc}")
            return
        self._next_att += 1
        pv = _Pv(name, att, opened)
        self.pvs[name] = pv
        self._by_att[att] = pv
        self.attachments[att] = opened.view
        self.claims[att] = opened.claims
        self.channel_count += 1
        pv.entry = self._encoder.acquire(name)
        # What the channel already holds goes out now: a client joining a watched channel must
        # not wait for its next change.
        text = self._update(pv)
        if text is not None:
            if pv.image and self.image_bytes_per_s > 0:
                self._image_tokens -= utf8_size(text)  # a first frame is sent at once, counted
            self._queue_text(text)

    def _release(self, pv: _Pv) -> None:
        self._by_att.pop(pv.att, None)
        self._images_waiting.pop(pv.att, None)
        self.attachments.pop(pv.att, None)
        self.claims.pop(pv.att, None)
        self._pending.pop(pv.att, None)
        self.channel_count -= 1
        self._encoder.release(pv.name)
        self._host.close(pv.view, self, pv.att)

    def write_failed(self, message: str) -> None:
        """An `error` message, or held back while the client may not read errors."""
        text = _json({"type": "error", "message": message})
        if self.reads_errors:
            self._queue_text(text)
        elif len(self._held) < MAX_HELD_ERRORS:
            self._held.append(text)
        else:
            self.errors_dropped += 1

    def end_attachment(self, att: int, code: int, message: str) -> None:
        """The server ends one PV (the rules changed): an error names why."""
        pv = self._by_att.get(att)
        if pv is None or self.close_request:
            return
        del self.pvs[pv.name]
        self._release(pv)
        self.write_failed(f"{pv.name}: {message}")

    # --- the tick -----------------------------------------------------------------------------

    def collect(self, att: int, view: object) -> bool:
        first = not self._tick
        self._tick.append(att)
        return first

    def flush_tick(self) -> None:
        atts, self._tick = self._tick, []
        if self.close_request:
            return
        if self._images_waiting and not self._flow.merging() and self._image_room():
            # Images held back go first, in their current state, now that there is room.
            waiting, self._images_waiting = list(self._images_waiting), {}
            atts = waiting + [a for a in atts if a not in waiting]
        if self._flow.merging():
            pending = self._pending
            for att in atts:
                if att in pending:
                    self.conflated += 1
                pending[att] = None
        else:
            self._send_updates(atts)
        if self._reopen:
            self._reopen_arrays()

    def _send_updates(self, atts: Sequence[int]) -> None:
        """Queue the updates of `atts`, all at once (one wake-up of the writer per tick).

        Per update and client this is the whole cost of a pvws client beside `/stream`'s, so
        the common case (a new value of a PV already shown, nothing else changed) is decided
        first, from fields compared without building anything."""
        by_att = self._by_att
        value_text = self._encoder.value_text
        texts: list[str] = []
        append = texts.append
        for att in atts:
            pv = by_att.get(att)
            if pv is None:
                continue
            ch = pv.ch
            if pv.image and self.image_bytes_per_s > 0:
                image = self._image_text(pv)
                if image is not None:
                    append(image)
                continue
            if (
                pv.shown
                and ch.meta is pv.meta
                and ch.severity == pv.level
                and ch.state == _CONNECTED
                and not ch.fault
                and ch.known & VALUE
            ):
                # Connected (shown implies a value), same metadata (so same readonly), same
                # severity: the value alone, which another client may have had made already.
                entry = pv.entry
                if entry is not None:
                    updates, meta, text = entry.plain
                    if updates == ch.updates and meta is ch.meta:
                        append(text)
                        continue
                append(value_text(pv.name, ch))
            else:
                update = self._update(pv)
                if update is not None:
                    if pv.image and self.image_bytes_per_s > 0:
                        self._image_tokens -= utf8_size(update)  # a first frame, counted
                    append(update)
        if texts:
            self._flow.extend(texts, sum(map(utf8_size, texts)))

    def _image_room(self) -> bool:
        """Whether the image budget lets a frame out now: nothing is owed for earlier ones."""
        now = self._clock()
        rate = self.image_bytes_per_s
        self._image_tokens = min(0.0, self._image_tokens + (now - self._image_at) * rate)
        self._image_at = now
        return self._image_tokens >= 0.0

    def _image_text(self, pv: _Pv) -> str | None:
        """`pv`'s update now if the image budget has room, else held back (its newest state is
        sent once there is room: `flush_tick`, `housekeeping`)."""
        if not self._image_room():
            if pv.att in self._images_waiting:
                self.images_held += 1
            self._images_waiting[pv.att] = None
            return None
        text = self._update(pv)
        if text is not None:
            self._image_tokens -= utf8_size(text)
        return text

    def _update(self, pv: _Pv) -> str | None:
        """The text this client needs for `pv`'s channel now, or None; records what it sent."""
        ch = pv.ch
        if not connected(ch):
            why = failure(ch)
            if why != pv.failure:
                # pvws shows a failed PV only as disconnected; its reason, once per failure,
                # tells the page's user what to fix (cs-web-lib shows errors as toasts).
                pv.failure = why
                if why:
                    self.write_failed(f"{pv.name}: {why}")
            if not pv.shown:
                return None  # pvws sends nothing for a PV that never connected
            pv.shown = False
            pv.severity = UNDEFINED
            pv.level = -1
            return self._encoder.text(pv.name, ch, False, True, None)
        pv.failure = ""
        meta = ch.meta
        with_meta = pv.meta is not meta
        severity = severity_name(ch.severity)
        with_severity = with_meta or severity != pv.severity
        readonly = not (pv.writes and meta.writable is not False)
        show_readonly = readonly if readonly is not pv.readonly else None
        arrays_differ = self.rates[1] != self.rates[0]
        if with_meta and not pv.array and arrays_differ and isinstance(ch.value, np.ndarray):
            self._reopen.append(pv)  # pvws re-subscribes an array at the array rate
        if with_meta:
            value = ch.value
            pv.image = isinstance(value, np.ndarray) and value.ndim >= 2
        pv.shown = True
        pv.meta = meta
        pv.severity = severity
        pv.level = ch.severity
        pv.readonly = readonly
        return self._encoder.text(pv.name, ch, with_meta, with_severity, show_readonly)

    def _reopen_arrays(self) -> None:
        todo, self._reopen = self._reopen, []
        for pv in todo:
            if self.pvs.get(pv.name) is not pv:
                continue
            try:
                opened = self._host.open(pv.name, self, pv.att, True)
            except PvwsRefused:
                continue  # keeps the scalar rate
            self._host.close(pv.view, self, pv.att)
            pv.view = opened.view
            pv.ch = opened.view.channels[0]
            pv.array = True
            self.attachments[pv.att] = opened.view

    # --- outgoing -----------------------------------------------------------------------------

    def next_text(self) -> str | None:
        text = self._flow.pop()
        self._popped = utf8_size(text) if text is not None else 0
        return text

    def sent(self, nbytes: int) -> None:
        """The text of the last `next_text` is sent (`nbytes` is its length in characters, as
        the socket pump measures a `str`: the queue counts its UTF-8 bytes)."""
        self.last_message_sent_ms = round(self._wall() * 1000)
        self._flow.sent(self._popped)
        self._popped = 0

    def next_frames(self, limit: int = WRITE_BATCH) -> bytes | None:
        """What `next_text` would give one by one, up to about `limit` bytes, as WebSocket text
        frames for one socket write (wsprotocol.py), or None; `frames_written` follows.

        A message per PV update is pvws' protocol; a write per message is not: with one
        `send()` system call per message, writing was 51 % of the server's CPU (py-spy, 10
        clients x 200 PVs at 10 Hz)."""
        texts, size = self._flow.pop_many(limit)
        if not texts:
            return None
        self._writing = (len(texts), size)
        return self._encoder.frames(texts)

    def frames_written(self, nbytes: int) -> None:
        """The frames of the last `next_frames` are written (`nbytes` of frames: the queue
        counted their texts, so that is what is taken off it)."""
        count, size = self._writing
        self._writing = (0, 0)
        self.last_message_sent_ms = round(self._wall() * 1000)
        self._flow.sent(size, count)

    def _catch_up(self) -> None:
        """The PVs changed while behind, each sent once from its channel's current state."""
        pending, self._pending = list(self._pending), {}
        self._send_updates(pending)

    def housekeeping(self, now: float) -> None:
        if self._flow.closing_slow(now):
            return
        if self._images_waiting and not self._flow.merging() and self._image_room():
            # An image that stopped changing still gets its newest frame out.
            waiting, self._images_waiting = list(self._images_waiting), {}
            self._send_updates(waiting)

    def close(self) -> None:
        self._opening.clear()
        for pv in list(self.pvs.values()):
            self._release(pv)
        self.pvs.clear()
        self._flow.clear()

    def _queue_text(self, text: str) -> None:
        self._flow.push(text)


class _BadMessage(Exception):
    pass


def _may_read_errors(count: int, kind: object, msg: dict[str, Any]) -> bool:
    """Whether a client that sent this, its `count`-th message, reads `error` messages.

    Grafana's Archiver Appliance data source (its live mode's Go proxy, pkg/aalive) opens one
    socket per PV, sends one `subscribe` naming that PV and turns every message it receives into
    a data point: an `error` became a value 0 at 1970. Clients that read errors send more than
    that (cs-web-lib 0.10 subscribes its heartbeat PV besides the page's; pages of several PVs
    subscribe several; they write and clear, and a write comes before its own error). So a
    client that has sent nothing but one subscribe of one PV gets no `error` yet: errors wait, up
    to MAX_HELD_ERRORS, for its next message.
    """
    if count > 1 or kind not in ("subscribe", "monitor"):
        return True
    pvs = msg.get("pvs")
    return not isinstance(pvs, list | dict) or len(pvs) != 1


def utf8_size(text: str) -> int:
    """The bytes `text` takes on the socket: pvws's messages are mostly ASCII, for which this
    costs nothing (`isascii` reads a flag of the string)."""
    return len(text) if text.isascii() else len(text.encode())


def _shorten(text: str) -> str:
    return text if len(text) < 200 else text[:200] + " ..."


def _text(node: object) -> str:
    """A JSON node as Jackson's `asText()` gives it."""
    if isinstance(node, str):
        return node
    if isinstance(node, bool):
        return "true" if node else "false"
    if node is None:
        return "null"
    if isinstance(node, int | float):
        return str(node)
    return ""


def _pvs(msg: dict[str, Any], text: str) -> list[str]:
    pvs = msg.get("pvs")
    if pvs is None:
        raise _BadMessage(f"Missing 'pvs' in {_shorten(text)}")
    if isinstance(pvs, list):
        return [_text(x) for x in pvs]
    if isinstance(pvs, dict):
        return [_text(x) for x in pvs.values()]
    return []
