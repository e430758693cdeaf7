"""The bench suite's wiring: sizes (full, or quick with `BENCH_QUICK=1`) and each measurement's
figures in pytest-benchmark's `extra_info`, printed beside the last saved run's.

`make bench` runs bench/bench_*.py and bench/test_micro.py under pytest-benchmark and saves each
run's JSON (`--benchmark-autosave`: one file per run named by counter, commit and date) under
bench/results/runs/ (quick runs under bench/results/raw/quick/, not kept). A load scenario lasts
as long as its window, so its pytest-benchmark time only says how long it ran; what it measured
(updates/s, CPU per update, ratios to the floor and to Coniql) is in `extra_info`, and the summary
at the end of the run puts each figure beside the same figure of the previous saved run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.leaks import collect_after_each_module  # noqa: F401  (autouse: applies here)

# Every measurement at a few PVs and clients and second-long windows: proves the wiring, measures
# nothing worth keeping (`BENCH_QUICK=1 make bench`).
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")

# Figures of this run, by benchmark fullname, for the summary.
_FIGURES: dict[str, dict[str, Any]] = {}
_PREVIOUS: dict[str, Any] = {"path": None, "figures": {}}


@pytest.fixture
def quick() -> bool:
    return QUICK


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, float | int | str]:
    """Every number and short string of a nested result as `a.b.c` keys (lists left out)."""
    out: dict[str, float | int | str] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, bool):
            out[name] = int(value)
        elif isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
            out[name] = value
        elif isinstance(value, float):
            out[name] = str(value)  # nan and inf as text: JSON has no such numbers
        elif isinstance(value, str) and len(value) <= 80:
            out[name] = value
    return out


Figures = Callable[[Mapping[str, Any]], Mapping[str, Any]]
Measure = Callable[[Callable[[], Mapping[str, Any]], Figures], Mapping[str, Any]]


@pytest.fixture
def measure(benchmark: Any, request: pytest.FixtureRequest) -> Measure:
    """`measure(fn, figures)`: run `fn` once under pytest-benchmark; `figures(result)` (e.g.
    `flatten`: every number of it) goes into `extra_info`, the whole result under
    `extra_info["result"]`, and the load average before and after beside them."""

    def measured(fn: Callable[[], Mapping[str, Any]], figures: Figures) -> Mapping[str, Any]:
        load0 = os.getloadavg()[0]
        got = benchmark.pedantic(fn, rounds=1, iterations=1, warmup_rounds=0)
        figs = dict(figures(got))
        figs["loadavg_1m_start"] = round(load0, 2)
        figs["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
        figs["quick"] = int(QUICK)
        benchmark.extra_info.update(figs)
        benchmark.extra_info["result"] = json.loads(json.dumps(got, default=str))
        _FIGURES[request.node.nodeid] = figs
        return got

    return measured


def _storage(config: pytest.Config) -> Path | None:
    try:
        where = str(config.getoption("benchmark_storage"))
    except ValueError:
        return None
    return Path(where.removeprefix("file://"))


def pytest_configure(config: pytest.Config) -> None:
    """Find the last saved run before this one saves its own."""
    root = _storage(config)
    if root is None or not root.is_dir():
        return
    runs = sorted(root.glob("*/*.json"), key=lambda p: (p.parent.name, p.name))
    if not runs:
        return
    try:
        doc = json.loads(runs[-1].read_text())
    except (OSError, ValueError):
        return
    _PREVIOUS["path"] = runs[-1]
    _PREVIOUS["figures"] = {
        b["fullname"]: {k: v for k, v in b.get("extra_info", {}).items() if k != "result"}
        for b in doc.get("benchmarks", [])
    }


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not _FIGURES:
        return
    tr = terminalreporter
    before: dict[str, dict[str, Any]] = _PREVIOUS["figures"]
    tr.section(f"figures (extra_info); previous run: {_PREVIOUS['path'] or 'none saved'}")
    for nodeid, figs in _FIGURES.items():
        old = before.get(nodeid, {})
        tr.write_line(nodeid)
        for key, value in figs.items():
            if key.startswith("loadavg") or key == "quick" or isinstance(value, str):
                continue
            prev = old.get(key)
            tail = f"   (previous {_fmt(prev)})" if key in old else ""
            tr.write_line(f"    {key:44} {_fmt(value):>14}{tail}")
