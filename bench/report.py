"""Results as a Markdown table and PNG plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
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


def plots(results: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """CPU and latency against PV count (scenario a), and fan-out CPU against clients."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if not r.get("failed")]
    made: list[Path] = []
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax_cpu, ax_lat, ax_fan = axes
    for source, marker in (("ca", "o"), ("pva", "s")):
        rows = sorted(
            (r for r in ok if r["scenario"].startswith(f"{source}-1x")), key=lambda r: r["pvs"]
        )
        if not rows:
            continue
        n = [r["pvs"] for r in rows]
        ax_cpu.plot(
            n, [r["server_cpu"] for r in rows], marker=marker, label=f"pvwire server, {source}"
        )
        floor = "aioca" if source == "ca" else "p4p"
        ax_cpu.plot(n, [r.get("floor_cpu", math.nan) for r in rows], marker=marker,
                    linestyle="--", label=f"floor ({floor})")  # fmt: skip
        ax_lat.plot(n, [r["lat_p50_ms"] for r in rows], marker=marker, label=f"p50 {source}")
        ax_lat.plot(n, [r["lat_p99_ms"] for r in rows], marker=marker, linestyle="--",
                    label=f"p99 {source}")  # fmt: skip
    ax_cpu.set(xscale="log", xlabel="PVs at 10 Hz, 1 client", ylabel="% of one core",
               title="Server CPU vs PV count")  # fmt: skip
    ax_cpu.axhline(100, color="grey", linewidth=0.5)
    ax_lat.set(xscale="log", xlabel="PVs at 10 Hz, 1 client", ylabel="ms",
               title="Delivery latency (IOC timestamp to client)")  # fmt: skip
    for ax in (ax_cpu, ax_lat):
        if ax.get_legend_handles_labels()[0]:  # a run with no 1-client scenario has no lines
            ax.legend(fontsize=8)
    fan = sorted(
        (r for r in ok if r["scenario"].startswith("fanout-") or r["scenario"] == "ca-1x1000"),
        key=lambda r: r["clients"],
    )
    if fan:
        k = [r["clients"] for r in fan]
        ax_fan.plot(k, [r["server_cpu"] for r in fan], marker="o", label="server CPU %")
        ax_fan.plot(k, [r["client_cpu"] for r in fan], marker="^", label="load clients CPU %")
        ax_fan.plot(k, [r["delivered_per_s"] / 1e4 for r in fan], marker="x", linestyle=":",
                    label="delivered updates/s / 10^4")  # fmt: skip
        ax_fan.set(xlabel="clients, same 1,000 PVs", title="Fan-out (CA)")
        ax_fan.legend(fontsize=8)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "latest.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    made.append(path)
    return made


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}"


def _pct(part: float | None, whole: float | None) -> str:
    if part is None or not whole:
        return "-"
    return f"{100 * part / whole:.0f} %"


def coniql_table(results: Sequence[dict[str, Any]]) -> str:
    """pvwire, Coniql 0.4.2 and the floor over the same PVs in the same run (scenarios with
    `coniql`): share of the updates delivered, updates not delivered, CPU, and CPU per delivered
    update as a ratio to the floor's. Coniql's expected count is nominal (PVs x 10 Hz x window):
    a PV it starves shows no counter advance."""
    head = (
        "| scenario | expected | delivered: pvwire / Coniql / floor "
        "| not delivered: pvwire / Coniql / floor | CPU %: pvwire / Coniql / floor "
        "| CPU per update ÷ floor: pvwire / Coniql | Coniql PVs updated | Coniql p99 ms "
        "| load |"
    )
    rows = [head, "|---|---:|---|---|---|---|---:|---:|---:|"]
    for r in results:
        if r.get("failed") or "coniql_received" not in r:
            continue
        lost = (
            r["expected"] - r["received"],
            r["coniql_missing"],
            r.get("floor_expected", 0) - r.get("floor_received", 0),
        )
        p99 = r.get("coniql_lat_p99_ms")
        rows.append(
            f"| {r['scenario']} | {r['expected']:,} "
            f"| {_pct(r['received'], r['expected'])} / "
            f"{_pct(r['coniql_received'], r['coniql_nominal'])} / "
            f"{_pct(r.get('floor_received'), r.get('floor_expected'))} "
            f"| {lost[0]:,} / {lost[1]:,} / {lost[2]:,} "
            f"| {r['server_cpu']:.1f} / {r['coniql_cpu']:.1f} / {r.get('floor_cpu', math.nan):.1f} "
            f"| {_ratio(r['server_us_per_update'], r.get('floor_us_per_update'))} / "
            f"{_ratio(r['coniql_us_per_update'], r.get('floor_us_per_update'))} "
            f"| {r['coniql_pvs_updated']} of {r['pvs']} "
            f"| {'-' if p99 is None else f'{p99:,.0f}'} | {r.get('loadavg_1m', math.nan):.1f} |"
        )
    return "\n".join(rows) if len(rows) > 2 else ""


WORKER_PAIRS = (("fanout-20x1000-w1", "fanout-20x1000-w2"), ("ca-8x250-w1", "ca-8x250-w2"))


def workers_table(results: Sequence[dict[str, Any]]) -> str:
    """The same load on 1 and 2 workers, same run: each figure and its ratio 2 / 1."""
    by_name = {r["scenario"]: r for r in results if not r.get("failed")}
    rows = [
        "| load | delivered/s: 1 / 2 workers | ratio | server CPU %: 1 / 2 | ratio "
        "| IOC CPU %: 1 / 2 | ratio | not delivered: 1 / 2 | p99 ms: 1 / 2 |",
        "|---|---|---:|---|---:|---|---:|---|---|",
    ]
    for one, two in WORKER_PAIRS:
        if one not in by_name or two not in by_name:
            continue
        a, b = by_name[one], by_name[two]
        rows.append(
            f"| {a['describe']} | {a['delivered_per_s']:,.0f} / {b['delivered_per_s']:,.0f} "
            f"| {_ratio(b['delivered_per_s'], a['delivered_per_s'])} "
            f"| {a['server_cpu']:.1f} / {b['server_cpu']:.1f} "
            f"| {_ratio(b['server_cpu'], a['server_cpu'])} "
            f"| {a['ioc_cpu']:.1f} / {b['ioc_cpu']:.1f} | {_ratio(b['ioc_cpu'], a['ioc_cpu'])} "
            f"| {a['expected'] - a['received']:,} / {b['expected'] - b['received']:,} "
            f"| {a['lat_p99_ms']:.0f} / {b['lat_p99_ms']:.0f} |"
        )
    return "\n".join(rows) if len(rows) > 2 else ""
