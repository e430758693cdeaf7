"""A load scenario's result (bench/harness.py) as the figures `make bench` records in
pytest-benchmark's `extra_info`, and as a Markdown row (`python -m bench.scenario`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

COLUMNS = (
    ("scenario", "scenario", "{}"),
    ("describe", "load", "{}"),
    ("delivered_per_s", "updates/s delivered", "{:,.0f}"),
    ("expected", "expected", "{:,}"),
    ("received", "received", "{:,}"),
    ("conflated", "conflated", "{:,}"),
    ("missing", "missing", "{:,}"),
    ("server_cpu", "server CPU %", "{:.1f}"),
    ("server_rss_mb", "server peak RSS MB", "{:.0f}"),
    ("lat_p50_ms", "latency p50 ms", "{:.1f}"),
    ("lat_p99_ms", "p99 ms", "{:.1f}"),
    ("lat_max_ms", "max ms", "{:.1f}"),
    ("ioc_cpu", "IOC CPU %", "{:.1f}"),
    ("client_cpu", "clients CPU % (procs)", "{}"),
    ("server_us_per_update", "server µs/update", "{:.2f}"),
    ("floor_us_per_update", "floor µs/update", "{:.2f}"),
    ("own_us_per_update", "pvwire own µs/update", "{:.2f}"),
)


def _fmt(res: dict[str, Any], key: str, fmt: str) -> str:
    v = res.get(key)
    if key == "client_cpu" and v is not None:
        return f"{v:.1f} ({res.get('client_procs', '?')})"
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    head = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    sep = "|" + "|".join("---" if i < 2 else "---:" for i in range(len(COLUMNS))) + "|"
    rows = []
    for r in results:
        if r.get("failed"):
            rows.append(f"| {r['scenario']} | FAILED: {r['failed']} |" + " |" * (len(COLUMNS) - 2))
            continue
        rows.append("| " + " | ".join(_fmt(r, k, f) for k, _, f in COLUMNS) + " |")
    return "\n".join([head, sep, *rows])


# What a scenario measured, as harness.run names it.
FIGURES = (
    "delivered_per_s", "expected", "received", "conflated", "missing", "server_cpu",
    "server_rss_mb", "lat_p50_ms", "lat_p99_ms", "lat_max_ms", "ioc_cpu", "client_cpu",
    "loop_lag_ms", "server_us_per_update", "floor_cpu", "floor_expected", "floor_received",
    "floor_us_per_update", "own_us_per_update", "coniql_nominal", "coniql_received",
    "coniql_missing", "coniql_cpu", "coniql_us_per_update", "coniql_pvs_updated",
    "coniql_lat_p99_ms",
)  # fmt: skip


def _div(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def scenario_figures(r: dict[str, Any]) -> dict[str, Any]:
    """The measured figures of one scenario and the ratios of the same run: server CPU per
    delivered update over the floor's (aioca / p4p, trivial callback) and over Coniql's, and the
    share of the updates each delivered. Coniql's share is against PVs x 10 Hz x window: a PV it
    starves shows no counter advance."""
    out = {k: r[k] for k in FIGURES if k in r and r[k] is not None and not _nan(r[k])}
    ratios = {
        "delivered_share": _div(r.get("received"), r.get("expected")),
        "ratio_to_floor": _div(r.get("server_us_per_update"), r.get("floor_us_per_update")),
        "floor_delivered_share": _div(r.get("floor_received"), r.get("floor_expected")),
        "coniql_delivered_share": _div(r.get("coniql_received"), r.get("coniql_nominal")),
        "coniql_ratio_to_floor": _div(r.get("coniql_us_per_update"), r.get("floor_us_per_update")),
        "coniql_over_pvwire": _div(r.get("coniql_us_per_update"), r.get("server_us_per_update")),
    }
    out.update({k: v for k, v in ratios.items() if v is not None})
    return out


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


WORKER_PAIRS = {
    "fanout-20x1000": ("fanout-20x1000-w1", "fanout-20x1000-w2"),
    "ca-8x250": ("ca-8x250-w1", "ca-8x250-w2"),
}


def workers_figures(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """The same load on 1 and 2 workers, back to back: each figure and its ratio 2 / 1."""
    out: dict[str, Any] = {}
    for key in ("delivered_per_s", "server_cpu", "ioc_cpu", "lat_p99_ms"):
        out[f"w1.{key}"], out[f"w2.{key}"] = one[key], two[key]
        ratio = _div(two[key], one[key])
        if ratio is not None:
            out[f"ratio.{key}"] = ratio
    out["w1.not_delivered"] = one["expected"] - one["received"]
    out["w2.not_delivered"] = two["expected"] - two["received"]
    return out
