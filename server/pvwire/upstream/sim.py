"""Simulated channels (`sim://KIND[/LABEL][?param=value&...]`), for demos, tests and benchmarks.

Kinds: sine, ramp, counter, noise, uniform, intermittent, strings, waveform, wave, image, enum
(periodic), value, string (writable, updated only by puts). Phoebus' names (`sine(-5, 5, 0.1)`,
`sinewave`, `const(3.14)`...) map onto these (sim_phoebus.py).

A periodic channel does not own a task or timer: channels are grouped by update rate and each
group is driven by ONE `loop.call_at` chain that updates all its members in a tight loop with one
shared timestamp. 10,000 counters at 10 Hz then cost one timer callback per
tick plus a method call and a sink call per channel.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import numpy as np

from ..errors import BadChannelId, ReadOnlyChannel
from ..limits import SIM_MAX_COMPUTED_PER_S, SIM_MAX_STORES, integer, number
from ..model import ConnState, Metadata, Reading, Value
from .base import Backend, ChannelSink, Monitor
from .convert import coerce_put_value
from .sim_image import IMAGE_DTYPES, image_frame, image_metadata
from .sim_phoebus import PHOEBUS_FUNCTIONS, from_phoebus, is_phoebus_function

__all__ = ["KINDS", "SimBackend", "SimLimits", "SimSpec", "parse_sim"]

log = logging.getLogger(__name__)

# Per kind: its parameters with defaults. Numbers only, except the enum `choices`/waveform `shape`
# and the writable kinds' `initial`.
KINDS: dict[str, dict[str, Any]] = {
    "sine": {"period": 10.0, "amplitude": 1.0, "offset": 0.0, "rate": 10.0},
    "ramp": {"min": 0.0, "max": 10.0, "step": 1.0, "rate": 10.0},
    "counter": {"rate": 10.0},
    "noise": {"mean": 0.0, "sigma": 1.0, "rate": 10.0},
    # The defaults of the Phoebus functions these serve (sim_phoebus.py), so a bare name agrees.
    "uniform": {"min": -5.0, "max": 5.0, "rate": 1.0},
    "intermittent": {"min": -5.0, "max": 5.0, "rate": 1.0},
    "strings": {"length": 10.0, "rate": 10.0},
    "waveform": {"length": 1000.0, "rate": 10.0, "shape": "sine", "period": 10.0},
    "wave": {
        "shape": "sine",
        "min": -1.0,
        "max": 1.0,
        "length": 50.0,
        "wavelength": 10.0,
        "period": 1.0,
        "width": 100.0,
        "rate": 10.0,
    },
    "image": {"width": 640.0, "height": 480.0, "dtype": "uint16", "color": "mono", "rate": 10.0},
    "enum": {"choices": "Off,On", "rate": 1.0},
    "value": {"initial": 0.0},
    "string": {"initial": ""},
}
_TEXT_PARAMS = {"shape", "choices", "initial", "dtype", "color"}


@dataclass(frozen=True, slots=True)
class SimLimits:
    """What one sim channel may cost; from the server's settings (`sim_*`).

    Without them `sim://waveform?length=10000000&rate=1000` asked for 80 GB/s from one request.
    """

    max_rate: float = number("sim_max_rate")  # Hz; faster would only measure the loop
    max_length: int = integer("sim_max_length")  # elements: a 2048 x 2048 image's worth
    max_bytes_per_s: float = number(
        "sim_max_bytes_per_s"
    )  # a 1,000,000-point float64 at 10 Hz is 80 MB/s
    max_stores: int = SIM_MAX_STORES  # writable `value/NAME` and `string/NAME` instances
    # `wave` computes every element of every update (sin over 1,000,000 points took 187 ms
    # here): 1,000,000 elements/s per channel is under a fifth of a core at worst.
    max_computed_per_s: float = SIM_MAX_COMPUTED_PER_S


@dataclass(frozen=True, slots=True)
class SimSpec:
    """A parsed sim id: kind, optional label (distinguishes instances) and parameters."""

    kind: str
    label: str
    params: dict[str, Any]

    @property
    def rate(self) -> float:
        return float(self.params.get("rate", 0.0))

    @property
    def key(self) -> str:
        """Identity of a writable instance: `value/A?initial=1` and `value/A` share state."""
        return f"{self.kind}/{self.label}"


def parse_sim(name: str, limits: SimLimits = SimLimits()) -> SimSpec:
    """Parse the part after `sim://`; raise BadChannelId with the reason when it cannot work."""
    if _is_phoebus(name):
        # `flipflop(2)`, `sinewave`: the names Phoebus and the pvws-era web UIs use
        kind, params = from_phoebus(name)
        if kind != "const":
            params = {**KINDS[kind], **params}
            _check(name, kind, params, limits)
        return SimSpec(kind, "", params)
    path, _, query = name.partition("?")
    kind, _, label = path.partition("/")
    if kind not in KINDS:
        known = ", ".join(KINDS)
        phoebus = ", ".join(PHOEBUS_FUNCTIONS)
        raise BadChannelId(
            f"sim://{name}: unknown sim kind {kind!r} (known: {known}; Phoebus': {phoebus})"
        )
    defaults = KINDS[kind]
    params = dict(defaults)
    for key, text in parse_qsl(query, keep_blank_values=True):
        if key not in defaults:
            known = ", ".join(defaults) or "none"
            raise BadChannelId(f"sim://{name}: unknown parameter {key!r} for {kind} ({known})")
        if key in _TEXT_PARAMS and isinstance(defaults[key], str):
            params[key] = text
            continue
        try:
            number = float(text)
        except ValueError:
            raise BadChannelId(f"sim://{name}: {key}={text!r} is not a number") from None
        if not math.isfinite(number):
            raise BadChannelId(f"sim://{name}: {key}={text!r} is not finite")
        params[key] = number
    _check(name, kind, params, limits)
    return SimSpec(kind, label, params)


def _is_phoebus(name: str) -> bool:
    """`FUNC(...)`, or a bare `FUNC` that is not one of pvwire's kinds (`sinewave`)."""
    if "(" in name or name.startswith("const<"):
        return True
    return name not in KINDS and is_phoebus_function(name)


def _check(name: str, kind: str, p: dict[str, Any], limits: SimLimits) -> None:
    def bad(why: str) -> BadChannelId:
        return BadChannelId(f"sim://{name}: {why}")

    if "rate" in p and not 0 < p["rate"] <= limits.max_rate:
        raise bad(f"rate must be in (0, {limits.max_rate:g}] Hz on this server, got {p['rate']:g}")
    if "period" in p and p["period"] <= 0 and kind != "wave":
        raise bad(f"period must be > 0 s, got {p['period']:g}")
    if kind == "ramp" and (p["max"] < p["min"] or p["step"] == 0):
        raise bad("ramp needs min <= max and a step other than 0 (< 0 ramps down)")
    if kind == "strings" and not (1 <= p["length"] <= 40 and float(p["length"]).is_integer()):
        raise bad("strings needs an integer length in [1, 40] (a CA string holds 40)")
    if kind == "wave":
        _check_wave(p, limits, bad)
    if kind == "noise" and p["sigma"] < 0:
        raise bad("sigma must be >= 0")
    if kind == "waveform":
        if not 1 <= p["length"] <= limits.max_length or not float(p["length"]).is_integer():
            raise bad(f"length must be an integer in [1, {limits.max_length}] on this server")
        if p["length"] * 8 * p["rate"] > limits.max_bytes_per_s:
            raise bad(
                f"length x rate is {p['length'] * 8 * p['rate'] / 1e6:g} MB/s of float64; "
                f"this server allows {limits.max_bytes_per_s / 1e6:g} MB/s per sim channel"
            )
        if p["shape"] not in ("sine", "noise"):
            raise bad(f"shape must be 'sine' or 'noise', got {p['shape']!r}")
    if kind == "image":
        _check_image(p, limits, bad)
    if kind == "enum":
        choices = [c for c in p["choices"].split(",") if c]
        if not choices:
            raise bad("enum needs at least one choice")


def _check_wave(p: dict[str, Any], limits: SimLimits, bad: Callable[[str], BadChannelId]) -> None:
    if p["shape"] not in ("sine", "sawtooth", "gaussian", "uniform"):
        raise bad(f"shape must be sine, sawtooth, gaussian or uniform, got {p['shape']!r}")
    if not 0 <= p["length"] <= limits.max_length or not float(p["length"]).is_integer():
        raise bad(f"length must be an integer in [0, {limits.max_length}] on this server")
    if p["wavelength"] <= 0 or p["width"] <= 0:
        raise bad("wavelength and width must be > 0")
    if p["length"] * p["rate"] > limits.max_computed_per_s:
        raise bad(
            f"length x rate is {p['length'] * p['rate']:g} elements/s; this server computes at "
            f"most {limits.max_computed_per_s:g} per wave channel"
        )


def _check_image(p: dict[str, Any], limits: SimLimits, bad: Callable[[str], BadChannelId]) -> None:
    for side in ("width", "height"):
        if not 1 <= p[side] <= limits.max_length or not float(p[side]).is_integer():
            raise bad(f"{side} must be a positive integer")
    if p["dtype"] not in IMAGE_DTYPES:
        raise bad(f"dtype must be one of {', '.join(IMAGE_DTYPES)}, got {p['dtype']!r}")
    if p["color"] not in ("mono", "RGB1"):
        raise bad(f"color must be 'mono' or 'RGB1', got {p['color']!r}")
    elements = p["width"] * p["height"] * (3 if p["color"] == "RGB1" else 1)
    if elements > limits.max_length:
        raise bad(
            f"width x height x colours is {elements:g}; this server allows {limits.max_length}"
        )
    rate_bytes = elements * np.dtype(p["dtype"]).itemsize * p["rate"]
    if rate_bytes > limits.max_bytes_per_s:
        raise bad(
            f"the image is {rate_bytes / 1e6:g} MB/s; "
            f"this server allows {limits.max_bytes_per_s / 1e6:g} MB/s per sim channel"
        )


def _now() -> tuple[int, int]:
    s, ns = divmod(time.time_ns(), 1_000_000_000)
    return s, ns


def _metadata(spec: SimSpec) -> Metadata:
    p, kind = spec.params, spec.kind
    desc = f"sim {kind}"
    if kind == "sine":
        lo, hi = p["offset"] - abs(p["amplitude"]), p["offset"] + abs(p["amplitude"])
        return Metadata("float64", 1, desc, "", 3, display=(lo, hi), writable=False)
    if kind in ("ramp", "uniform", "intermittent"):
        return Metadata("float64", 1, desc, "", 3, display=(p["min"], p["max"]), writable=False)
    if kind == "strings":
        return Metadata("string", 1, desc, writable=False)
    if kind == "wave":
        lo, hi = sorted((p["min"], p["max"]))
        return Metadata("float64", int(p["length"]), desc, "", 3, display=(lo, hi), writable=False)
    if kind == "const":
        meta: Metadata = p["meta"]
        return meta
    if kind == "counter":
        return Metadata("int64", 1, desc, "counts", 0, writable=False)
    if kind == "noise":
        lo, hi = p["mean"] - 3 * p["sigma"], p["mean"] + 3 * p["sigma"]
        return Metadata("float64", 1, desc, "", 3, display=(lo, hi), writable=False)
    if kind == "waveform":
        limits = (-1.0, 1.0) if p["shape"] == "sine" else (-3.0, 3.0)
        return Metadata("float64", int(p["length"]), desc, "", 3, display=limits, writable=False)
    if kind == "image":
        return image_metadata(p, desc)
    if kind == "enum":
        choices = tuple(c for c in p["choices"].split(",") if c)
        return Metadata("enum", 1, desc, choices=choices, writable=False)
    if kind == "value":
        return Metadata("float64", 1, desc, "", 3, writable=True)
    return Metadata("string", 1, desc, writable=True)


class _Sim:
    """One periodic simulated channel feeding one sink. `step` computes and delivers a value."""

    __slots__ = ("closed", "k", "sink", "spec", "step", "value")

    def __init__(self, spec: SimSpec, sink: ChannelSink) -> None:
        self.spec = spec
        self.sink = sink
        self.closed = False
        self.k = 0  # ticks so far
        self.value: Value = None
        self.step: Callable[[int, int], None] = getattr(self, "_step_" + spec.kind)

    def initial(self) -> Value:
        """First value; equal to what a fresh `get` would read."""
        self.value = _fresh_value(self.spec, self.k)
        return self.value

    # One method per kind, looked up once: the tick loop does no dispatch on the kind.
    def _step_counter(self, s: int, ns: int) -> None:
        self.k += 1
        self.value = self.k
        self.sink.on_update(self.k, s, ns, 0, 0, "")

    def _step_sine(self, s: int, ns: int) -> None:
        p = self.spec.params
        v = p["offset"] + p["amplitude"] * math.sin(2 * math.pi * (s + ns * 1e-9) / p["period"])
        self.value = v
        self.sink.on_update(v, s, ns, 0, 0, "")

    def _step_ramp(self, s: int, ns: int) -> None:
        self.k += 1
        v = _ramp(self.spec.params, self.k)
        self.value = v
        self.sink.on_update(v, s, ns, 0, 0, "")

    def _step_noise(self, s: int, ns: int) -> None:
        p = self.spec.params
        v = random.gauss(p["mean"], p["sigma"])
        self.value = v
        self.sink.on_update(v, s, ns, 0, 0, "")

    def _step_uniform(self, s: int, ns: int) -> None:
        p = self.spec.params
        v = random.uniform(p["min"], p["max"])
        self.value = v
        self.sink.on_update(v, s, ns, 0, 0, "")

    def _step_intermittent(self, s: int, ns: int) -> None:
        # Phoebus' IntermittentPV: every other update is a disconnect.
        self.k += 1
        if self.k % 2:
            self.sink.on_connection(ConnState.DISCONNECTED, "sim intermittent: every other update")
            return
        p = self.spec.params
        v = random.uniform(p["min"], p["max"])
        self.value = v
        self.sink.on_connection(ConnState.CONNECTED)
        self.sink.on_update(v, s, ns, 0, 0, "")

    def _step_strings(self, s: int, ns: int) -> None:
        self.k += 1
        v = _strings(self.spec.params, self.k)
        self.value = v
        self.sink.on_update(v, s, ns, 0, 0, "")

    def _step_wave(self, s: int, ns: int) -> None:
        v = _wave(self.spec.params, s + ns * 1e-9)
        self.value = v
        self.sink.on_update(v, s, ns, 0, 0, "")

    def _step_waveform(self, s: int, ns: int) -> None:
        v = _waveform(self.spec.params, s + ns * 1e-9)
        self.value = v
        self.sink.on_update(v, s, ns, 0, 0, "")

    def _step_image(self, s: int, ns: int) -> None:
        self.k += 1
        v = image_frame(self.spec.params, self.k)
        self.value = v
        self.sink.on_update(v, s, ns, 0, 0, "")

    def _step_enum(self, s: int, ns: int) -> None:
        self.k += 1
        v = self.k % len(self.spec.params["choices"].split(","))
        self.value = v
        self.sink.on_update(v, s, ns, 0, 0, "")


_RNG = np.random.default_rng()


def _ramp(p: dict[str, Any], k: int) -> float:
    step = p["step"]
    span = int((p["max"] - p["min"]) // abs(step)) + 1
    start = p["min"] if step > 0 else p["max"]  # a negative step ramps down from max (Phoebus)
    return float(start + (k % span) * step)


def _strings(p: dict[str, Any], k: int) -> str:
    return "A" * (k % int(p["length"]) + 1)  # Phoebus' StringsPV: A, AA, ... then A again


def _wave(p: dict[str, Any], t: float) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Phoebus' running waves, computed whole (sizes are small: 50 and 100 by default)."""
    n, shape = int(p["length"]), p["shape"]
    lo, hi = float(p["min"]), float(p["max"])
    if shape == "uniform":
        return lo + _RNG.random(n) * (hi - lo)
    period = float(p["period"])
    phase = t / period if period > 0 else 0.0  # period <= 0: a wave that stands still (Phoebus)
    if shape == "gaussian":
        dx = np.arange(n) - n / 2.0
        table = np.exp(-dx * dx / float(p["width"]))
        shift = int((phase % 1.0) * n)
        return np.concatenate((table[shift:], table[:shift]))
    wavelength = float(p["wavelength"])
    x = phase + np.arange(n) / wavelength
    if shape == "sine":
        return lo + (np.sin(2 * math.pi * x) + 1.0) / 2.0 * (hi - lo)
    # sawtooth: the range widened so the last sample of a wavelength (almost) reaches max
    return lo + (x % 1.0) * (hi - lo) * (1.0 + 1.0 / wavelength)


def _waveform(p: dict[str, Any], t: float) -> np.ndarray[Any, np.dtype[np.float64]]:
    """One period of the shape, rotated to the phase at `t`: a copy of a cached table.

    Computing `sin` over 1,000,000 points took 187 ms on the event loop here, so five GraphQL
    aliases of a big sim waveform held every stream for a second; a rotation is a memory copy.
    """
    n = int(p["length"])
    table = _table(n, p["shape"])
    noise = p["shape"] == "noise"
    shift = int(_RNG.integers(n)) if noise else round((t / p["period"]) % 1.0 * n) % n
    return np.concatenate((table[shift:], table[:shift]))


_TABLE_BYTES = integer("sim_table_cache_bytes")  # 16 million float64
_tables: dict[tuple[int, str], np.ndarray[Any, np.dtype[np.float64]]] = {}


def _table(n: int, shape: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    key = (n, shape)
    table = _tables.pop(key, None)
    if table is None:
        if shape == "noise":
            table = _RNG.standard_normal(n)
        else:
            table = np.sin(np.linspace(0.0, 2 * math.pi, n, endpoint=False))
        table.flags.writeable = False
        while _tables and sum(t.nbytes for t in _tables.values()) + table.nbytes > _TABLE_BYTES:
            del _tables[next(iter(_tables))]  # least recently used first
    _tables[key] = table  # most recently used last
    return table


def _fresh_value(spec: SimSpec, k: int) -> Value:
    p, kind = spec.params, spec.kind
    if kind == "counter":
        return k
    if kind == "sine":
        return float(
            p["offset"] + p["amplitude"] * math.sin(2 * math.pi * time.time() / p["period"])
        )
    if kind == "ramp":
        return _ramp(p, k)
    if kind == "noise":
        return random.gauss(p["mean"], p["sigma"])
    if kind in ("uniform", "intermittent"):
        return random.uniform(p["min"], p["max"])
    if kind == "strings":
        return _strings(p, k)
    if kind == "wave":
        return _wave(p, time.time())
    if kind == "const":
        value: Value = p["value"]
        return value
    if kind == "waveform":
        return _waveform(p, time.time())
    if kind == "image":
        return image_frame(p, k)
    if kind == "enum":
        return k % len(p["choices"].split(","))
    raise AssertionError(kind)  # writable kinds live in _Store


class _Group:
    """All periodic channels of one rate, driven by one `loop.call_at` chain."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rate: float, on_empty: Callable[[], None]):
        self.loop = loop
        self.period = 1.0 / rate
        self.members: dict[_Sim, None] = {}  # insertion-ordered set
        self._snapshot: tuple[_Sim, ...] = ()
        self._dirty = False
        self._on_empty = on_empty
        self._next = loop.time() + self.period
        self._handle: asyncio.TimerHandle | None = loop.call_at(self._next, self._tick)

    def add(self, sim: _Sim) -> None:
        self.members[sim] = None
        self._dirty = True

    def remove(self, sim: _Sim) -> None:
        self.members.pop(sim, None)
        self._dirty = True
        if not self.members:
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
            self._on_empty()

    def _tick(self) -> None:
        if self._dirty:
            # Rebuilt only when membership changed: iterating a tuple is safe while a sink
            # closes monitors, and costs nothing per tick.
            self._snapshot = tuple(self.members)
            self._dirty = False
        s, ns = _now()
        for sim in self._snapshot:
            if sim.closed:
                continue
            try:
                sim.step(s, ns)
            except Exception:  # one broken sink must not stop the other channels
                log.exception("sim update failed for %s", sim.spec.kind)
        if self._handle is None:
            return  # the group emptied during this tick
        now = self.loop.time()
        self._next += self.period
        if self._next < now:
            # Fell behind (overloaded loop): skip missed ticks instead of bursting to catch up.
            self._next = now + self.period - (now - self._next) % self.period
        self._handle = self.loop.call_at(self._next, self._tick)


class _Store:
    """State of one writable instance (`value/NAME`, `string/NAME`), shared by its monitors."""

    __slots__ = ("meta", "monitors", "ns", "s", "sinks", "value")

    def __init__(self, spec: SimSpec) -> None:
        self.meta = _metadata(spec)
        initial = spec.params["initial"]
        self.value: Value = str(initial) if spec.kind == "string" else float(initial)
        self.s, self.ns = _now()
        self.sinks: dict[ChannelSink, None] = {}
        # Monitors holding it, started or not: one not yet started has no sink here but must
        # not lose its instance to eviction.
        self.monitors = 0


class _SimMonitor:
    __slots__ = ("_backend", "_handle", "_name", "_sim", "_sink", "_store")

    def __init__(self, backend: SimBackend, name: str, sink: ChannelSink) -> None:
        self._backend = backend
        self._name = name
        self._sink = sink
        self._sim: _Sim | None = None
        self._store: _Store | None = None
        loop = asyncio.get_running_loop()
        try:
            spec = parse_sim(name, backend.limits)
            if spec.kind in ("value", "string"):
                self._store = backend.store(spec)
                self._store.monitors += 1
        except BadChannelId as e:
            # Reported from the loop, not from inside monitor(): the caller is still setting up.
            self._handle: asyncio.Handle | None = loop.call_soon(
                sink.on_connection, ConnState.FAILED, str(e)
            )
            return
        if self._store is not None:
            self._handle = loop.call_soon(self._start_store)
        elif spec.kind == "const":
            self._handle = loop.call_soon(self._start_const, spec)
        else:
            self._sim = _Sim(spec, sink)
            self._handle = loop.call_soon(self._start_sim)

    def _start_sim(self) -> None:
        self._handle = None
        sim = self._sim
        assert sim is not None
        s, ns = _now()
        self._sink.on_meta(_metadata(sim.spec))
        self._sink.on_connection(ConnState.CONNECTED)
        self._sink.on_update(sim.initial(), s, ns, 0, 0, "")
        self._backend.group(sim.spec.rate).add(sim)
        self._backend.live[self._name] = sim

    def _start_const(self, spec: SimSpec) -> None:
        self._handle = None
        s, ns = _now()
        self._sink.on_meta(_metadata(spec))
        self._sink.on_connection(ConnState.CONNECTED)
        self._sink.on_update(_fresh_value(spec, 0), s, ns, 0, 0, "")

    def _start_store(self) -> None:
        self._handle = None
        store = self._store
        assert store is not None
        store.sinks[self._sink] = None
        self._sink.on_meta(store.meta)
        self._sink.on_connection(ConnState.CONNECTED)
        self._sink.on_update(store.value, store.s, store.ns, 0, 0, "")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._sim is not None and not self._sim.closed:
            sim = self._sim
            sim.closed = True
            if self._backend.live.get(self._name) is sim:
                del self._backend.live[self._name]
            group = self._backend.groups.get(sim.spec.rate)
            if group is not None:
                group.remove(sim)
        if self._store is not None:
            self._store.sinks.pop(self._sink, None)
            self._store.monitors -= 1
            self._store = None


class SimBackend(Backend):
    """`sim://` channels: everything in-process, no network."""

    scheme = "sim"

    def __init__(self, limits: SimLimits = SimLimits()) -> None:
        self.limits = limits
        self.groups: dict[float, _Group] = {}
        self.stores: OrderedDict[str, _Store] = OrderedDict()
        # The latest periodic channel opened per name, so a get reads what monitors see.
        self.live: dict[str, _Sim] = {}

    def group(self, rate: float) -> _Group:
        group = self.groups.get(rate)
        if group is None:
            group = self.groups[rate] = _Group(
                asyncio.get_running_loop(), rate, lambda: self._drop_group(rate)
            )
        return group

    def _drop_group(self, rate: float) -> None:
        self.groups.pop(rate, None)

    def store(self, spec: SimSpec) -> _Store:
        """The writable instance `spec` names, made when new; BadChannelId when a new one would
        pass `max_stores` and every instance is monitored."""
        store = self.stores.get(spec.key)
        if store is not None:
            self.stores.move_to_end(spec.key)
            return store
        self._make_room(spec)
        store = self.stores[spec.key] = _Store(spec)
        return store

    def _make_room(self, spec: SimSpec) -> None:
        """Puts to ever new names must not grow the process without end: at `max_stores`, the
        least recently written instances nobody monitors are forgotten."""
        excess = len(self.stores) + 1 - self.limits.max_stores
        if excess <= 0:
            return
        idle = [key for key, store in self.stores.items() if not store.monitors][:excess]
        for key in idle:
            del self.stores[key]
        if len(idle) < excess:
            raise BadChannelId(
                f"sim://{spec.key}: this server keeps at most {self.limits.max_stores:,} "
                "writable sim instances (sim_max_stores) and all of them are monitored"
            )

    def monitor(self, name: str, sink: ChannelSink) -> Monitor:
        return _SimMonitor(self, name, sink)

    async def get(self, name: str, timeout: float) -> Reading:
        spec = parse_sim(name, self.limits)
        if spec.kind in ("value", "string"):
            # A get keeps nothing: an instance nobody wrote reads as its initial value.
            store = self.stores.get(spec.key) or _Store(spec)
            return Reading(store.value, store.s, store.ns, meta=store.meta)
        s, ns = _now()
        sim = self.live.get(name)
        value = sim.value if sim is not None else _fresh_value(spec, 0)
        return Reading(value, s, ns, meta=_metadata(spec))

    async def put(self, name: str, value: object, wait: bool, timeout: float) -> None:
        spec = parse_sim(name, self.limits)
        if spec.kind not in ("value", "string"):
            raise ReadOnlyChannel(f"sim://{name}: sim {spec.kind} channels are read-only")
        store = self.store(spec)
        type_name = "string" if spec.kind == "string" else "float64"
        store.value = coerce_put_value(f"sim://{name}", value, type_name, False, None)
        store.s, store.ns = _now()
        for sink in tuple(store.sinks):
            sink.on_update(store.value, store.s, store.ns, 0, 0, "")

    def check(self, name: str) -> None:
        parse_sim(name, self.limits)

    def names(self) -> Iterable[str]:
        return tuple(KINDS)

    async def close(self) -> None:
        for group in list(self.groups.values()):
            if group._handle is not None:
                group._handle.cancel()
                group._handle = None
        self.groups.clear()
        self.live.clear()
