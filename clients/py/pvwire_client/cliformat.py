"""What the ``pvwire`` command prints: caget/camonitor lines, JSON objects, channel problems."""

from __future__ import annotations

import math
from typing import Any

from .errors import NotFound, PvwireError
from .lazynp import tolist
from .state import FAILED, NOT_FOUND, ChannelState

__all__ = ["camonitor_line", "channel_error", "channel_problem", "get_line", "state_json"]


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


def _local_time(s: ChannelState) -> str:
    t = s.datetime
    if t is None:
        return "<no time>" + " " * 17
    return t.astimezone().replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


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
