"""The attacks of bench/attacks.py once at a tiny size, so they cannot rot (`make test`).

No thresholds here (tests/test_attacks.py states the bounds, at a size that proves them): only
that each attack ran end to end against a real server and gave its figures.
"""

from __future__ import annotations

import pytest

from bench.attacks import ATTACKS, TINY, measure


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_tiny(name: str) -> None:
    res = measure(name, TINY)
    assert res["attack"] == name
    assert res["rss_start_mb"] > 0 and res["wall_s"] > 0, res
    assert "failed" not in res["bystander"] and res["bystander"]["frames"] > 0, res
