"""Close codes (PROTOCOL.md section 8) and ERROR codes (section 6) of the stream, loaded from
close_codes.json: no code is written here, every one is looked up by its name in the table.

The JSON file is a copy of protocol/close_codes.json (a test checks they are identical).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

__all__ = ["CODES", "ERRORS", "CloseCode", "is_reconnect", "name"]


@dataclass(frozen=True, slots=True)
class CloseCode:
    code: int
    name: str
    reconnect: bool
    meaning: str


_TABLE = json.loads(resources.files(__package__).joinpath("close_codes.json").read_text("utf-8"))

CODES: dict[int, CloseCode] = {
    c["code"]: CloseCode(c["code"], c["name"], c["class"] == "reconnect", c["meaning"])
    for c in _TABLE["codes"]
}
ERRORS: dict[str, int] = {e["name"]: e["code"] for e in _TABLE["errors"]}
_CLOSE_BY_NAME = {c.name: c.code for c in CODES.values()}


def _close(name: str) -> int:
    return _CLOSE_BY_NAME[name]


# Named constants for the codes the client acts on, by name: a name missing from the table fails
# at import, so the client cannot act on a code the table does not define.
NORMAL = _close("NORMAL")
ABNORMAL = _close("ABNORMAL")
PROTOCOL_ERROR = _close("PROTOCOL_ERROR")
TOO_BIG = _close("TOO_BIG")
INVALID_DATA = _close("INVALID_DATA")
HEARTBEAT_TIMEOUT = _close("HEARTBEAT_TIMEOUT")
DRAINING = _close("DRAINING")
UNSUPPORTED = _close("UNSUPPORTED")
# ERROR message codes (section 6); 4401-4403 are close codes as well.
BAD_TOKEN = ERRORS["BAD_TOKEN"]
TOKEN_EXPIRED = ERRORS["TOKEN_EXPIRED"]
FORBIDDEN = ERRORS["FORBIDDEN"]
UNKNOWN_ATTACHMENT = ERRORS["UNKNOWN_ATTACHMENT"]
TOO_MANY_CHANNELS = ERRORS["TOO_MANY_CHANNELS"]


def is_reconnect(code: int) -> bool:
    """Whether a close with ``code`` means "reconnect with backoff" (else: terminal).

    Codes not in the table follow the spec's default: reconnect in 1000-3999, terminal in
    4000-4999 and anything else (the range's terminal exceptions, 1000, 1008 and 1009, are in
    the table).
    """
    known = CODES.get(code)
    if known is not None:
        return known.reconnect
    return 1000 <= code <= 3999


def name(code: int) -> str:
    """The table's name for ``code``, or ``"CODE_<n>"`` for codes it does not list."""
    known = CODES.get(code)
    return known.name if known is not None else f"CODE_{code}"
