"""The client benchmarks once at a tiny size, so they cannot rot (`make test`).

No timing assertions: only that each ran end to end and produced sane numbers.
"""

from __future__ import annotations

import math

from bench import cli_monitor, client_cpu


def test_client_cpu_tiny() -> None:
    res = client_cpu.measure(channels=20, warmup=2.0, duration=2.0)
    for api in client_cpu.APIS:
        assert res[api]["updates"] > 0 and res[api]["cpu_pct"] >= 0, res
    assert "batches" in client_cpu.table(res)


def test_cli_monitor_tiny() -> None:
    res = cli_monitor.measure(channels=20, warmup=2.0, duration=2.0)
    for mode in res["modes"]:
        assert mode["lines_per_s"] > 0 and mode["bytes_per_line"] > 10, mode
        assert mode["lag_samples"] > 0 and not math.isnan(mode["lag_p50_ms"]), mode
    assert "json" in cli_monitor.table(res)
