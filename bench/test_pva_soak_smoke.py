"""The PVA monitor soak once at a tiny size, so it cannot rot (`make test`).

No thresholds on memory or timing here (bench/ measures, tests do not): only that the steady
monitors saw updates while monitors were opened and closed, and that samples were taken.
"""

from __future__ import annotations

from bench.pva_soak import run


def test_pva_soak_tiny() -> None:
    result = run(pvs=5, churn=3, duration=3.0, every=1.0)
    assert result["monitors_opened_and_closed"] >= 6
    assert result["updates"] > 0
    assert len(result["samples"]) >= 2
    assert all(s["rss_mb"] > 0 and s["fds"] > 0 for s in result["samples"])
