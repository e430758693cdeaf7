"""protocol/close_codes.json is the one table of close and error codes: the server's and the Python
client's shipped copies are identical to it, and every code the server sends is in it."""

from __future__ import annotations

import json
from pathlib import Path

from pvwire.wire import codes

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "protocol" / "close_codes.json"


def test_shipped_copies_are_identical() -> None:
    text = SOURCE.read_text()
    assert (ROOT / "server/pvwire/wire/close_codes.json").read_text() == text
    assert (ROOT / "clients/py/pvwire_client/close_codes.json").read_text() == text


def test_every_server_constant_is_in_the_table() -> None:
    table = json.loads(SOURCE.read_text())
    known = {r["code"] for section in ("codes", "errors") for r in table[section]}
    for name in codes.__all__:
        value = getattr(codes, name)
        assert (value if isinstance(value, frozenset) else {value}) <= known, name


def test_the_spec_lists_every_code() -> None:
    spec = (ROOT / "protocol" / "PROTOCOL.md").read_text()
    table = json.loads(SOURCE.read_text())
    for row in table["codes"] + table["errors"]:
        assert f"| {row['code']} | {row['name']} |" in spec, row["name"]
