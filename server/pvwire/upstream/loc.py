"""`loc://` local PVs, as Phoebus and pvws name them: created on first use, kept in this process.

`loc://name(3.14)` starts as a number, `loc://name("text")` as a string, `loc://name(1, 2, 3)` as
a number array; `loc://name` alone as the number 0. The initial value only counts when the PV is
created: `loc://x(1)` and `loc://x(2)` are the same PV `x`, as in Phoebus. Every monitor of a
name sees every put to it. Writable by anyone the access rules let write.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable

import numpy as np

from ..errors import BadChannelId
from ..model import ConnState, Metadata, Reading, Value
from .base import Backend, ChannelSink, Monitor
from .convert import coerce_put_value

__all__ = ["LocBackend", "parse_loc"]

MAX_PVS = 10_000  # local PVs kept at once; the oldest unwatched go first beyond it
# name, optional <VType> (accepted, the type follows the initial value), optional (initial)
_NAME = re.compile(r"^([^(<\s]+)(?:<(\w+)>)?(?:\((.*)\))?$", re.DOTALL)


def parse_loc(name: str) -> tuple[str, Value]:
    """(core name, initial value) of what follows `loc://`; BadChannelId if malformed."""
    m = _NAME.match(name.strip())
    if m is None:
        raise BadChannelId(f"loc://{name}: expected NAME, NAME(initial) or NAME<VType>(initial)")
    core, initial = m.group(1), m.group(3)
    if initial is None or not initial.strip():
        return core, 0.0
    text = initial.strip()
    if text.startswith('"'):
        if len(text) < 2 or not text.endswith('"'):
            raise BadChannelId(f'loc://{name}: a text initial value needs closing quotes: "..."')
        return core, text[1:-1].replace('\\"', '"')
    items = [t.strip() for t in text.split(",")]
    try:
        numbers = [float(t) for t in items]
    except ValueError:
        raise BadChannelId(f"loc://{name}: initial value {text!r} is not a number") from None
    if len(numbers) == 1:
        return core, numbers[0]
    return core, np.array(numbers, dtype=np.float64)


def _meta(value: Value) -> Metadata:
    if isinstance(value, str):
        return Metadata("string", 1, "local PV", writable=True)
    count = len(value) if isinstance(value, np.ndarray) else 1
    return Metadata("float64", count, "local PV", "", writable=True)


def _now() -> tuple[int, int]:
    s, ns = divmod(time.time_ns(), 1_000_000_000)
    return s, ns


class _Local:
    __slots__ = ("meta", "ns", "s", "sinks", "value")

    def __init__(self, value: Value) -> None:
        self.value = value
        self.meta = _meta(value)
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
        is_array = isinstance(local.value, np.ndarray)
        local.value = coerce_put_value(
            f"loc://{name}", value, meta.type or "float64", is_array, None
        )
        if is_array and isinstance(local.value, np.ndarray) and len(local.value) != meta.count:
            local.meta = meta.replace(count=len(local.value))
        local.s, local.ns = _now()
        for sink in tuple(local.sinks):
            if local.meta is not meta:
                sink.on_meta(local.meta)
            sink.on_update(local.value, local.s, local.ns, 0, 0, "")

    def names(self) -> Iterable[str]:
        return tuple(self.locals)
