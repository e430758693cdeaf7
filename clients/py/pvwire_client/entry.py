"""One channel's entry of a SNAPSHOT or DATA message (PROTOCOL.md section 3), without numpy.

Kept apart from :mod:`.wire` so that the merged state (:mod:`.state`) and everything built on it
import without numpy and msgpack: the ``pvwire`` command reads values over GraphQL and must start
in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALARM",
    "CONN",
    "CONNECTED",
    "CONNECTING",
    "CONNECTION_STATES",
    "DISCONNECTED",
    "FAILED",
    "FIELD_NAMES",
    "KNOWN_MASK",
    "META",
    "NOT_FOUND",
    "TIME",
    "VALUE",
    "Entry",
]

# Entry mask bits (section 3).
VALUE, TIME, ALARM, META, CONN = 1, 2, 4, 8, 16
KNOWN_MASK = VALUE | TIME | ALARM | META | CONN
# What a set of mask bits is called in ``changed`` (Update, Batch), for every set of known bits.
_NAMED_BITS = (
    (VALUE, "value"), (TIME, "time"), (ALARM, "alarm"), (META, "metadata"), (CONN, "connection"),
)  # fmt: skip
FIELD_NAMES: tuple[frozenset[str], ...] = tuple(
    frozenset(name for bit, name in _NAMED_BITS if mask & bit) for mask in range(KNOWN_MASK + 1)
)

# The CONN field's states, by number (section 3). NOT_FOUND: no IOC answered the search for the
# server's configured time; the server keeps searching and sends CONNECTED if the PV appears.
CONNECTION_STATES = ("CONNECTING", "CONNECTED", "DISCONNECTED", "FAILED", "NOT_FOUND")
CONNECTING, CONNECTED, DISCONNECTED, FAILED, NOT_FOUND = range(len(CONNECTION_STATES))


@dataclass(frozen=True, slots=True)
class Entry:
    """One channel of one attachment (section 3). Fields whose mask bit is clear are None."""

    sid: int
    mask: int
    value: Any = None
    serial: int | None = None
    seconds: int | None = None
    nanoseconds: int | None = None
    severity: int | None = None
    status: int | None = None
    message: str | None = None
    metadata: dict[str, Any] | None = None
    state: int | None = None
    reason: str | None = None

    def as_list(self) -> list[Any]:
        """The entry as it travels, ``[sid, mask, field...]`` (section 3)."""
        e: list[Any] = [self.sid, self.mask]
        if self.mask & VALUE:
            e += (self.value, self.serial)
        if self.mask & TIME:
            e += (self.seconds, self.nanoseconds)
        if self.mask & ALARM:
            e += (self.severity, self.status, self.message)
        if self.mask & META:
            e.append(self.metadata)
        if self.mask & CONN:
            e += (self.state, self.reason)
        return e
