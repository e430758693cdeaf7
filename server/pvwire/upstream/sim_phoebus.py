"""Phoebus' sim names (`sim://flipflop(2)`, `sim://sine(-10, 10, 0.2)`, `sim://sinewave`) as
pvwire sim kinds and parameters.

Web UIs written for pvws use these: cs-web-lib subscribes to `sim://flipflop(29.929)` as its
connection heartbeat, and displays made for Phoebus name the others. Every function of Phoebus'
`org.phoebus.pv.sim.SimPVFactory` is here with its defaults and parameter forms: `FUNC`,
`FUNC()` or `FUNC(numbers)`, the numbers separated by commas, spaces or tabs, the last one the
update period in seconds (clamped to 0.01 s, Phoebus' 100 Hz limit). The longer names diirt used
(`sineWaveform`, `noiseWaveform`, `intermittentChannel`...) match by prefix as in Phoebus.

| Phoebus | parameters (defaults) | pvwire kind |
|---|---|---|
| sine | (min, max, update) or (min, max, steps, update); (-5, 5, 10, 1) | sine |
| ramp | (min, max, update) or (min, max, step, update); (-5, 5, 1, 1) | ramp |
| noise | (min, max, update); (-5, 5, 1), uniform | uniform |
| gaussianNoise | (center, std_dev, update); (0, 1, 0.1) | noise |
| flipflop | (update); (1), enum false/true | enum |
| strings | (update) or (max_length, update); (10, 0.1): "A", "AA", ... | strings |
| intermittent | (update), (update, value) or (update, min, max); (1, -5, 5) | intermittent |
| sinewave | (period, wavelength, size, update[, min, max]); (1, 10, 50, 0.1, -1, 1) | wave |
| sawtooth | (period, wavelength, size, update[, min, max]); (1, 10, 50, 0.1, -1, 1) | wave |
| gaussianWave | (period, std_dev, size, update); (1, 100, 100, 0.1) | wave |
| noiseWave | (min, max, update) or (min, max, size, update); (-5, 5, 100, 1) | wave |
| const | (value) as `loc://`: `const(3.14)`, `const("text")`, `const<VEnum>(0, "a")` | const |

A bare `sine`, `ramp` or `noise` is pvwire's own kind (module sim.py); `sine()` is Phoebus'.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from ..errors import BadChannelId
from .loc import parse_value

__all__ = ["PHOEBUS_FUNCTIONS", "from_phoebus", "is_phoebus_function"]

Params = dict[str, Any]


class _Usage(ValueError):
    """The numbers do not fit any of the function's parameter forms."""


def _rate(seconds: float) -> float:
    return 1.0 / max(seconds, 0.01)  # Phoebus' SimulatedPV: at most 100 Hz


def _flipflop(a: list[float]) -> tuple[str, Params]:
    if len(a) > 1:
        raise _Usage("no parameters or (update_seconds)")
    (update,) = a or [1.0]
    return "enum", {"choices": "false,true", "rate": _rate(update)}


def _sine(a: list[float]) -> tuple[str, Params]:
    if len(a) == 3:
        lo, hi, update = a
        steps = 10.0
    elif len(a) == 4:
        lo, hi, steps, update = a
    elif not a:
        lo, hi, steps, update = -5.0, 5.0, 10.0, 1.0
    else:
        raise _Usage(
            "no parameters, (min, max, update_seconds) or (min, max, steps, update_seconds)"
        )
    period = max(steps, 1.0) / _rate(update)
    return "sine", {
        "offset": (lo + hi) / 2,
        "amplitude": (hi - lo) / 2,
        "period": period,
        "rate": _rate(update),
    }


def _ramp(a: list[float]) -> tuple[str, Params]:
    if len(a) == 3:
        lo, hi, update = a
        step = 1.0
    elif len(a) == 4:
        lo, hi, step, update = a
    elif not a:
        lo, hi, step, update = -5.0, 5.0, 1.0, 1.0
    else:
        raise _Usage(
            "no parameters, (min, max, update_seconds) or (min, max, step, update_seconds)"
        )
    return "ramp", {"min": lo, "max": hi, "step": step or 1.0, "rate": _rate(update)}


def _noise(a: list[float]) -> tuple[str, Params]:
    if a and len(a) != 3:
        raise _Usage("no parameters or (min, max, update_seconds)")
    lo, hi, update = a or (-5.0, 5.0, 1.0)
    return "uniform", {"min": lo, "max": hi, "rate": _rate(update)}


def _gaussian_noise(a: list[float]) -> tuple[str, Params]:
    if a and len(a) != 3:
        raise _Usage("no parameters or (center, std_dev, update_seconds)")
    center, sigma, update = a or (0.0, 1.0, 0.1)
    return "noise", {"mean": center, "sigma": abs(sigma), "rate": _rate(update)}


def _strings(a: list[float]) -> tuple[str, Params]:
    if len(a) > 2:
        raise _Usage("no parameters, (update_seconds) or (max_length, update_seconds)")
    length, update = (10.0, 0.1) if not a else (10.0, a[0]) if len(a) == 1 else (a[0], a[1])
    return "strings", {"length": float(max(int(length), 1)), "rate": _rate(update)}


def _intermittent(a: list[float]) -> tuple[str, Params]:
    if len(a) > 3:
        raise _Usage("no parameters, (update_seconds), (update_seconds, value) or "
                     "(update_seconds, min, max)")  # fmt: skip
    update = a[0] if a else 1.0
    lo, hi = (-5.0, 5.0) if len(a) < 2 else (a[1], a[1]) if len(a) == 2 else (a[1], a[2])
    return "intermittent", {"min": lo, "max": hi, "rate": _rate(update)}


def _periodic_wave(shape: str) -> Callable[[list[float]], tuple[str, Params]]:
    def parse(a: list[float]) -> tuple[str, Params]:
        if len(a) == 4:
            a = [*a, -1.0, 1.0]
        elif not a:
            a = [1.0, 10.0, 50.0, 0.1, -1.0, 1.0]
        elif len(a) != 6:
            raise _Usage(
                "no parameters, (period_seconds, wavelength, size, update_seconds) or "
                "(period_seconds, wavelength, size, update_seconds, min, max)"
            )
        period, wavelength, size, update, lo, hi = a
        length = int(size) if int(size) > 0 else 10  # Phoebus: avoid a division by zero
        return "wave", {
            "shape": shape,
            "period": period,
            "wavelength": wavelength if wavelength > 0 else float(length),
            "length": float(length),
            "min": lo,
            "max": hi,
            "rate": _rate(update),
        }

    return parse


def _gaussian_wave(a: list[float]) -> tuple[str, Params]:
    if a and len(a) != 4:
        raise _Usage("no parameters or (period_seconds, std_dev, size, update_seconds)")
    period, width, size, update = a or (1.0, 100.0, 100.0, 0.1)
    return "wave", {
        "shape": "gaussian",
        "period": period,
        "width": width,
        "length": float(max(int(size), 1)),
        "min": 0.0,
        "max": 1.0,
        "rate": _rate(update),
    }


def _noise_wave(a: list[float]) -> tuple[str, Params]:
    if len(a) == 3:
        lo, hi, update = a
        size = 100.0
    elif len(a) == 4:
        lo, hi, size, update = a
    elif not a:
        lo, hi, size, update = -5.0, 5.0, 100.0, 1.0
    else:
        raise _Usage(
            "no parameters, (min, max, update_seconds) or (min, max, size, update_seconds)"
        )
    return "wave", {
        "shape": "uniform",
        "min": lo,
        "max": hi,
        "length": float(max(int(size), 0)),  # Phoebus: an empty array is fine
        "rate": _rate(update),
    }


_Parser = Callable[[list[float]], tuple[str, Params]]

# (how the function's name matches, its name, the parser), in Phoebus' order of tests.
_FUNCTIONS: tuple[tuple[Callable[[str], bool], str, _Parser], ...] = (
    (lambda f: f == "sine", "sine", _sine),
    (lambda f: f == "ramp", "ramp", _ramp),
    (lambda f: f == "noise", "noise", _noise),
    (lambda f: f.lower() == "gaussiannoise", "gaussianNoise", _gaussian_noise),
    (lambda f: f == "strings", "strings", _strings),
    (lambda f: f.startswith("intermittent"), "intermittent", _intermittent),
    (lambda f: f.startswith("sawtooth"), "sawtooth", _periodic_wave("sawtooth")),
    (lambda f: f.lower().startswith("sinewave"), "sinewave", _periodic_wave("sine")),
    (lambda f: f.lower().startswith("gaussianwave"), "gaussianWave", _gaussian_wave),
    (lambda f: f.lower().startswith("noisewave"), "noiseWave", _noise_wave),
    (lambda f: f == "flipflop", "flipflop", _flipflop),
)  # fmt: skip

PHOEBUS_FUNCTIONS = (*(name for _, name, _ in _FUNCTIONS), "const")

_SEPARATORS = re.compile(r"[ \t,]+")


def is_phoebus_function(func: str) -> bool:
    """Whether `func` (a name without parameters) names one of Phoebus' sim functions."""
    return func == "const" or any(matches(func) for matches, _, _ in _FUNCTIONS)


def from_phoebus(name: str) -> tuple[str, Params]:
    """(pvwire sim kind, parameters) of a Phoebus sim name; BadChannelId naming what is wrong.

    `const` gives kind `const` with the parameters `value` (model value), `meta` and `array`.
    """
    uri = f"sim://{name}"
    head, paren, rest = name.partition("(")
    func = head.strip()
    if func == "const" or func.startswith("const<"):
        const = parse_value(uri, name, "sim const")
        return "const", {"value": const.value, "meta": const.meta}
    if paren and not rest.rstrip().endswith(")"):
        raise BadChannelId(f"{uri}: missing ')' after the parameters")
    found = next(((label, parse) for matches, label, parse in _FUNCTIONS if matches(func)), None)
    if found is None:
        known = ", ".join(PHOEBUS_FUNCTIONS)
        raise BadChannelId(f"{uri}: unknown sim function {func!r} (Phoebus' are: {known})")
    label, parse = found
    inner = rest.rstrip()[:-1] if paren else ""
    numbers: list[float] = []
    for item in _SEPARATORS.split(inner.strip()):
        if not item:
            continue
        try:
            number = float(item)
        except ValueError:
            raise BadChannelId(f"{uri}: cannot parse a number from {item!r}") from None
        if not math.isfinite(number):
            raise BadChannelId(f"{uri}: {item!r} is not a finite number")
        numbers.append(number)
    try:
        return parse(numbers)
    except _Usage as exc:
        raise BadChannelId(f"{uri}: {label} takes {exc}, got {len(numbers)} numbers") from None
