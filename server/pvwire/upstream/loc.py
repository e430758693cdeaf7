"""`loc://` local PVs, as Phoebus and pvws name them: created on first use, kept in this process.

The name follows Phoebus' `LocalPVFactory`: `NAME`, `NAME(initial)` or `NAME<VType>(initial)`,
spaces allowed between the items of the initial value:

- `loc://x(3.14)` a number, `loc://x("Hello World")` a string, `loc://x(1, 2, 3)` a number
  array, `loc://x("a", "b")` a string array, `loc://x` alone the number 0;
- `<VType>` forces a type (matched as Phoebus does, ignoring case and by substring):
  `VDouble`, `VString`, `VDoubleArray`, `VStringArray`, `VLong`, `VInt`, `VBoolean`,
  `VEnum` (`loc://e<VEnum>(0, "A", "B")`: the index, then the labels) and `VTable` (the column
  names; the table starts empty).

A bare `loc://x` that nobody wrote yet takes its type from its first write (a string or an
array), as Phoebus' LocalPV does; after that, and for a PV with an initial value or a type, a
write must fit. The initial value only counts when the PV is created: `loc://x(1)` and
`loc://x(2)` are the same PV `x`, as in Phoebus. Every monitor of a name sees every put to it.
Writable by anyone the access rules let write. `parse_value` is also what `sim://const(...)`
uses, as Phoebus' `ConstPV` does.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..errors import BadChannelId, TypeMismatch
from ..limits import integer
from ..model import ConnState, Metadata, Reading, Value
from .base import Backend, ChannelSink, Monitor
from .convert import coerce_put_value

__all__ = ["LocBackend", "LocValue", "parse_loc", "parse_value"]

MAX_PVS = integer("loc_max_pvs")  # local PVs kept at once; the oldest unwatched go first beyond it
# The core name (no spaces, `(` or `<`), then what follows it: `<VType>`, `(initial)`, both.
_NAME = re.compile(r"([^(<\s]+)(.*)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class LocValue:
    """An initial value with its metadata, and whether puts take an array."""

    value: Value
    meta: Metadata
    array: bool
    untyped: bool = False  # `loc://x` alone: its first write may make it a string or an array


def parse_loc(name: str) -> tuple[str, LocValue]:
    """(core name, initial value) of what follows `loc://`; BadChannelId if malformed."""
    uri = f"loc://{name}"
    core, vtype, initial = _split(uri, name)
    return core, _value(uri, vtype, initial, "local PV", writable=True)


def parse_value(uri: str, name: str, description: str) -> LocValue:
    """The value of `NAME`, `NAME(initial)` or `NAME<VType>(initial)`, read-only (`const`);
    errors name `uri`."""
    _, vtype, initial = _split(uri, name)
    return _value(uri, vtype, initial, description, writable=False)


def _split(uri: str, name: str) -> tuple[str, str | None, str | None]:
    m = _NAME.fullmatch(name.strip())
    if m is None:
        raise BadChannelId(f"{uri}: expected NAME, NAME(initial) or NAME<VType>(initial)")
    core, rest = m.group(1), m.group(2).strip()
    vtype: str | None = None
    if rest.startswith("<"):
        end = rest.find(">")
        if end < 0:
            raise BadChannelId(f"{uri}: missing '>' after the type")
        vtype, rest = rest[1:end].strip(), rest[end + 1 :].strip()
    initial: str | None = None
    if rest.startswith("("):
        if not rest.endswith(")"):
            raise BadChannelId(f"{uri}: missing ')' after the initial value")
        initial = rest[1:-1]
    elif rest:
        raise BadChannelId(f"{uri}: {rest!r} after the name is neither <VType> nor (initial)")
    return core, vtype, initial


def split_items(name: str, text: str | None) -> list[str] | None:
    """Phoebus' items of an initial value: comma separated, trimmed, quoted strings kept with
    their quotes (commas and spaces inside quotes stay, `\\"` escapes a quote); None if empty."""
    if text is None or not text.strip():
        return None
    items: list[str] = []
    pos, n = 0, len(text)
    while pos < n:
        c = text[pos]
        if c in " \t":
            pos += 1
        elif c == '"':
            end = pos + 1
            while end < n and (text[end] != '"' or text[end - 1] == "\\"):
                end += 1
            if end >= n:
                raise BadChannelId(f"{name}: missing closing quote in the initial value")
            items.append(text[pos : end + 1])
            pos = end + 1
            while pos < n and text[pos] != ",":
                if text[pos] not in " \t":
                    raise BadChannelId(f"{name}: only spaces may follow a closing quote")
                pos += 1
            pos += 1
        else:
            end = text.find(",", pos)
            end = n if end < 0 else end
            items.append(text[pos:end].strip())
            pos = end + 1
    return items


def _text(item: str) -> str:
    if item.startswith('"'):
        return item[1:-1].replace('\\"', '"')
    return item


def _number(name: str, item: str) -> float:
    try:
        if item.startswith("0x"):
            return float(int(item[2:], 16))
        return float(item)
    except ValueError:
        raise BadChannelId(f"{name}: cannot parse a number from {item!r}") from None


def _one(name: str, items: list[str] | None, what: str) -> str:
    if items is None or len(items) != 1:
        raise BadChannelId(f"{name}: expected one {what}, got {items or 'none'}")
    return items[0]


# Phoebus' LocalPVFactory.parseType: lenient, first substring match wins, in this order.
_TYPES = (
    ("doublearray", "VDoubleArray"),
    ("double", "VDouble"),
    ("stringarray", "VStringArray"),
    ("string", "VString"),
    ("enum", "VEnum"),
    ("long", "VLong"),
    ("int", "VInt"),
    ("boolean", "VBoolean"),
    ("table", "VTable"),
)


def _vtype(name: str, vtype: str | None, items: list[str] | None) -> str:
    if vtype is None:
        strings = items is not None and any(i.startswith('"') for i in items)
        many = items is not None and len(items) > 1
        return (
            ("VStringArray" if many else "VString")
            if strings
            else ("VDoubleArray" if many else "VDouble")
        )
    lower = vtype.lower()
    for key, known in _TYPES:
        if key in lower:
            return known
    names = ", ".join(k for _, k in _TYPES)
    raise BadChannelId(f"{name}: local PVs cannot have type {vtype!r} (known: {names})")


def _value(
    name: str, vtype: str | None, initial: str | None, desc: str, writable: bool
) -> LocValue:
    items = split_items(name, initial)
    kind = _vtype(name, vtype, items)

    def meta(type_name: str, count: int = 1, **more: object) -> Metadata:
        return Metadata(type_name, count, desc, writable=writable, **more)  # type: ignore[arg-type]

    if kind == "VDouble":
        number = 0.0 if items is None else _number(name, _one(name, items, "number"))
        return LocValue(number, meta("float64", units=""), False, items is None and vtype is None)
    if kind in ("VLong", "VInt"):
        number = _number(name, _one(name, items, "number"))
        if not np.isfinite(number):
            raise BadChannelId(f"{name}: {number} is not an integer")
        return LocValue(int(number), meta("int64" if kind == "VLong" else "int32"), False)
    if kind == "VBoolean":
        flag = items is not None and _one(name, items, "boolean").lower() == "true"
        return LocValue(flag, meta("bool"), False)
    if kind == "VString":
        text = "" if items is None else _text(_one(name, items, "string"))
        return LocValue(text, meta("string"), False)
    if kind == "VDoubleArray":
        array = np.array([_number(name, i) for i in items or ()], dtype=np.float64)
        return LocValue(array, meta("float64", len(array), units=""), True)
    if kind == "VStringArray":
        strings = [_text(i) for i in items] if items is not None else [""]
        return LocValue(strings, meta("string", len(strings)), True)
    if kind == "VEnum":
        if items is None or len(items) < 2:
            raise BadChannelId(f'{name}: VEnum needs at least (index, "Label0")')
        try:
            index = int(items[0])
        except ValueError:
            raise BadChannelId(f"{name}: cannot parse the enum index {items[0]!r}") from None
        choices = tuple(_text(i) for i in items[1:])
        return LocValue(index, meta("enum", choices=choices), False)
    # VTable: the column names, every column an empty string array.
    headers = [_text(i) for i in items] if items is not None else []
    columns: dict[str, object] = {h: [] for h in headers}
    return LocValue(columns, meta("table", len(headers)), False)


def _first_write(value: object, meta: Metadata) -> LocValue | None:
    """What a never written `loc://x` becomes by a write that is not a number, as in Phoebus'
    LocalPV: a string, a number array, or a string array; None for anything else."""
    if isinstance(value, str):
        return LocValue(value, meta.replace(type="string", units=None), False)
    if isinstance(value, list | tuple | np.ndarray):
        items = list(value)
        numeric = all(
            isinstance(i, int | float | np.number) and not isinstance(i, bool) for i in items
        )
        if numeric:
            array = np.array(items, dtype=np.float64)
            return LocValue(array, meta.replace(count=len(array)), True)
        strings = [str(i) for i in items]
        return LocValue(strings, meta.replace(type="string", count=len(strings), units=None), True)
    return None


def _now() -> tuple[int, int]:
    s, ns = divmod(time.time_ns(), 1_000_000_000)
    return s, ns


class _Local:
    __slots__ = ("array", "meta", "ns", "s", "sinks", "untyped", "value")

    def __init__(self, initial: LocValue) -> None:
        self.value = initial.value
        self.meta = initial.meta
        self.array = initial.array
        self.untyped = initial.untyped
        self.s, self.ns = _now()
        self.sinks: dict[ChannelSink, None] = {}


class _LocMonitor:
    __slots__ = ("_handle", "_local", "_sink")

    def __init__(self, backend: LocBackend, name: str, sink: ChannelSink) -> None:
        self._sink = sink
        self._local: _Local | None = None
        loop = asyncio.get_running_loop()
        try:
            self._local = backend.local(name)
        except BadChannelId as exc:
            self._handle: asyncio.Handle | None = loop.call_soon(
                sink.on_connection, ConnState.FAILED, str(exc)
            )
            return
        self._handle = loop.call_soon(self._start)

    def _start(self) -> None:
        self._handle = None
        local = self._local
        assert local is not None
        local.sinks[self._sink] = None
        self._sink.on_meta(local.meta)
        self._sink.on_connection(ConnState.CONNECTED)
        self._sink.on_update(local.value, local.s, local.ns, 0, 0, "")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._local is not None:
            self._local.sinks.pop(self._sink, None)
            self._local = None


class LocBackend(Backend):
    scheme = "loc"

    def __init__(self, max_pvs: int = MAX_PVS) -> None:
        self.max_pvs = max_pvs
        self.locals: dict[str, _Local] = {}

    def check(self, name: str) -> None:
        parse_loc(name)

    def local(self, name: str) -> _Local:
        core, initial = parse_loc(name)
        local = self.locals.get(core)
        if local is None:
            if len(self.locals) >= self.max_pvs:
                unwatched = [k for k, v in self.locals.items() if not v.sinks]
                for key in unwatched[: max(1, len(self.locals) // 2)]:
                    del self.locals[key]
            if len(self.locals) >= self.max_pvs:
                raise BadChannelId(
                    f"loc://{core}: this server keeps at most {self.max_pvs} local PVs "
                    "and all of them are watched"
                )
            local = self.locals[core] = _Local(initial)
        return local

    def monitor(self, name: str, sink: ChannelSink) -> Monitor:
        return _LocMonitor(self, name, sink)

    async def get(self, name: str, timeout: float) -> Reading:
        local = self.local(name)
        return Reading(local.value, local.s, local.ns, meta=local.meta)

    async def put(self, name: str, value: object, wait: bool, timeout: float) -> None:
        local = self.local(name)
        meta = local.meta
        uri = f"loc://{name}"
        if meta.type == "table":
            raise TypeMismatch(f"cannot write {uri}: a local table PV takes no writes")
        try:
            local.value = coerce_put_value(
                uri, value, meta.type or "float64", local.array, meta.choices
            )
        except TypeMismatch:
            retyped = _first_write(value, meta) if local.untyped else None
            if retyped is None:
                raise
            local.value, local.meta, local.array = retyped.value, retyped.meta, retyped.array
        local.untyped = False  # the first write decides the type (Phoebus' LocalPV)
        array = local.array and isinstance(local.value, np.ndarray | list)
        if array and len(local.value) != local.meta.count:  # type: ignore[arg-type]
            local.meta = local.meta.replace(count=len(local.value))  # type: ignore[arg-type]
        local.s, local.ns = _now()
        for sink in tuple(local.sinks):
            if local.meta is not meta:
                sink.on_meta(local.meta)
            sink.on_update(local.value, local.s, local.ns, 0, 0, "")

    def names(self) -> Iterable[str]:
        return tuple(self.locals)
