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

from bench.attacks import ATTACKS, PVA_ATTACKS, TINY, attack, server_args
from tests.attacks import PvaPeers, pva_peers, pva_server_args
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


@pytest.fixture(scope="module")
def pva_target(audit: Path) -> Iterator[tuple[ServerProcess, PvaPeers]]:
    """A server of --forward-identity beside a legitimate and a hostile PVA server."""
    with pva_peers(TINY.pva) as peers, tempfile.TemporaryDirectory() as tmp:
        args = server_args(audit, pva_server_args(Path(tmp)))
        with ServerProcess(*args, env=peers.env) as server:
            yield server, peers


@pytest.mark.parametrize("name", list(PVA_ATTACKS))
def test_pva_attack_tiny(
    pva_target: tuple[ServerProcess, PvaPeers], audit: Path, name: str
) -> None:
    server, peers = pva_target
    res = attack(server, name, TINY, audit, peers)
    assert res["attack"] == name and res["wall_s"] > 0, res
    assert "failed" not in res["bystander"] and res["bystander"]["frames"] > 0, res
