"""What a pvws client sends: its messages read and checked, with no I/O.

The client messages pvws handles (WebSocket.java): `subscribe` (alias `monitor`), `clear`, `list`,
`write`, `ping`, `echo`; session.py acts on them. A message that is not JSON, has no `type`, or
lacks what its type needs raises `BadMessage`, which the session counts and logs once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "CLIENT_MESSAGES",
    "BadMessage",
    "Ping",
    "Write",
    "as_text",
    "may_read_errors",
    "parse",
    "pv_names",
    "shorten",
    "write_of",
]

# The client messages pvws handles (WebSocket.java), all handled here too (docs/PVWS.md section 2).
CLIENT_MESSAGES = ("subscribe", "monitor", "clear", "list", "write", "ping", "echo")


@dataclass(frozen=True, slots=True)
class Ping:
    """The client asked to be pinged: send a WebSocket ping frame."""


@dataclass(frozen=True, slots=True)
class Write:
    """The client writes `value` to subscribed PV `pv`; answer a failure with `write_failed`."""

    pv: str
    value: float | str


class BadMessage(Exception):
    """A client message pvws would not read either: counted and logged, not answered."""


def parse(text: str) -> tuple[object, dict[str, Any]]:
    """The message's `type` and the message, or BadMessage when it is not JSON or has no type."""
    try:
        msg = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadMessage(f"not JSON ({exc}): {shorten(text)}") from None
    kind = msg.get("type") if isinstance(msg, dict) else None
    if kind is None:
        raise BadMessage(f"Missing 'type' in {shorten(text)}")
    return kind, msg


def may_read_errors(count: int, kind: object, msg: dict[str, Any]) -> bool:
    """Whether a client that sent this, its `count`-th message, reads `error` messages.

    Grafana's Archiver Appliance data source (its live mode's Go proxy, pkg/aalive) opens one
    socket per PV, sends one `subscribe` naming that PV and turns every message it receives into
    a data point: an `error` became a value 0 at 1970. Clients that read errors send more than
    that (cs-web-lib 0.10 subscribes its heartbeat PV besides the page's; pages of several PVs
    subscribe several; they write and clear, and a write comes before its own error). So a
    client that has sent nothing but one subscribe of one PV gets no `error` yet: errors wait, up
    to session.py's MAX_HELD_ERRORS, for its next message.
    """
    if count > 1 or kind not in ("subscribe", "monitor"):
        return True
    pvs = msg.get("pvs")
    return not isinstance(pvs, list | dict) or len(pvs) != 1


def shorten(text: str) -> str:
    return text if len(text) < 200 else text[:200] + " ..."


def as_text(node: object) -> str:
    """A JSON node as Jackson's `asText()` gives it."""
    if isinstance(node, str):
        return node
    if isinstance(node, bool):
        return "true" if node else "false"
    if node is None:
        return "null"
    if isinstance(node, int | float):
        return str(node)
    return ""


def write_of(msg: dict[str, Any], text: str) -> Write:
    """The write a `write` message asks for: a number as a float, anything else as text."""
    if "pv" not in msg:
        raise BadMessage(f"Missing 'pv' in {shorten(text)}")
    if "value" not in msg:
        raise BadMessage(f"Missing 'value' in {shorten(text)}")
    value = msg["value"]
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return Write(as_text(msg["pv"]), float(value) if is_number else as_text(value))


def pv_names(msg: dict[str, Any], text: str) -> list[str]:
    pvs = msg.get("pvs")
    if pvs is None:
        raise BadMessage(f"Missing 'pvs' in {shorten(text)}")
    if isinstance(pvs, list):
        return [as_text(x) for x in pvs]
    if isinstance(pvs, dict):
        return [as_text(x) for x in pvs.values()]
    return []
