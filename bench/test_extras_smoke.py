"""The workers pairs, failover, gateway, identity puts, client and history measurements
(in-process and over HTTP) of `make bench` once at a tiny size, so they cannot rot (`make test`).

No timing assertions: only that every part ran end to end on real processes and gave the
numbers bench/bench_load.py and bench/bench_extras.py record. One test per part keeps each
within the suite's per-test timeout on a loaded machine.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from bench import (
    aa_http,
    archive_span,
    cli_monitor,
    client_cpu,
    drain,
    failover,
    gateway,
    history,
    history_http,
    identity_puts,
    pvws_fanout,
    tick_route,
)
from bench.bench_extras import own_environ
from bench.bench_load import sized
from bench.conftest import flatten
from bench.harness import run
from bench.report import WORKER_PAIRS, workers_figures


@pytest.fixture
def environ() -> Iterator[None]:
    with own_environ():
        yield


@pytest.mark.parametrize("pair", list(WORKER_PAIRS))
def test_workers_1_and_2_tiny(pair: str) -> None:
    one, two = (run(sized(name, quick=True), verbose=False) for name in WORKER_PAIRS[pair])
    for r in (one, two):
        assert r["received"] > 0 and r["pvs"] <= 10 and r["clients"] <= 2, r
    figures = workers_figures(one, two)
    assert figures["ratio.delivered_per_s"] > 0 and figures["ratio.server_cpu"] > 0, figures


def test_failover_tiny(environ: None) -> None:
    got = failover.measure(trials=1)
    for kind in ("sigkill", "sigterm"):
        assert got[kind]["clients_moved"] > 0, got
        assert got[kind]["snapshot_over_target"] > 0 and got[kind]["missed_max"] >= 0, got
    assert "sigkill.stop_to_snapshot_s_median" in flatten(got)


def test_drain_tiny(environ: None) -> None:
    got = drain.measure(clients=12, delay_s=1.0, window_s=2.0)
    for mode in drain.MODES:
        assert got[mode]["moved"] == 12 and got[mode]["exit_status"] == 0, got
        assert got[mode]["reconnects_peak_per_s"] > 0, got
    assert "drain.longest_without_data_s_max" in flatten(got)
    assert "| drain |" in drain.table(got)


def test_gateway_tiny(environ: None) -> None:
    got = gateway.measure(pvs=10, duration=2.0)
    assert got["direct"]["updates_per_s"] > 0 and got["gateway"]["updates_per_s"] > 0, got
    assert got["ratio"]["updates_per_s"] > 0 and got["gateway"]["gateway_cpu"] >= 0, got


def test_identity_puts_tiny(environ: None) -> None:
    got = identity_puts.measure(3, 1)
    assert set(got) == {
        "libca", "new circuit", "open circuit", "p4p", "new PVA connection", "open PVA connection"
    }  # fmt: skip
    for figures in got.values():
        assert 0 < figures["median_ms"] <= figures["p90_ms"], got


def test_clients_tiny() -> None:
    cpu = client_cpu.measure(20, 2.0, 2.0)
    for api in ("floor", "monitor", "batches"):
        assert cpu[api]["updates"] > 0 and cpu[api]["cpu_pct"] >= 0, cpu
    assert cpu["batches"]["ratio_to_floor"] > 0
    for mode in cli_monitor.measure(20, 2.0, 2.0)["modes"]:
        assert mode["lines_per_s"] > 0 and mode["bytes_per_line"] > 10, mode
        assert mode["lag_samples"] > 0 and not math.isnan(mode["lag_p50_ms"]), mode


def test_history_tiny() -> None:
    got = history.measure(2000, 1, 2)
    assert got["recording"]["on_ns_best"] > 0 and got["recording"]["off_ns_best"] > 0, got
    assert got["memory"]["channel_bytes"] == history.CHANNEL_BYTES
    # an hour of 10 Hz data cannot fit the raw ring: it comes back as buckets
    assert got["reading"]["hour_max1000_resolution_s"] > 0, got
    assert got["reading"]["last60s_rows"] == 600, got
    assert got["arrays"]["w16_frames"] == history.RAW_POINTS, got
    assert got["arrays"]["w1024_bytes"] > got["arrays"]["w16_bytes"] > history.CHANNEL_BYTES


def test_aa_http_tiny() -> None:
    got = aa_http.measure(1, verbose=False)
    # the Archiver Appliance API answered every case, each with a ratio to GraphQL's read
    for span in ("hour_10hz", "day_1hz"):
        assert got[f"{span}_graphql"]["bytes"] > 0, got
        for case in ("raw_raw", "raw_json", "mean_60_raw", "mean_60_json"):
            assert got[f"{span}_{case}"]["bytes"] > 0 and got[f"{span}_{case}"]["vs_graphql"] > 0


def test_history_http_tiny() -> None:
    got = history_http.measure(2, verbose=False)
    # the same hour over HTTP as in-process (measure checks the rows match): buckets for the
    # hour, every point of the last minute
    assert got["hour_max1000"]["resolution_s"] == 10, got
    assert got["hour_max20"]["resolution_s"] == 300, got
    assert got["last60s"]["rows"] == 600 and got["last60s"]["resolution_s"] == 0, got
    for case in ("hour_max1000", "hour_max20", "last60s"):
        assert got[case]["response_bytes"] > 0 and got[case]["http_ms_best"] > 0, got


def test_pvws_fanout_tiny() -> None:
    """Both paths timed, and their writes the same bytes (checked inside)."""
    out = pvws_fanout.measure(screens=5, per_screen=10, pvs=40, rounds=3)
    assert out["deliveries_per_round"] > 0 and out["compiled_ns"] > 0 and out["python_ns"] > 0


def test_tick_route_tiny() -> None:
    """Both paths timed, and their entries the same bytes (checked inside)."""
    out = tick_route.measure(screens=5, per_screen=10, pvs=40, rounds=2)
    assert out["deliveries_per_round"] == 50
    for key in ("route_compiled_ns", "route_python_ns", "splice_compiled_ns", "splice_python_ns"):
        assert out[key] > 0, out


def test_archive_span_tiny() -> None:
    got = archive_span.measure(1, verbose=False)
    # every read answered, the joined ones with their ratio to the two reads they replace
    for kind in ("graphql", "raw", "json", "mean_60_raw", "mean_60_json"):
        for how in ("cold", "cached"):
            assert got[f"{kind}_span_{how}"]["bytes"] > 0, got
            assert got[f"{kind}_span_{how}"]["vs_both_alone"] > 0, got
        assert (
            got[f"{kind}_archive_alone"]["bytes"] > 0 and got[f"{kind}_recent_alone"]["bytes"] > 0
        )
