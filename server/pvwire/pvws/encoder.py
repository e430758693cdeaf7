"""pvws's `update` messages as JSON text, each made once for every client that needs it.

An update is shaped as pvws's `Vtype2Json` writes it: metadata, `vtype` and `severity` with a
PV's first value, then the severity only when it changes; `readonly` first and on change; arrays
as little-endian base64. The text of a channel's state is made once per PV name and variant (with
or without metadata, severity, readonly) and the same string is queued for every client that
needs that variant (DESIGN.md section 7a); the per-client part is only which variant
(session.py). docs/PVWS.md compares it with pvws type by type (`TYPES`).
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson

from ..model import VALUE, ConnState, Metadata, Severity
from .frames import text_frames

__all__ = [
    "CA_TYPES",
    "TYPES",
    "UNDEFINED",
    "ChannelState",
    "Entry",
    "PvwsEncoder",
    "PvwsType",
    "connected",
    "failure",
    "json_text",
    "severity_name",
]

# pvws names the EPICS severities as model.py does, except NO_ALARM, which it calls NONE.
SEVERITIES = tuple("NONE" if s == Severity.NO_ALARM else s.name for s in Severity)
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


def _number(x: float) -> Any:
    """A display limit as Jackson writes a double: non-finite numbers as strings."""
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def json_text(obj: object) -> str:
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
    return json_text(out)[1:-1]


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
        return "VEnum", f'"value":{value},"text":{json_text(label)}', False
    if isinstance(value, bool):
        return "VBoolean", f'"value":{int(value)}', True
    if isinstance(value, float):
        shown = repr(value) if math.isfinite(value) else '"NaN"'
        return _scalar_vtype(ch, value), f'"value":{shown}', True
    if isinstance(value, int):
        return _scalar_vtype(ch, value), f'"value":{value}', True
    if isinstance(value, str):
        return "VString", f'"text":{json_text(value)}', False
    if isinstance(value, list) and all(type(x) is str for x in value):
        # pvws sends what Java's toString() gives for types it does not map (VStringArray).
        return "VStringArray", f'"text":{json_text("[" + ", ".join(value) + "]")}', False
    # Structures and tables: pvws passes them as text; JSON text is at least parseable.
    return "VType", f'"text":{json_text(_json_safe(value))}', False


def _json_safe(value: object) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except TypeError:
        return str(value)


class Entry:
    """The texts of one PV name for its channel's current state, shared by its clients."""

    __slots__ = (
        "disconnected_at",
        "head",
        "plain_frame",
        "plain_meta",
        "plain_text",
        "plain_updates",
        "refs",
        "texts",
        "version",
    )

    def __init__(self, name: str) -> None:
        self.head = '{"type":"update","pv":' + json_text(name)
        self.refs = 0
        self.version: tuple[object, ...] = ()
        self.texts: dict[tuple[bool, bool, bool | None], str] = {}
        self.disconnected_at: tuple[int, int] = (0, 0)
        # The last value-only text of a connected state (`value_text`), what it was made from
        # (the channel's update count and metadata) and its WebSocket frame, which the compiled
        # splice copies for every client (core/_fanout.c reads these four slots).
        self.plain_updates = -1
        self.plain_meta: Metadata | None = None
        self.plain_text = ""
        self.plain_frame = b""


class PvwsEncoder:
    """The hub-wide cache of pvws texts: a channel's change is encoded once per variant, however
    many clients watch it (the variant is all that differs between clients)."""

    def __init__(self, wall: Callable[[], int] = time.time_ns) -> None:
        self._entries: dict[str, Entry] = {}
        self._wall = wall
        self.encoded = 0  # texts made, for tests and benchmarks: once per state and variant

    def acquire(self, name: str) -> Entry:
        """Count a client of `name`; its entry, where the texts of `name` are kept."""
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = Entry(name)
        entry.refs += 1
        return entry

    def release(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is not None:
            entry.refs -= 1
            if entry.refs <= 0:
                del self._entries[name]

    def value_text(self, name: str, ch: ChannelState) -> str:
        """`text(name, ch, False, False, None)` of a connected `ch`: the update most sent, looked
        up by what it depends on (the value's update count and the metadata that types it)."""
        entry = self._entries.get(name)
        if entry is None:
            return self.text(name, ch, False, False, None)
        if entry.plain_updates != ch.updates or entry.plain_meta is not ch.meta:
            self._plain(entry, name, ch)
        return entry.plain_text

    def value_frame(self, name: str, ch: ChannelState) -> bytes:
        """`value_text` as one WebSocket text frame, made once per state for every client."""
        entry = self._entries.get(name)
        if entry is None:
            return text_frames((self.text(name, ch, False, False, None),))
        if entry.plain_updates != ch.updates or entry.plain_meta is not ch.meta:
            self._plain(entry, name, ch)
        return entry.plain_frame

    def _plain(self, entry: Entry, name: str, ch: ChannelState) -> None:
        value = ch.value
        if (isinstance(value, float) and math.isfinite(value)) or (
            type(value) is int and ch.meta.type != "enum"
        ):
            # A number, the value most sent: what `_encode` makes of it, without its steps.
            text = (
                f'{entry.head},"value":{value!r},"seconds":{ch.seconds},"nanos":{ch.nanoseconds}}}'
            )
            self.encoded += 1
        else:
            text = self.text(name, ch, False, False, None)
        entry.plain_updates, entry.plain_meta = ch.updates, ch.meta
        entry.plain_text, entry.plain_frame = text, text_frames((text,))

    def text(
        self, name: str, ch: ChannelState, meta: bool, severity: bool, readonly: bool | None
    ) -> str:
        """The update for `ch`'s current state, with metadata and/or severity and/or readonly."""
        entry = self._entries.get(name)
        if entry is None:  # not acquired (a caller's slip): still correct, just not shared
            entry = Entry(name)
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
        self, entry: Entry, ch: ChannelState, meta: bool, severity: bool, readonly: bool | None
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
                    parts.append(f',"labels":{json_text(list(ch.meta.choices or ()))}')
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
