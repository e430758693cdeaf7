"""Run every load scenario, the comparisons and the micro-benchmarks; write
bench/results/latest.{md,json,png}.

`make bench` runs this (see bench/README.md for how long). In one run: every scenario of
bench/scenario.py (the 1,000 and 2,000 PV ones with Coniql 0.4.2 beside pvwire and the floor; the
fan-out and disjoint loads on 1 and 2 workers), then failover, the PVA gateway, the Python client's
CPU and the command line's (EXTRAS), the micro-benchmarks and the connection-churn soak.

`--only a,b` runs a subset: scenario names, the groups of GROUPS (`coniql`, `workers`) and the
names of EXTRAS (`failover`, `gateway`, `client-cpu`, `cli-monitor`). `--duration S` changes the
measured window (default 15 s, also the extras'), `--no-micro` skips pytest-benchmark,
`--churn S` sets the churn soak's length (bench/churn.py; default 1800 s, or 0 = none with
`--only`), `--tiny` shrinks every load to a few PVs (for bench/test_run_all_smoke.py), `--out DIR`
writes the results elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import churn, cli_monitor, client_cpu, failover, gateway
from .harness import Scenario, run
from .report import coniql_table, markdown_table, plots, workers_table
from .scenario import RESULTS, scenarios

GROUPS = {
    "coniql": ["ca-1x1000", "ca-1x2000", "pva-1x1000", "pva-1x2000"],
    "workers": ["fanout-20x1000-w1", "fanout-20x1000-w2", "ca-8x250-w1", "ca-8x250-w2"],
}


class Extra:
    """A comparison that is not a load scenario: how to measure it (window s, tiny) and its
    Markdown table."""

    def __init__(
        self,
        title: str,
        measure: Callable[[float, bool], dict[str, Any]],
        table: Callable[[dict[str, Any]], str],
    ) -> None:
        self.title, self.measure, self.table = title, measure, table


EXTRAS = {
    "failover": Extra(
        "Failover (bench/failover.py): time to a snapshot and updates missed",
        lambda d, tiny: failover.measure(trials=1 if tiny else 3),
        failover.table,
    ),
    "gateway": Extra(
        "What p4p's gateway adds (bench/gateway.py)",
        lambda d, tiny: gateway.measure(pvs=10 if tiny else 500, duration=d),
        gateway.table,
    ),
    "client-cpu": Extra(
        "Python client CPU: monitor vs monitor_batches (bench/client_cpu.py)",
        lambda d, tiny: client_cpu.measure(20 if tiny else 1000, 2.0 if tiny else 5.0, d),
        client_cpu.table,
    ),
    "cli-monitor": Extra(
        "Command line: pvwire monitor (bench/cli_monitor.py)",
        lambda d, tiny: cli_monitor.measure(20 if tiny else 1000, 2.0 if tiny else 5.0, d),
        cli_monitor.table,
    ),
}


def shrink(sc: Scenario) -> Scenario:
    """A scenario at a few PVs and clients, same shape (--tiny)."""
    pvs = 1 if sc.waveform else min(sc.pvs, 10)
    per = min(sc.per_client, 5) if sc.per_client else 0
    return replace(sc, pvs=pvs, per_client=per, clients=min(sc.clients, 2), warmup=1.0)


def expand(only: str | None) -> tuple[list[str], list[str]]:
    """The scenario names and extra names `--only` selects (everything without it)."""
    named = scenarios()
    if not only:
        return list(named), list(EXTRAS)
    picked: list[str] = []
    for name in only.split(","):
        picked += GROUPS.get(name, [name])
    unknown = [n for n in picked if n not in named and n not in EXTRAS]
    if unknown:
        known = [*named, *GROUPS, *EXTRAS]
        raise SystemExit(f"unknown name(s) {unknown}; known: {', '.join(known)}")
    return [n for n in picked if n in named], [n for n in picked if n in EXTRAS]


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "server"], capture_output=True, text=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()  # fmt: skip
        if dirty:
            commit += " + uncommitted server changes"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{now}; {os.cpu_count()} cores (`nproc`), {model}; Python {platform.python_version()}; "
        f"commit {commit}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--only", help="comma-separated scenario, group or extra names")
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--no-micro", action="store_true")
    p.add_argument("--churn", type=float, help="churn soak seconds; 0 skips (default 1800)")
    p.add_argument("--tiny", action="store_true", help="a few PVs per load (smoke test)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    a = p.parse_args(argv)
    named = scenarios()
    names, extras = expand(a.only)
    out_dir: Path = a.out
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    load_start = os.getloadavg()
    results = []
    for name in names:
        sc = replace(named[name], duration=a.duration)
        if a.tiny:
            sc = shrink(sc)
        try:
            results.append(run(sc))
        except Exception as exc:
            traceback.print_exc()
            results.append({"scenario": name, "failed": f"{type(exc).__name__}: {exc}"[:200]})
    extra_results: dict[str, Any] = {}
    for name in extras:
        print(f"[{name}] running", flush=True)
        t0, load0 = time.time(), os.getloadavg()[0]
        environ = dict(os.environ)  # failover and gateway point it at their own IOC
        try:
            got = EXTRAS[name].measure(a.duration, a.tiny)
        except Exception as exc:
            traceback.print_exc()
            got = {"failed": f"{type(exc).__name__}: {exc}"[:200]}
        finally:
            os.environ.clear()
            os.environ.update(environ)
        got["loadavg_1m"] = [load0, os.getloadavg()[0]]
        got["elapsed"] = time.time() - t0
        extra_results[name] = got
    header = (
        f"Measured {machine()}; window {a.duration:g} s per scenario; load average (1 min) "
        f"{load_start[0]:.1f} at the start"
    )
    text = f"# pvwire benchmark results\n\n{header}\n\n{markdown_table(results)}\n"
    for title, table in (
        ("pvwire, Coniql 0.4.2 and the floor, same PVs, same run", coniql_table(results)),
        ("1 and 2 workers, same load (ratio = 2 workers / 1)", workers_table(results)),
    ):
        if table:
            text += f"\n## {title}\n\n{table}\n"
    for name, got in extra_results.items():
        extra = EXTRAS[name]
        load = "load average {:.1f} -> {:.1f}".format(*got["loadavg_1m"])
        body = f"FAILED: {got['failed']}" if "failed" in got else extra.table(got)
        text += f"\n## {extra.title}\n\n{body}\n\n({load}, {got['elapsed']:.0f} s)\n"
    if not a.no_micro:
        micro = run_micro()
        if micro:
            text += f"\n## Micro-benchmarks (pytest-benchmark)\n\n```\n{micro}\n```\n"
    doc: dict[str, Any] = {
        "machine": header,
        "scenarios": results,
        "extras": extra_results,
        "loadavg_1m_end": os.getloadavg()[0],
    }
    (out_dir / "latest.md").write_text(text)
    (out_dir / "latest.json").write_text(json.dumps(doc, indent=1, default=str))
    made = plots(results, out_dir) if results else []
    churn_s = a.churn if a.churn is not None else (0.0 if a.only else 1800.0)
    if churn_s > 0:
        churn_res = asyncio.run(churn.soak(churn_s, workers=8, sample_every=1.0))
        (out_dir / "churn.json").write_text(json.dumps(churn_res, indent=1))
        made.append(churn.plot(churn_res, out_dir / "churn.png"))
        text += f"\n## Connection churn\n\n{churn.summary(churn_res)}\n"
        (out_dir / "latest.md").write_text(text)
    print(text)
    print(f"wrote {out_dir / 'latest.md'}, {', '.join(map(str, made))} in "
          f"{time.time() - started:.0f} s")  # fmt: skip


def run_micro() -> str:
    """The pytest-benchmark micro-benchmarks (bench/test_micro.py), summary table only."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--benchmark-only",
         "--benchmark-columns=min,median,mean,ops", "--benchmark-sort=name",
         str(Path(__file__).parent / "test_micro.py")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    keep = [ln for ln in lines if ln.startswith(("Name", "test_", "---", "==="))]
    return "\n".join(keep[:-1] if keep and "passed" in keep[-1] else keep)


if __name__ == "__main__":
    main()
