"""The limits the server enforces are one table (server/pvwire/limits.py): the code reads it, and
PROTOCOL.md's section 11 and the GraphQL schema's descriptions are generated from it."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

from pvwire import limits
from pvwire.config import Settings
from pvwire.wire.session import SessionLimits

from scripts.generate_protocol import PROTOCOL, protocol_text, schema_text

ROOT = Path(__file__).resolve().parents[1]


def test_protocol_md_holds_the_current_table() -> None:
    text = PROTOCOL.read_text()
    assert protocol_text(text) == text, "regenerate: python scripts/generate_protocol.py"


def test_schema_file_is_what_the_generator_writes() -> None:
    path = ROOT / "protocol" / "schema.graphql"
    assert path.read_text() == schema_text(), "regenerate: python scripts/generate_protocol.py"


def test_every_setting_limit_is_a_settings_default() -> None:
    defaults = {f.name: getattr(Settings(), f.name) for f in fields(Settings)}
    for limit in limits.LIMITS:
        if limit.setting:
            assert defaults[limit.name] == limit.value, limit.name


def test_the_session_defaults_are_the_table_s() -> None:
    s = SessionLimits()
    assert (s.max_attachments, s.max_channels, s.send_budget, s.stall_timeout, s.heartbeat) == (
        limits.default("max_attachments_per_connection"),
        limits.default("max_channels_per_connection"),
        limits.default("send_budget"),
        limits.default("stall_timeout_s"),
        limits.default("heartbeat_s"),
    )


def test_the_schema_describes_the_limits_the_server_enforces() -> None:
    text = schema_text()
    for name in ("max_rate_hz", "max_columns", "min_pixels", "token_ttl_s", "max_id_length",
                 "max_channels_per_subscription", "max_query_depth", "max_query_cost"):  # fmt: skip
        assert limits.shown(name) in text, name


# A module-level constant so named holds a bound; its number belongs in the table.
BOUND_NAME = re.compile(r"^_?([A-Z0-9_]*_)?(MAX|MIN|LIMIT|TIMEOUT|BUDGET|IDLE)(_[A-Z0-9_]*)?(_S)?$")


def _literal_number(node: ast.expr) -> bool:
    """A number written out (`64`, `4 * 1024`, `256 << 20`), not read from the table."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _literal_number(node.left) and _literal_number(node.right)
    if isinstance(node, ast.UnaryOp):
        return _literal_number(node.operand)
    return False


def _bounds_outside_the_table(path: Path) -> list[str]:
    """`file:line NAME` of each bound `path` writes out: a module-level constant named as one,
    or a default of a `...Limits` class (every field of one is a bound)."""
    where = path.relative_to(ROOT)
    found = []
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name) and BOUND_NAME.match(t.id)]
            if names and _literal_number(node.value):
                found += [f"{where}:{node.lineno} {name}" for name in names]
        elif isinstance(node, ast.ClassDef) and node.name.endswith("Limits"):
            found += [
                f"{where}:{item.lineno} {node.name}"
                for item in node.body
                if isinstance(item, ast.AnnAssign)
                and item.value is not None
                and _literal_number(item.value)
            ]
    return found


def test_no_module_defines_a_bound_outside_the_table() -> None:
    package = ROOT / "server" / "pvwire"
    found = [
        hit
        for path in sorted(package.rglob("*.py"))
        if path.name != "limits.py" or path.parent != package
        for hit in _bounds_outside_the_table(path)
    ]
    assert not found, f"put in server/pvwire/limits.py's LIMITS and read from there: {found}"


def test_the_rule_sees_a_bound_written_out() -> None:
    assert BOUND_NAME.match("MAX_VIEWERS") and BOUND_NAME.match("CLOSE_TIMEOUT")
    assert BOUND_NAME.match("_CACHE_BYTES") is None and BOUND_NAME.match("MAXIMUM") is None
    tree = ast.parse("MAX_X = 4 * 1024\nMAX_Y = integer('max_y')\n")
    assigned = [n for n in tree.body if isinstance(n, ast.Assign)]
    assert [_literal_number(n.value) for n in assigned] == [True, False]
