"""The attacks of bench/attacks.py once at a tiny size, so they cannot rot (`make test`).

No thresholds here (tests/test_attacks.py states the bounds, at a size that proves them): only
that each attack ran end to end against a real server and gave its figures. One server for all
of them: a server start per attack would cost more than the attacks.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.attacks import ATTACKS, TINY, attack, server_args
from tests.server_process import ServerProcess


@pytest.fixture(scope="module")
def audit() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp) / "audit.jsonl"


@pytest.fixture(scope="module")
def target(audit: Path) -> Iterator[ServerProcess]:
    with ServerProcess(*server_args(audit, [])) as server:
        yield server


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_tiny(target: ServerProcess, audit: Path, name: str) -> None:
    res = attack(target, name, TINY, audit)
    assert res["attack"] == name
    assert res["rss_start_mb"] > 0 and res["wall_s"] > 0, res
    assert "failed" not in res["bystander"] and res["bystander"]["frames"] > 0, res
