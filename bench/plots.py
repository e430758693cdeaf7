"""Curves from the bench's saved runs: PNGs in bench/results/ for bench/README.md.

    .venv/bin/python -m bench.plots [--out DIR] [RUN.json ...]

Reads pytest-benchmark's saved runs (`make bench` saves one JSON per run under
bench/results/runs/; bench/results/history_server.json holds two more under "runs"), skips quick
runs, and draws from the newest run that has each curve's tests:
- per_pv.png: server CPU per delivered update against PVs, pvwire, the aioca / p4p floor and
  Coniql 0.4.2 (`test_scenario[ca-1xN]`, `[pva-1xN]`);
- fanout.png: server CPU, CPU per delivered update and p99 latency against clients of the same
  1,000 PVs (`[ca-1x1000]`, `[fanout-Kx1000]`, `test_workers[fanout-20x1000]`);
- recording.png: CPU per delivered update with recent history on and off, every round of every
  saved run (`test_history_cost[...]`), oldest run first.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

RESULTS = Path(__file__).parent / "results"
DEFAULT_SOURCES = (*sorted(RESULTS.glob("runs/*/*.json")), RESULTS / "history_server.json")


@dataclass(frozen=True)
class Run:
    """One saved run: its figures by test name (`extra_info`), when, and at which commit."""

    when: str
    commit: str
    figures: dict[str, dict[str, Any]]

    @property
    def label(self) -> str:
        return f"{self.commit[:7]} {self.when[:16].replace('T', ' ')} UTC"


def load_runs(paths: Iterable[Path]) -> list[Run]:
    """Every full (not quick) saved run in `paths`, oldest first, each once."""
    runs: dict[str, Run] = {}
    for path in paths:
        doc = json.loads(path.read_text())
        for raw in doc.get("runs", [doc]):
            figures = {
                str(b["name"]): dict(b.get("extra_info", {}))
                for b in raw.get("benchmarks", [])
                if not b.get("extra_info", {}).get("quick")
            }
            if figures:
                when = str(raw["datetime"])
                runs[when] = Run(when, str(raw["commit_info"]["id"]), figures)
    return [runs[k] for k in sorted(runs)]


def newest_with(runs: list[Run], test: str) -> Run | None:
    """The newest run that measured `test`."""
    return next((r for r in reversed(runs) if test in r.figures), None)


def _style(ax: Any, xlabel: str, ylabel: str) -> None:
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def plot_per_pv(run: Run, dst: Path) -> None:
    """CPU per delivered update against PVs, one panel per upstream protocol."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    floors = {"ca": "aioca camonitor (floor)", "pva": "p4p asyncio client (floor)"}
    for ax, source in zip(axes, ("ca", "pva"), strict=True):
        pattern = re.compile(rf"test_scenario\[{source}-1x(\d+)\]")
        points = sorted(
            (int(m.group(1)), fig_)
            for name, fig_ in run.figures.items()
            if (m := pattern.fullmatch(name))
        )
        xs = [n for n, _ in points]
        ax.plot(xs, [f["server_us_per_update"] for _, f in points], "o-", label="pvwire server")
        ax.plot(xs, [f["floor_us_per_update"] for _, f in points], "s--", label=floors[source])
        coniql = [(n, f["coniql_us_per_update"]) for n, f in points if "coniql_us_per_update" in f]
        if coniql:
            ax.plot(*zip(*coniql, strict=True), "^:", color="tab:red", label="Coniql 0.4.2")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(xs, [f"{n:,}" for n in xs])
        ax.set_title(f"{source.upper()}: 1 client x N counters at 10 Hz")
        _style(ax, "PVs (N)", "CPU µs per delivered update")
    fig.suptitle(f"CPU per update against PVs (make bench, {run.label})")
    fig.tight_layout()
    fig.savefig(dst, dpi=80)
    plt.close(fig)


def fanout_points(run: Run) -> list[tuple[int, float, float, float]]:
    """(clients, server CPU %, µs per delivered update, p99 ms) of one worker, by clients."""
    points = []
    one = run.figures.get("test_scenario[ca-1x1000]")
    if one:
        points.append((1, one["server_cpu"], one["server_us_per_update"], one["lat_p99_ms"]))
    for name, f in run.figures.items():
        if m := re.fullmatch(r"test_scenario\[fanout-(\d+)x1000\]", name):
            points.append(
                (int(m.group(1)), f["server_cpu"], f["server_us_per_update"], f["lat_p99_ms"])
            )
    w1 = run.figures.get("test_workers[fanout-20x1000]")
    if w1:
        cpu, rate = w1["w1.server_cpu"], w1["w1.delivered_per_s"]
        points.append((20, cpu, cpu * 1e4 / rate, w1["w1.lat_p99_ms"]))
    return sorted(points)


def plot_fanout(run: Run, dst: Path) -> None:
    """Server CPU, CPU per update and p99 against clients of the same 1,000 CA PVs."""
    points = fanout_points(run)
    xs = [p[0] for p in points]
    fig, (cpu, per, p99) = plt.subplots(1, 3, figsize=(14, 4))
    cpu.plot(xs, [p[1] for p in points], "o-", label="pvwire server, 1 worker")
    per.plot(xs, [p[2] for p in points], "o-", label="pvwire server, 1 worker")
    p99.plot(xs, [p[3] for p in points], "o-", label="client latency p99 (IOC time to receipt)")
    per.set_yscale("log")
    for ax in (cpu, per, p99):
        ax.set_xscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
    cpu.set_ylim(bottom=0)
    p99.set_ylim(bottom=0)
    _style(cpu, "clients x the same 1,000 CA PVs at 10 Hz", "server CPU % of one core")
    _style(per, "clients", "server CPU µs per delivered update")
    _style(p99, "clients", "latency p99 ms")
    fig.suptitle(
        f"fan-out: clients of the same 1,000 CA counters (make bench, {run.label}; "
        "20 clients: test_workers' 1-worker run)"
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=80)
    plt.close(fig)


def plot_recording(runs: list[Run], dst: Path) -> list[Run]:
    """Every round's CPU per update, history on and off, per saved run; returns the runs drawn."""
    names = ("test_history_cost[sim-1x2000]", "test_history_cost[ca-1x1000]")
    drawn = [r for r in runs if any(n in r.figures for n in names)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharex=True)
    for ax, name in zip(axes, names, strict=True):
        for side, marker, offset in (("on", "o", -0.08), ("off", "s", 0.08)):
            xs: list[float] = []
            ys: list[float] = []
            for i, run in enumerate(drawn):
                rounds = run.figures.get(name, {}).get("result", {}).get(side, {})
                for us in rounds.get("us_per_update", []):
                    xs.append(i + offset)
                    ys.append(us)
            label = "history on (every channel records)" if side == "on" else "--history-mb 0"
            ax.plot(xs, ys, marker, linestyle="", alpha=0.7, label=label)
        ax.set_xticks(range(len(drawn)), [r.label for r in drawn], rotation=20, ha="right")
        ax.set_title(name.removeprefix("test_history_cost[").removesuffix("]") + ", 1 client")
        ax.set_ylim(bottom=0)
        _style(ax, "saved run (commit, time saved)", "server CPU µs per delivered update")
    fig.suptitle("recording recent history: each round, on and off interleaved in one run")
    fig.tight_layout()
    fig.savefig(dst, dpi=80)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__)
    parser.add_argument("runs", nargs="*", type=Path, help="saved runs (default: all of them)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the PNGs go")
    args = parser.parse_args(argv)
    runs = load_runs(args.runs or [p for p in DEFAULT_SOURCES if p.exists()])
    scenarios = newest_with(runs, "test_scenario[ca-1x1000]")
    if scenarios is None:
        raise SystemExit("no saved run has the load scenarios (test_scenario[ca-1x1000])")
    plot_per_pv(scenarios, args.out / "per_pv.png")
    plot_fanout(scenarios, args.out / "fanout.png")
    print(args.out / "per_pv.png", "and", args.out / "fanout.png", "from", scenarios.label)
    drawn = plot_recording(runs, args.out / "recording.png")
    print(args.out / "recording.png", "from", ", ".join(r.label for r in drawn))


if __name__ == "__main__":
    main()
