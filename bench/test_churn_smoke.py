"""The connection-churn soak once at a tiny size, so it cannot rot (`make test`).

No timing or memory thresholds here (bench/ measures, tests do not): only that the soak ran end
to end, churned, sampled the server and left no session behind.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.churn import plot, soak, summary


def test_churn_tiny(tmp_path: Path) -> None:
    res = asyncio.run(soak(duration=4.0, workers=2, sample_every=0.5))
    assert res["error_count"] == 0, res["errors"]
    assert res["cycles"] > 0 and res["attaches"] > 0
    assert len(res["samples"]) >= 2 and res["rss_end_mb"] > 1 and res["fds_end"] > 0
    assert res["clients_left"] == 0
    assert plot(res, tmp_path / "churn.png").stat().st_size > 0
    assert "churn" in summary(res)
