"""The merged view of one channel, and the pure merge of stream entries into it (section 3)."""

from __future__ import annotations

import datetime as dt
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .entry import (
    ALARM,
    CONN,
    CONNECTED,
    CONNECTING,
    CONNECTION_STATES,
    DISCONNECTED,
    FAILED,
    FIELD_NAMES,
    META,
    NOT_FOUND,
    TIME,
    VALUE,
    Entry,
)
from .lazynp import is_ndarray, tolist

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "CONNECTED",
    "CONNECTING",
    "CONNECTION_STATES",
    "DISCONNECTED",
    "FAILED",
    "NOT_FOUND",
    "SEVERITIES",
    "STATUSES",
    "ChannelState",
    "format_value",
    "link_lost",
]

SEVERITIES = ("NO_ALARM", "MINOR", "MAJOR", "INVALID")
# EPICS menuAlarmStat, by number.
STATUSES = (
    "NO_ALARM", "READ", "WRITE", "HIHI", "HIGH", "LOLO", "LOW", "STATE", "COS", "COMM",
    "TIMEOUT", "HWLIMIT", "CALC", "SCAN", "LINK", "SOFT", "BAD_SUB", "UDF", "DISABLE", "SIMM",
    "READ_ACCESS", "WRITE_ACCESS",
)  # fmt: skip

# Arrays longer than this are shown by their ends only.
_ARRAY_SHOWN = 10


@dataclass(slots=True)
class ChannelState:
    """Everything known about one channel: the sum of its entries so far."""

    id: str
    value: Any = None
    serial: int | None = None
    # Upstream updates merged away (never seen by this client) since the subscription started,
    # from the serials; 0 again when the upstream monitor reopens (PROTOCOL.md, "Client
    # behaviour"). A count since the start, not per entry, so a reader that looks at the state
    # when it likes (a batch of several entries, a display refreshing at its own rate) still
    # learns how many it lost in between: the difference of two looks.
    conflated: int = 0
    seconds: int | None = None
    nanoseconds: int | None = None
    severity: int | None = None
    status: int | None = None
    message: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    state: int = CONNECTING
    reason: str = ""
    # What the server grants this client's identity on a subscribed channel ("READ" or
    # "WRITE"); None when not known (a channel read through GraphQL ``get``).
    access: str | None = None

    # --- merge -------------------------------------------------------------------------------

    def apply(self, entry: Entry, baseline: bool = False) -> set[str]:
        """Merge one entry; return which of value/time/alarm/metadata/connection changed.

        Changed, not carried: a field the entry repeats (a snapshot after a re-attach) is not
        named. A value counts as changed with every new serial (each upstream update is news,
        even of an equal value) and an array with every entry (arrays are not compared).

        ``conflated`` grows by ``serial - previous - 1`` when serials jump; a lower serial means
        the upstream monitor was reopened, and the count restarts (section 3). A snapshot entry
        (``baseline``) starts a new baseline: after a reconnect, maybe to another replica whose
        upstream monitor counts from elsewhere, the jump is no conflation (section 2.5).
        """
        return set(FIELD_NAMES[self.merge(entry.as_list(), baseline)])

    def merge(self, e: list[Any], baseline: bool = False) -> int:
        """:meth:`apply` for an entry as it travels (``[sid, mask, field...]``, validated by
        the decoder); returns what changed as mask bits (VALUE, TIME, ...)."""
        changed = 0
        m = e[1]
        i = 2
        if m & VALUE:
            value, serial = e[2], e[3]
            i = 4
            old = self.serial
            if old is not None and not baseline:
                if serial > old:
                    self.conflated += serial - old - 1
                elif serial < old:
                    self.conflated = 0
            if serial != old or not _same(value, self.value):
                changed = VALUE
            self.value, self.serial = value, serial
        if m & TIME:
            seconds, ns = e[i], e[i + 1]
            i += 2
            if seconds != self.seconds or ns != self.nanoseconds:
                self.seconds, self.nanoseconds = seconds, ns
                changed |= TIME
        if m & ALARM:
            severity, status, message = e[i], e[i + 1], e[i + 2]
            i += 3
            if (severity, status, message) != (self.severity, self.status, self.message):
                self.severity, self.status, self.message = severity, status, message
                changed |= ALARM
        if m & META:
            metadata = e[i]
            i += 1
            if not _same_metadata(metadata, self.metadata):
                self.metadata = metadata
                changed |= META
        if m & CONN:
            # An unknown state number is shown as DISCONNECTED (PROTOCOL.md section 3), and
            # compared as shown: a later state repeated is no change.
            state = e[i] if e[i] < len(CONNECTION_STATES) else DISCONNECTED
            reason = e[i + 1]
            if (state, reason) != (self.state, self.reason):
                self.state, self.reason = state, reason
                changed |= CONN
        return changed

    # --- views -------------------------------------------------------------------------------

    @property
    def time(self) -> tuple[int, int] | None:
        if self.seconds is None or self.nanoseconds is None:
            return None
        return (self.seconds, self.nanoseconds)

    @property
    def datetime(self) -> dt.datetime | None:
        """The IOC timestamp as an aware UTC datetime (microsecond resolution)."""
        if self.seconds is None or self.nanoseconds is None:
            return None
        return dt.datetime.fromtimestamp(self.seconds, dt.UTC).replace(
            microsecond=self.nanoseconds // 1000
        )

    @property
    def has_news(self) -> bool:
        """Whether there is anything to show: a value, or a connection state that says why not.

        False only for a channel still connecting that never had a value (a cold snapshot).
        """
        return self.value is not None or self.state != CONNECTING

    @property
    def connected(self) -> bool:
        return self.state == CONNECTED

    @property
    def connection(self) -> str:
        return _name(CONNECTION_STATES, self.state)

    @property
    def severity_name(self) -> str | None:
        return None if self.severity is None else _name(SEVERITIES, self.severity)

    @property
    def status_name(self) -> str | None:
        return None if self.status is None else _name(STATUSES, self.status)

    @property
    def writable(self) -> bool:
        """Whether a put from this client can succeed: granted WRITE and not refused upstream.

        On the stream ``metadata["writable"]`` is the upstream's answer only, absent when it
        cannot tell (PVA), so only an explicit ``False`` vetoes; without ``access`` (a GraphQL
        read) ``metadata["writable"]`` is already the server's answer for this identity.
        """
        upstream = self.metadata.get("writable")
        if self.access is None:
            return upstream is True
        return self.access == "WRITE" and upstream is not False

    @property
    def units(self) -> str:
        u = self.metadata.get("units")
        return u if isinstance(u, str) else ""

    @property
    def label(self) -> str | None:
        """For enums, the label of the current index (None if not an enum or out of range)."""
        choices = self.metadata.get("choices")
        v = self.value
        if isinstance(choices, list) and type(v) is int and 0 <= v < len(choices):
            return str(choices[v])
        return None

    def format(self, units: bool = True) -> str:
        """The value for people, as caget shows it: precision, enum label, then units."""
        text = format_value(self.value, self.metadata)
        if units and self.units and self.label is None and not isinstance(self.value, str):
            text = f"{text} {self.units}"
        return text

    def __str__(self) -> str:
        return f"{self.id} {self.format()}"


def link_lost(state: ChannelState, sid: int, reason: str) -> int:
    """The connection is gone: a CONNECTED channel shows DISCONNECTED with ``reason``, keeping
    its last value, time, alarm and metadata (PROTOCOL.md section 8); returns what changed.

    Channels not CONNECTED (still connecting, already down, FAILED, NOT_FOUND) keep their state:
    a further failed attempt says nothing new; the snapshots after the re-attach restore it.
    """
    if not state.connected:
        return 0
    return state.merge([sid, CONN, DISCONNECTED, reason])


def _same_metadata(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal maps, NaN equal to NaN: an unset limit side is NaN (section 5), and a snapshot
    repeating the same limits is no change."""
    return a == b or _same_nan(a, b)


def _same_nan(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_nan(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_nan(x, y) for x, y in zip(a, b, strict=True))
    return bool(type(a) is type(b) and a == b)


def _name(names: tuple[str, ...], i: int) -> str:
    return names[i] if 0 <= i < len(names) else str(i)


def _same(a: Any, b: Any) -> bool:
    if is_ndarray(a) or is_ndarray(b):
        return a is b
    try:
        return bool(type(a) is type(b) and a == b)
    except Exception:
        return False


def format_value(value: Any, metadata: dict[str, Any]) -> str:
    """Format a value with the metadata's precision, form and enum choices."""
    if value is None:
        return "<no value>"
    choices = metadata.get("choices")
    if type(value) is int and isinstance(choices, list) and 0 <= value < len(choices):
        return str(choices[value])
    if is_ndarray(value):
        return _format_array(value, metadata)
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=_jsonable)
    return _format_scalar(value, metadata)


def _format_scalar(v: Any, metadata: dict[str, Any]) -> str:
    form = metadata.get("form")
    prec = metadata.get("precision")
    # numbers.Integral and numbers.Real include numpy's scalars without importing numpy.
    if isinstance(v, numbers.Integral):
        i = int(v)
        if form == "Hex":
            return hex(i)
        if form == "Binary":
            return bin(i)
        return str(i)
    if isinstance(v, numbers.Real):
        f = float(v)
        if not math.isfinite(f):
            return str(f)
        p = prec if type(prec) is int and 0 <= prec <= 17 else None
        if form == "Exponential":
            return f"{f:.{p if p is not None else 6}e}"
        if p is not None:
            return f"{f:.{p}f}"
        return repr(f)
    return str(v)


def _format_array(a: npt.NDArray[Any], metadata: dict[str, Any]) -> str:
    if a.ndim != 1:
        return f"<{a.dtype.name} array {'x'.join(str(d) for d in a.shape)}>"
    items = a.tolist()
    if len(items) > 2 * _ARRAY_SHOWN:
        shown = [_format_scalar(x, metadata) for x in items[:_ARRAY_SHOWN]]
        shown += ["..."] + [_format_scalar(x, metadata) for x in items[-_ARRAY_SHOWN:]]
    else:
        shown = [_format_scalar(x, metadata) for x in items]
    text = f"[{' '.join(shown)}]"
    return f"{text} ({len(items)} elements)" if len(items) > 2 * _ARRAY_SHOWN else text


def _jsonable(x: Any) -> Any:
    y = tolist(x)
    return str(x) if y is x else y
