"""The CA ingest measurement once at a tiny size, so it cannot rot (`make test`).

No timing thresholds here (bench/ measures, tests do not): only that every mode subscribed to
every counter and counted updates in its window.
"""

from __future__ import annotations

from bench.ca_ingest import MODES
from bench.ingest import run


def test_ca_ingest_tiny() -> None:
    rows = run("bench.ca_ingest", pvs=5, duration=1.0, rounds=1, modes=list(MODES))
    assert [r["mode"] for r in rows] == list(MODES)
    for r in rows:
        assert r["never"] == 0, r
        assert r["updates"] > 0 and r["us_per_update"] > 0, r
