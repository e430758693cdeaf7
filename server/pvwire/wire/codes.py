"""Close and error codes of the stream, from the one table both clients use too.

`close_codes.json` here is a copy of protocol/close_codes.json, shipped with the package (a test
checks the two are identical); every code the server sends is looked up by name, so a code that
is not in the table cannot be sent.
"""

from __future__ import annotations

import json
from importlib import resources

__all__ = [
    "BAD_MESSAGE",
    "BAD_TOKEN",
    "CLOSE_CODES",
    "DRAINING",
    "FORBIDDEN",
    "GOING_AWAY",
    "HEARTBEAT_TIMEOUT",
    "INTERNAL",
    "NORMAL",
    "POLICY",
    "RESTART",
    "SLOW",
    "TOKEN_EXPIRED",
    "TOO_MANY_CHANNELS",
    "TRY_AGAIN",
    "UNKNOWN_ATTACHMENT",
    "UNSUPPORTED",
]

_TABLE = json.loads(resources.files(__package__).joinpath("close_codes.json").read_text("utf-8"))
_BY_NAME = {
    row["name"]: int(row["code"]) for section in ("codes", "errors") for row in _TABLE[section]
}

# Every close code of the table (section 8), e.g. the values a disconnect metric may name.
CLOSE_CODES = frozenset(int(row["code"]) for row in _TABLE["codes"])


def _code(name: str) -> int:
    return _BY_NAME[name]


# WebSocket close codes (PROTOCOL.md section 8).
NORMAL = _code("NORMAL")
GOING_AWAY = _code("GOING_AWAY")
POLICY = _code("POLICY")
INTERNAL = _code("INTERNAL")
RESTART = _code("RESTART")
TRY_AGAIN = _code("TRY_AGAIN")
HEARTBEAT_TIMEOUT = _code("HEARTBEAT_TIMEOUT")
SLOW = _code("SLOW")
DRAINING = _code("DRAINING")
UNSUPPORTED = _code("UNSUPPORTED")
# ERROR message codes (PROTOCOL.md section 6); 4401-4403 are both.
BAD_MESSAGE = _code("BAD_MESSAGE")
UNKNOWN_ATTACHMENT = _code("UNKNOWN_ATTACHMENT")
TOO_MANY_CHANNELS = _code("TOO_MANY_CHANNELS")
BAD_TOKEN = _code("BAD_TOKEN")
TOKEN_EXPIRED = _code("TOKEN_EXPIRED")
FORBIDDEN = _code("FORBIDDEN")
