"""What the ``pvwire`` command prints: caget/camonitor lines, JSON objects, channel problems."""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from .entry import ALARM, CONN, FIELD_NAMES, META, TIME, VALUE
from .errors import NotFound, PvwireError
from .lazynp import tolist
from .state import FAILED, NOT_FOUND, ChannelState

__all__ = [
    "camonitor_line",
    "change_json",
    "channel_error",
    "channel_problem",
    "get_line",
    "state_json",
]

# ``changed`` as the JSON lines list it, for every set of mask bits.
_CHANGED = tuple(sorted(names) for names in FIELD_NAMES)


def _jsonable(x: Any) -> Any:
    x = tolist(x)
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # JSON has no NaN/Infinity
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    return x


def state_json(s: ChannelState) -> dict[str, Any]:
    t = s.datetime
    return {
        "id": s.id,
        "value": _jsonable(s.value),
        "display": s.format(),
        "units": s.units,
        "time": t.isoformat() if t else None,
        "seconds": s.seconds,
        "nanoseconds": s.nanoseconds,
        "severity": s.severity_name,
        "status": s.status_name,
        "message": s.message,
        "connection": s.connection,
        "reason": s.reason,
        "serial": s.serial,
        "conflated": s.conflated,
        "metadata": _jsonable(s.metadata),
    }


def change_json(s: ChannelState, changed: int) -> dict[str, Any]:
    """A monitor's JSON line: the channel's id and what ``changed`` (mask bits) names.

    value: ``value``, ``display``, ``serial``, ``conflated``; time: ``time``, ``seconds``,
    ``nanoseconds``; alarm: ``severity``, ``status``, ``message``; metadata: ``metadata``,
    ``units`` (and ``value``, ``display``: precision and units change how it reads);
    connection: ``connection``, ``reason``. A channel's first line names everything known, so
    it holds what ``state_json`` holds; later ones repeat no metadata: lines holding all of it
    (~1 KB each) kept ``pvwire monitor`` seconds behind 1,000 channels at 10 Hz.
    """
    doc: dict[str, Any] = {"id": s.id, "changed": _CHANGED[changed]}
    if changed & (VALUE | META):
        doc["value"] = _jsonable(s.value)
        doc["display"] = s.format()
    if changed & VALUE:
        doc["serial"], doc["conflated"] = s.serial, s.conflated
    if changed & TIME:
        doc["time"] = _utc_time(s.seconds, s.nanoseconds)
        doc["seconds"], doc["nanoseconds"] = s.seconds, s.nanoseconds
    if changed & ALARM:
        doc["severity"], doc["status"] = s.severity_name, s.status_name
        doc["message"] = s.message
    if changed & META:
        doc["units"], doc["metadata"] = s.units, _jsonable(s.metadata)
    if changed & CONN:
        doc["connection"], doc["reason"] = s.connection, s.reason
    return doc


# Channels updated together share their second: formatting it once per second, not per line,
# halves the cost of a line (datetime.astimezone per line: ~5 µs).
@functools.lru_cache(maxsize=16)
def _local_second(seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


@functools.lru_cache(maxsize=16)
def _utc_second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def _utc_time(seconds: int | None, nanoseconds: int | None) -> str | None:
    """As ``datetime.isoformat()`` of the aware UTC time (what ``state_json`` gives)."""
    if seconds is None or nanoseconds is None:
        return None
    us = nanoseconds // 1000
    return f"{_utc_second(seconds)}.{us:06d}+00:00" if us else f"{_utc_second(seconds)}+00:00"


def _local_time(s: ChannelState) -> str:
    if s.seconds is None or s.nanoseconds is None:
        return "<no time>" + " " * 17
    return f"{_local_second(s.seconds)}.{s.nanoseconds // 1000:06d}"


def camonitor_line(s: ChannelState) -> str:
    """``ID  2026-11-22 17:30:01.123456  VALUE UNITS  [SEVERITY STATUS]``"""
    if not s.connected:
        reason = f": {s.reason}" if s.reason else ""
        return f"{s.id}  {_local_time(s)}  {s.format()}  <{s.connection.lower()}{reason}>"
    line = f"{s.id}  {_local_time(s)}  {s.format()}"
    if s.severity:
        line += f"  {s.severity_name} {s.status_name}"
    return line


def get_line(s: ChannelState) -> str:
    """``ID  VALUE UNITS  [SEVERITY STATUS]  [<connection>]``, as caget prints a channel."""
    sev = f"  {s.severity_name} {s.status_name}" if s.severity else ""
    conn = "" if s.connected else f"  <{s.connection.lower()}>"
    return f"{s.id}  {s.format()}{sev}{conn}"


def _phrase(what: str, detail: str) -> str:
    """``not found (no IOC answered for 5 s)``, without saying "not found" twice."""
    if not detail:
        return what
    return detail if detail.startswith(what) else f"{what} ({detail})"


def channel_problem(s: ChannelState) -> str | None:
    """The stderr line for a channel that is not found or failed; None for any other state."""
    if s.state == NOT_FOUND:
        return f"{s.id}: {_phrase('not found', s.reason)}"
    if s.state == FAILED:
        return f"{s.id}: {_phrase('failed', s.reason)}"
    return None


def channel_error(e: PvwireError) -> str:
    """The stderr line for one channel a get could not read: its id once, then what happened."""
    if isinstance(e, NotFound) and e.id:
        return f"{e.id}: {_phrase('not found', e.detail)}"
    return str(e)
