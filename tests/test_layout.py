"""The layout shows the path (DESIGN.md section 2): every import points down, api/ -> core/ ->
upstream/ and wire/ -> model.py, by module path; `api/`, the application and the command line ask
the hub through its methods, and read no private attribute of another object or module: no
private name imported, and no import through a private module (`pvwire.core._x`, `uvicorn._y`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pvwire

PACKAGE = Path(pvwire.__file__).parent
# pvws's modules that sit above the hub, as api/ does; the rest of pvws/ is I/O-free, as wire/ is.
PVWS_ENDPOINT = {"endpoint.py", "scripts.py", "wsprotocol.py"}
# The Archiver Appliance API's modules above the hub (spanning.py: its reach into the archive
# behind the history, core/archive/); its PB format, times, post-processors and
# bodies are I/O-free, below it.
AA_ENDPOINT = {"endpoint.py", "source.py", "spanning.py"}
# Everything above core/: the API, the status PVs, the ASGI application that wires them, and
# the command line.
OUTSIDE_CORE = [
    *sorted((PACKAGE / "api").glob("*.py")),
    *sorted(PACKAGE / "pvws" / name for name in PVWS_ENDPOINT),
    *sorted(PACKAGE / "aa" / name for name in AA_ENDPOINT),
    *sorted((PACKAGE / "status").glob("*.py")),
    PACKAGE / "app.py",
    PACKAGE / "cli.py",
]
# The hub's parts: the API asks the hub, which asks them.
HUB_PARTS = {"registry", "control", "signer", "rules", "ticker", "audit", "sessions"}
# Every import points down, api/ -> core/ -> upstream/ and wire/ -> model.py: what each of these
# never imports (a module or package of pvwire, by its first name below `pvwire`).
ABOVE = {
    "api": {"upstream"},  # the API reaches the backends through the hub
    "pvws": {"upstream"},  # an endpoint, as api/ is
    "aa": {"upstream", "api", "pvws", "status"},  # an endpoint beside them
    # The status PVs read the hub's snapshots as /metrics does; the application wires them.
    "status": {"aa", "api", "app", "cli", "pvws", "upstream"},
    "core": {"api", "app", "cli", "pvws", "status"},
    "upstream": {"aa", "api", "app", "cli", "core", "pvws", "status", "wire"},
    "wire": {"aa", "api", "app", "cli", "core", "pvws", "status", "upstream"},
    "model": {"aa", "api", "app", "cli", "core", "pvws", "status", "upstream", "wire"},
}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _private_path(module: str) -> bool:
    """A dotted module path through a private module or package (dunders such as `__future__`
    are not private)."""
    return any(p.startswith("_") and not p.startswith("__") for p in module.split("."))


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
        elif isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}" for a in node.names if _private_path(a.name)
            ]
        elif isinstance(node, ast.ImportFrom) and node.level != 1:  # from outside api/
            if node.module is not None and _private_path(node.module):
                found.append(f"line {node.lineno}: from {node.module}")
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("_") and a.name != "__version__"
            ]
    return found


def pvwire_imports(tree: ast.AST, package: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, first name below `pvwire`) of each import of pvwire in a module of `package`
    (its path below `pvwire`), relative imports resolved."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            paths = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            paths = [(node.module or "").split(".")]
        elif isinstance(node, ast.ImportFrom):
            base = ["pvwire", *package[: len(package) - node.level + 1]]
            below = node.module.split(".") if node.module else []
            paths = [base + below] if below else [[*base, a.name] for a in node.names]
        else:
            continue
        found += [(node.lineno, p[1]) for p in paths if len(p) > 1 and p[0] == "pvwire"]
    return found


def test_the_import_check_resolves_relative_imports() -> None:
    code = (
        "from ..core.hub import Hub\nfrom . import codec\nfrom .. import model\nimport pvwire.api\n"
    )
    assert pvwire_imports(ast.parse(code), ("wire",)) == [
        (1, "core"),
        (2, "wire"),
        (3, "model"),
        (4, "api"),
    ]
    assert pvwire_imports(ast.parse("from ...model import CONN"), ("core", "sub")) == [(1, "model")]
    assert pvwire_imports(ast.parse("import os\nfrom typing import Any"), ("core",)) == []


def test_every_import_points_down() -> None:
    found = []
    for unit, above in ABOVE.items():
        paths = sorted((PACKAGE / unit).rglob("*.py")) or [PACKAGE / f"{unit}.py"]
        for path in paths:
            package = path.relative_to(PACKAGE).parent.parts
            found += [
                f"{path.relative_to(PACKAGE)} line {line}: imports pvwire.{name}"
                for line, name in pvwire_imports(ast.parse(path.read_text()), package)
                if name in above
            ]
    assert found == []


def test_the_pvws_protocol_is_below_the_hub_as_wire_is() -> None:
    found = [
        f"pvws/{path.name} line {line}: imports pvwire.{name}"
        for path in sorted((PACKAGE / "pvws").glob("*.py"))
        if path.name not in PVWS_ENDPOINT
        for line, name in pvwire_imports(ast.parse(path.read_text()), ("pvws",))
        if name in ABOVE["wire"] - {"pvws"}  # what wire/ never imports, but itself
    ]
    assert len(list((PACKAGE / "pvws").glob("*.py"))) > len(PVWS_ENDPOINT) and found == []


def test_the_archiver_format_is_below_the_hub_as_wire_is() -> None:
    """aa/pb.py is what an archiver behind the history will parse, from core/: the format, times,
    post-processors and bodies import nothing above model.py."""
    below = sorted(p for p in (PACKAGE / "aa").glob("*.py") if p.name not in AA_ENDPOINT)
    found = [
        f"aa/{path.name} line {line}: imports pvwire.{name}"
        for path in below
        for line, name in pvwire_imports(ast.parse(path.read_text()), ("aa",))
        if name in ABOVE["wire"] - {"aa"}
    ]
    assert len(below) >= 4 and found == []


def test_the_check_sees_what_it_looks_for() -> None:
    code = "hub.registry.channels\nself._hub.signer.sign()\nws._send\nfrom ..x import _y\n"
    assert len(reaches_around(ast.parse(code))) == 4
    assert reaches_around(ast.parse("self._x\nhub.subscribe()\nfrom .. import __version__")) == []


def test_the_check_sees_private_module_paths() -> None:
    code = "from uvicorn._types import Event\nimport pvwire.core._journal\nfrom .._x.y import z\n"
    assert reaches_around(ast.parse(code)) == [
        "line 1: from uvicorn._types",
        "line 2: import pvwire.core._journal",
        "line 3: from _x.y",
    ]
    public = "from __future__ import annotations\nimport os.path\nfrom ..core.hub import Hub\n"
    assert reaches_around(ast.parse(public)) == []


def test_api_app_and_cli_go_through_the_hub_and_read_nothing_private() -> None:
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in OUTSIDE_CORE
        if (hits := reaches_around(ast.parse(path.read_text())))
    }
    assert len(OUTSIDE_CORE) > 5 and found == {}


def dev_imports(tree: ast.Module) -> list[tuple[int, bool]]:
    """(line, at module level) of each import of pvwire_dev in a module."""
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(n.split(".")[0] == "pvwire_dev" for n in names):
            found.append((node.lineno, id(node) in top))
    return found


def test_the_dev_check_sees_module_level_and_nested_imports() -> None:
    code = "import pvwire_dev.ioc\ndef f():\n    from pvwire_dev.demo_ioc import DEMO_DB\n"
    assert dev_imports(ast.parse(code)) == [(1, True), (3, False)]
    assert dev_imports(ast.parse("from pvwire import ioc\nimport pvwire_client")) == []


def test_the_server_imports_the_dev_package_only_in_the_demo_commands() -> None:
    """pvwire_dev (test IOCs, the demo IOC) is not in the wheel or the image: the server never
    needs it; the command line imports it inside its demo commands only."""
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := dev_imports(ast.parse(path.read_text())))
    }
    assert set(found) == {"cli.py"} and not any(top for _, top in found["cli.py"])
