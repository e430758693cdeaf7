"""Every load scenario once at a tiny size, so the harness cannot rot (`make test`).

No timing assertions: only that the harness ran end to end and produced sane numbers (and, for
the history pairs, that the "on" runs recorded every channel and the "off" runs none).
The real runs are `make bench` (bench/bench_load.py).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench import control, history_cost
from bench.bench_load import check_history_wiring
from bench.conftest import flatten
from bench.harness import Scenario, run
from bench.report import markdown_table, scenario_figures
from bench.scenario import scenarios

TINY = {
    # One CA and one PVA single-client run with the floor, disjoint clients, fan-out, sim,
    # and the waveform: one of each kind of scenario in scenario.py.
    "ca-1x10": {},
    "pva-1x10": {},
    "ca-2x50": {"pvs": 10, "per_client": 5},
    "fanout-10x1000": {"pvs": 10, "clients": 2},
    "sim-1x10000": {"pvs": 10},
    "waveform-ca": {},
    # Coniql 0.4.2 beside pvwire and the floor (it reads PVA scenarios' records over CA).
    "ca-1x1000": {"pvs": 10},
    "pva-1x2000": {"pvs": 10},
}


@pytest.mark.parametrize("name", list(TINY))
def test_scenario_tiny(name: str) -> None:
    sc: Scenario = replace(scenarios()[name], duration=2.0, warmup=1.0, **TINY[name])
    res = run(sc, verbose=False)
    assert not res["errors"], res["errors"]
    assert res["received"] > 0
    assert res["missing"] == 0
    assert res["seq_gaps"] == 0
    assert res["min_received_client"] > 0
    for key in ("server_cpu", "client_cpu", "server_rss_mb", "lat_p50_ms", "lat_p99_ms"):
        assert key in res and not math.isnan(res[key]), key
    assert res["server_rss_mb"] > 1
    if sc.floor and sc.source != "sim":
        assert res["floor_received"] > 0
        assert "own_us_per_update" in res
        assert scenario_figures(res)["ratio_to_floor"] > 0
    if sc.coniql:
        assert res["coniql_received"] > 0 and not res["coniql_errors"], res
        assert res["coniql_pvs_connected"] == sc.pvs
        assert not math.isnan(res["coniql_cpu"]) and res["coniql_nominal"] > 0
        figures = scenario_figures(res)
        assert figures["coniql_delivered_share"] > 0 and figures["coniql_ratio_to_floor"] > 0
    assert name in markdown_table([res])


@pytest.mark.parametrize("name", list(history_cost.SCENARIOS))
def test_history_cost_tiny(name: str) -> None:
    """bench_load.py's `test_history_cost`: one run with history and one without, at 10 PVs."""
    got = history_cost.measure(history_cost.scenario(name, quick=True), 1, verbose=False)
    check_history_wiring(got)
    for side in ("on", "off"):
        assert got[side]["missing"] == 0 and got[side]["delivered_per_s_median"] > 0, got
        # CPU time comes in 10 ms ticks: 2 s at 10 PVs can read 0, never less or NaN.
        assert math.isfinite(got[side]["us_median"]) and got[side]["us_median"] >= 0, got
    assert "added_us_median" in flatten(got)


@pytest.mark.parametrize("name", ["control-stream", "control-pvws", "control-mix", "control-ca"])
def test_control_tiny(name: str) -> None:
    """A control-room scenario (bench/control.py) at 6 screens of 10 of 40 PVs, 2 replaced/s."""
    sc = replace(control.scenarios()[name], clients=6, per_client=10, pvs=40, churn_per_s=2.0,
                 duration=2.0, warmup=1.0)  # fmt: skip
    res = control.run(sc, verbose=False)
    assert not res["errors"], res["errors"]
    assert res["received"] > 0 and res["seq_gaps"] == 0
    assert res["opens"] > 0 and res["screens_opened"] >= sc.clients + res["opens"]
    for key in ("delivered_per_s", "server_cpu", "lat_p50_ms", "lat_p99_ms", "open_p50_ms",
                "open_p99_ms", "server_us_per_update", "rss_per_client_kb"):  # fmt: skip
        assert key in res and not math.isnan(res[key]), key
    if sc.endpoint == "mix":
        assert res["stream_delivered_per_s"] > 0 and res["pvws_delivered_per_s"] > 0


@pytest.mark.parametrize("name", ["open-ca-pvws", "control-pvws-w2"])
def test_opening_at_once_and_workers_tiny(name: str) -> None:
    """Every screen opening together over CA; distinct screens on `--workers 2`."""
    sc = replace(control.scenarios()[name], clients=4, per_client=10, pvs=40, duration=2.0,
                 warmup=1.0)  # fmt: skip
    res = control.run(sc, verbose=False)
    assert not res["errors"], res["errors"]
    assert res["received"] > 0 and res["server_cpu"] > 0
    assert res["initial_open_max_ms"] >= res["initial_open_p50_ms"] > 0
