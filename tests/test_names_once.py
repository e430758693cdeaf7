"""The EPICS alarm severity and status names are written once, in model.py; everything else in
the server (GraphQL's enum, pvws's names, CA's status messages) takes them from there."""

from __future__ import annotations

import ast
from pathlib import Path

import pvwire
from pvwire.model import ALARM_STATUS_NAMES, Severity

SERVER = Path(pvwire.__file__).parent
# Names that mean an alarm severity or status and nothing else (not NONE, READ, WRITE...).
ALARM_WORDS = {s.name for s in Severity} | (set(ALARM_STATUS_NAMES) - {"READ", "WRITE", "TIMEOUT"})


# Record field names that are also alarm status names: the Archiver Appliance's headers name the
# alarm limits by their fields (LOLO, LOW, HIGH, HIHI), not alarm statuses.
FIELD_NAMES = {"aa/source.py": {"LOLO", "LOW", "HIGH", "HIHI"}}


def test_only_model_py_spells_severity_and_status_names() -> None:
    spelled = {}
    for path in sorted(SERVER.rglob("*.py")):
        if path.name == "model.py" and path.parent == SERVER:
            continue
        tree = ast.parse(path.read_text(), str(path))
        words = {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        } | {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        # An enum or table of them shows as two or more of the names in one file.
        found = words & ALARM_WORDS - FIELD_NAMES.get(str(path.relative_to(SERVER)), set())
        if len(found) > 1:
            spelled[str(path.relative_to(SERVER))] = sorted(found)
    assert spelled == {}
