"""WebSocket close codes of the stream (PROTOCOL.md section 8), loaded from close_codes.json.

The JSON file is a copy of protocol/close_codes.json (a test checks they are identical).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

__all__ = ["CODES", "CloseCode", "is_reconnect", "name"]


@dataclass(frozen=True, slots=True)
class CloseCode:
    code: int
    name: str
    reconnect: bool
    meaning: str


def _load() -> dict[int, CloseCode]:
    text = resources.files(__package__).joinpath("close_codes.json").read_text("utf-8")
    table = json.loads(text)["codes"]
    return {
        c["code"]: CloseCode(c["code"], c["name"], c["class"] == "reconnect", c["meaning"])
        for c in table
    }


CODES: dict[int, CloseCode] = _load()

# Named constants for the codes the client acts on.
NORMAL = 1000
ABNORMAL = 1006
PROTOCOL_ERROR = 1002
HEARTBEAT_TIMEOUT = 4000
BAD_TOKEN = 4401
TOKEN_EXPIRED = 4402
FORBIDDEN = 4403
UNSUPPORTED = 4406
TOO_MANY_CHANNELS = 4413


def is_reconnect(code: int) -> bool:
    """Whether a close with ``code`` means "reconnect with backoff" (else: terminal).

    Codes not in the table follow the spec's default: reconnect in 1000-3999 except 1000, 1007,
    1008, 1009 (those are listed anyway); terminal in 4000-4999 and anything else.
    """
    known = CODES.get(code)
    if known is not None:
        return known.reconnect
    return 1000 <= code <= 3999 and code not in (1000, 1007, 1008, 1009)


def name(code: int) -> str:
    """The table's name for ``code``, or ``"CODE_<n>"`` for codes it does not list."""
    known = CODES.get(code)
    return known.name if known is not None else f"CODE_{code}"
