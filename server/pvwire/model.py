"""The channel model shared by backends, the hub, the encoder and the GraphQL layer.

Field bits and codes mirror protocol/PROTOCOL.md sections 3-5; change both together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "ALARM",
    "CONN",
    "FULL",
    "META",
    "TIME",
    "VALUE",
    "ConnState",
    "Limits",
    "Metadata",
    "Reading",
    "Severity",
    "Value",
]

# Entry field bits (PROTOCOL.md section 3).
VALUE = 1
TIME = 2
ALARM = 4
META = 8
CONN = 16
FULL = VALUE | TIME | ALARM | META | CONN

# PROTOCOL.md section 4: a list is an array of str or an array of values (structure arrays).
Value: TypeAlias = "int | float | str | npt.NDArray[Any] | list[Any] | dict[str, Any] | None"
Limits: TypeAlias = tuple[float, float]


class ConnState(IntEnum):
    CONNECTING = 0  # never connected yet, searching
    CONNECTED = 1
    DISCONNECTED = 2
    FAILED = 3  # cannot be served; the reason says why
    NOT_FOUND = 4  # no server answered for `not_found_s`; still searching


class Severity(IntEnum):
    """EPICS alarm severities (menuAlarmSevr): the one table of their names (GraphQL's enum is
    this class; pvws's names are these with its own name for 0)."""

    NO_ALARM = 0
    MINOR = 1
    MAJOR = 2
    INVALID = 3

    @classmethod
    def of(cls, severity: int) -> Severity:
        """The severity of a number from upstream; out of range is clamped (3+ is INVALID)."""
        return cls(min(max(severity, 0), 3))


# EPICS menuAlarmStat, indexed by status number: CA gives only the number.
ALARM_STATUS_NAMES = (
    "NO_ALARM", "READ", "WRITE", "HIHI", "HIGH", "LOLO", "LOW", "STATE", "COS", "COMM",
    "TIMEOUT", "HWLIMIT", "CALC", "SCAN", "LINK", "SOFT", "BAD_SUB", "UDF", "DISABLE", "SIMM",
    "READ_ACCESS", "WRITE_ACCESS",
)  # fmt: skip
_N_STATUS = len(ALARM_STATUS_NAMES)


def alarm_status_name(status: int) -> str:
    """The name of an alarm status number; one not in the table is `STATUS_<n>`. Called for
    every CA update (upstream/ca.py), hence the length computed once."""
    return ALARM_STATUS_NAMES[status] if 0 <= status < _N_STATUS else f"STATUS_{status}"


_WIRE_KEYS = {"color_mode": "colorMode"}  # section 5 keys that differ from the field names


@dataclass(frozen=True, slots=True)
class Metadata:
    """What a channel is, as opposed to what it reads now. Every field optional (None = unknown)."""

    type: str | None = None
    count: int | None = None
    description: str | None = None
    units: str | None = None
    precision: int | None = None
    form: str | None = None
    display: Limits | None = None
    control: Limits | None = None
    alarm: Limits | None = None
    warning: Limits | None = None
    choices: tuple[str, ...] | None = None
    writable: bool | None = None
    # Images (PROTOCOL.md section 4.5): how the dims hold colour, `mono`, `RGB1`, `RGB2`, `RGB3`.
    color_mode: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """The PROTOCOL.md section 5 map: known keys only, limits as [low, high] lists."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, tuple):
                v = list(v)
            out[_WIRE_KEYS.get(name, name)] = v
        return out

    def for_client(self, rules_allow: bool) -> Metadata:
        """`writable` as clients see it: pvwire's write rules AND the upstream's access rights.
        Where the upstream cannot tell (PVA: p4p exposes no access rights), the rules decide, so
        the put box shows exactly when the server would accept a put."""
        writable = rules_allow and self.writable is not False
        return self if self.writable is writable else self.replace(writable=writable)

    def replace(self, **changes: Any) -> Metadata:
        values = {name: getattr(self, name) for name in self.__slots__}
        values.update(changes)
        return Metadata(**values)


def dtype_name(dtype: np.dtype[Any]) -> str:
    """Metadata `type` for a numpy dtype: int8 ... float64, bool."""
    return "bool" if dtype == np.bool_ else str(np.dtype(dtype).newbyteorder("=").name)


@dataclass(slots=True)
class Reading:
    """A complete read of a channel, as returned by a backend's `get`."""

    value: Value
    seconds: int
    nanoseconds: int
    severity: int = 0
    status: int = 0
    message: str = ""
    meta: Metadata = field(default_factory=Metadata)
