"""The CA open measurement once at a tiny size, so it cannot rot (`make test`): no timing
thresholds (bench/ measures, tests do not), only that every monitor got its first value."""

from __future__ import annotations

from bench.ca_open import run


def test_ca_open_tiny() -> None:
    (row,) = run(pvs=20, rounds=1)
    assert row["first_values"] == 20, row
    assert row["last_ms"] >= row["p50_ms"] > 0 and row["cpu_ms"] > 0, row
