"""The value contract at the backend sink: the hub only ever sees values the wire can carry.

PROTOCOL.md section 4 allows int, float, str, None, numpy arrays of the ten dtypes of section 4.1,
lists (arrays of str, or arrays of values for structure and union arrays) and maps of str to
values. Backends pass what their library hands them through `wire_value`, which returns the same
value in one of those forms or raises `UnsupportedValue` naming what it could not convert; the
backend then fails that one channel with the reason (`CallbackGuard`), never the tick.

And `CallbackGuard` keeps an exception in an upstream callback inside its channel: aioca and p4p
end a subscription whose callback raises, so a backend's callbacks never let one escape.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..errors import PvwireError
from ..model import ConnState, Value
from .base import ChannelSink

__all__ = ["CallbackGuard", "UnsupportedValue", "long_string", "wire_value"]

log = logging.getLogger("pvwire.upstream")

# The dtypes of PROTOCOL.md section 4.1 in native byte order (the encoder swaps if needed).
_WIRE_DTYPES = frozenset(
    np.dtype(t) for t in ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8")
)
_PLAIN = frozenset((int, float, str, type(None)))


class UnsupportedValue(PvwireError, TypeError):
    """A value no form of PROTOCOL.md section 4 carries; the text says which and why."""

    code = "UNSUPPORTED_VALUE"


def wire_value(value: object) -> Value:
    """`value` as one of the forms of PROTOCOL.md section 4, or UnsupportedValue.

    Plain values return unchanged (one type test); numeric arrays return as a plain ndarray view
    (no copy); numpy string arrays (CA STRING waveforms) become lists of str.
    """
    if type(value) in _PLAIN:
        return value  # type: ignore[return-value]
    if isinstance(value, np.ndarray):
        return _array(value)
    if isinstance(value, bool | np.bool_):
        return int(value)  # section 4: booleans travel as 0/1
    if isinstance(value, int | np.integer):
        return int(value)  # also aioca's ca_int, an int subclass
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise UnsupportedValue(f"structure field name {k!r} is not a string")
            out[k] = wire_value(v)
        return out
    if isinstance(value, list | tuple):
        if all(type(x) is str for x in value):
            return list(value)
        return [wire_value(x) for x in value]
    raise UnsupportedValue(f"{type(value).__name__} values cannot be sent")


def _array(a: np.ndarray[Any, Any]) -> Value:
    dtype = a.dtype
    kind = dtype.kind
    if kind in "iuf":
        if dtype.newbyteorder("=") in _WIRE_DTYPES:
            return a if type(a) is np.ndarray else a.view(np.ndarray)
        if kind == "f" and dtype.itemsize < 4:
            return a.astype(np.float32)
        raise UnsupportedValue(f"{dtype} arrays have no wire dtype (PROTOCOL.md section 4.1)")
    if kind == "b":
        return a.view(np.uint8)  # same memory, 0/1 per element
    if kind in "USO":
        if a.ndim != 1:
            raise UnsupportedValue(f"a {a.ndim}-dimensional array of {dtype} cannot be sent")
        if kind == "S":
            return [bytes(x).decode("utf-8", "replace") for x in a.tolist()]
        return wire_value(a.tolist())
    raise UnsupportedValue(f"{dtype} arrays cannot be sent")


def long_string(value: object) -> Value:
    """A char array holding text (the `NAME.VAL$` form) as str: up to the first NUL, UTF-8."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu" and value.dtype.itemsize == 1:
        raw = value.view(np.uint8).tobytes()
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    return wire_value(value)


class CallbackGuard:
    """Contains a failure in one channel's upstream callbacks to that channel.

    `fail` turns the channel FAILED with the reason (logged once per episode, with the channel
    id); the upstream subscription stays open, and `recover` (called before the next good
    update) turns it CONNECTED again.
    """

    __slots__ = ("failed", "sink", "uri")

    def __init__(self, uri: str, sink: ChannelSink) -> None:
        self.uri = uri
        self.sink = sink
        self.failed = False

    def fail(self, exc: BaseException) -> None:
        known = isinstance(exc, UnsupportedValue)
        reason = str(exc) if known else f"{type(exc).__name__}: {exc}"
        reason = f"value cannot be served: {reason}"[:200]
        if not self.failed:
            self.failed = True
            # The exception itself, not `True`: fail() may run outside its except block.
            log.error("channel %s failed in an upstream callback: %s", self.uri, reason,
                      exc_info=None if known else exc)  # fmt: skip
        try:
            self.sink.on_connection(ConnState.FAILED, reason)
        except Exception:  # the sink is the hub's; nothing of it may end the subscription
            log.exception("channel %s: reporting a failure failed", self.uri)

    def recover(self) -> None:
        if self.failed:
            self.failed = False
            log.info("channel %s recovered", self.uri)
            self.sink.on_connection(ConnState.CONNECTED)
