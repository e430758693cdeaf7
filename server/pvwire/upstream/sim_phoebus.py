"""Phoebus-style sim names (`sim://flipflop(2)`, `sim://sine(-5, 5, 0.1)`) as pvwire sim ids.

Web UIs written for pvws use these: cs-web-lib subscribes to `sim://flipflop(29.929)` as its
connection heartbeat. Each maps onto one of pvwire's sim kinds with the same behaviour (Phoebus'
`org.phoebus.pv.sim`: arguments are numbers, the last one the update period in seconds).
"""

from __future__ import annotations

from ..errors import BadChannelId

__all__ = ["from_phoebus"]


def _rate(seconds: float) -> str:
    if seconds <= 0:
        raise ValueError("update period must be > 0 s")
    return f"{1.0 / seconds:g}"


def _flipflop(a: list[float]) -> str:
    (period,) = a or [1.0]
    return f"enum/flipflop?choices=false,true&rate={_rate(period)}"


def _sine(a: list[float]) -> str:
    lo, hi, steps, period = (-5.0, 5.0, 10.0, 0.1)
    if len(a) == 3:
        lo, hi, period = a
    elif len(a) == 4:
        lo, hi, steps, period = a
    elif a:
        raise ValueError("needs (min, max, update_seconds) or (min, max, steps, update_seconds)")
    return (
        f"sine/phoebus?offset={(lo + hi) / 2:g}&amplitude={(hi - lo) / 2:g}"
        f"&period={steps * period:g}&rate={_rate(period)}"
    )


def _ramp(a: list[float]) -> str:
    lo, hi, step, period = (-5.0, 5.0, 1.0, 1.0)
    if len(a) == 3:
        lo, hi, period = a
    elif len(a) == 4:
        lo, hi, step, period = a
    elif a:
        raise ValueError("needs (min, max, update_seconds) or (min, max, step, update_seconds)")
    return f"ramp/phoebus?min={lo:g}&max={hi:g}&step={step:g}&rate={_rate(period)}"


def _noise(a: list[float]) -> str:
    lo, hi, period = a if a else (-5.0, 5.0, 1.0)
    return f"noise/phoebus?mean={(lo + hi) / 2:g}&sigma={(hi - lo) / 6:g}&rate={_rate(period)}"


def _gaussian(a: list[float]) -> str:
    center, sigma, period = a if a else (0.0, 1.0, 0.1)
    return f"noise/phoebus?mean={center:g}&sigma={sigma:g}&rate={_rate(period)}"


def _sinewave(a: list[float]) -> str:
    period, _wavelength, size, update = a if len(a) == 4 else (*a, 50.0, 0.1)[:4]
    return f"waveform/phoebus?length={size:g}&period={period:g}&rate={_rate(update)}"


_KINDS = {
    "flipflop": _flipflop,
    "sine": _sine,
    "ramp": _ramp,
    "noise": _noise,
    "gaussianNoise": _gaussian,
    "sinewave": _sinewave,
}


def from_phoebus(name: str) -> str:
    """The pvwire sim name for Phoebus-style `kind(args)`; BadChannelId naming what is wrong."""
    kind, _, rest = name.partition("(")
    kind = kind.strip()
    if kind not in _KINDS or not rest.endswith(")"):
        known = ", ".join(f"{k}(...)" for k in _KINDS)
        raise BadChannelId(f"sim://{name}: not a Phoebus sim name (known: {known})")
    inner = rest[:-1].strip()
    try:
        args = [float(x) for x in inner.split(",")] if inner else []
        return _KINDS[kind](args)
    except ValueError as exc:
        raise BadChannelId(f"sim://{name}: {exc}") from None
