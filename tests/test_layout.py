"""The layout shows the path (DESIGN.md section 2): `api/`, the application and the command line
ask the hub through its methods, and read no private attribute of another object or module."""

from __future__ import annotations

import ast
from pathlib import Path

import pvwire

PACKAGE = Path(pvwire.__file__).parent
# Everything above core/: the API, the ASGI application that wires it, and the command line.
OUTSIDE_CORE = [*sorted((PACKAGE / "api").glob("*.py")), PACKAGE / "app.py", PACKAGE / "cli.py"]
# The hub's parts: the API asks the hub, which asks them.
HUB_PARTS = {"registry", "control", "signer", "rules", "ticker", "audit", "sessions"}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def reaches_around(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = _name(node.value)
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            if private and owner not in ("self", "cls"):
                found.append(f"line {node.lineno}: {owner}.{node.attr}")
            if owner.lstrip("_") == "hub" and node.attr in HUB_PARTS:
                found.append(f"line {node.lineno}: {owner}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.level != 1:  # from outside api/
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("_") and a.name != "__version__"
            ]
    return found


def test_the_check_sees_what_it_looks_for() -> None:
    code = "hub.registry.channels\nself._hub.signer.sign()\nws._send\nfrom ..x import _y\n"
    assert len(reaches_around(ast.parse(code))) == 4
    assert reaches_around(ast.parse("self._x\nhub.subscribe()\nfrom .. import __version__")) == []


def test_api_app_and_cli_go_through_the_hub_and_read_nothing_private() -> None:
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in OUTSIDE_CORE
        if (hits := reaches_around(ast.parse(path.read_text())))
    }
    assert len(OUTSIDE_CORE) > 5 and found == {}
