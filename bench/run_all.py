"""Run every load scenario and the micro-benchmarks; write bench/results/latest.{md,json,png}.

`make bench` runs this (about 15-20 minutes). `--only a,b` runs a subset of the named scenarios,
`--duration S` changes the measured window (default 15 s), `--no-micro` skips pytest-benchmark,
`--churn S` sets the connection-churn soak's length (bench/churn.py; default 1800 s, or 0 = none
with `--only`).
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
from dataclasses import replace
from pathlib import Path

from . import churn
from .harness import run
from .report import markdown_table, plots
from .scenario import RESULTS, scenarios


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
    p = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__)
    p.add_argument("--only", help="comma-separated scenario names")
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--no-micro", action="store_true")
    p.add_argument("--churn", type=float, help="churn soak seconds; 0 skips (default 1800)")
    a = p.parse_args(argv)
    named = scenarios()
    names = a.only.split(",") if a.only else list(named)
    results = []
    started = time.time()
    for name in names:
        sc = replace(named[name], duration=a.duration)
        try:
            results.append(run(sc))
        except Exception as exc:
            traceback.print_exc()
            results.append({"scenario": name, "failed": f"{type(exc).__name__}: {exc}"[:200]})
    RESULTS.mkdir(exist_ok=True)
    header = f"Measured {machine()}; window {a.duration:g} s per scenario."
    table = markdown_table(results)
    micro = ""
    if not a.no_micro:
        micro = run_micro()
    text = f"# pvwire benchmark results\n\n{header}\n\n{table}\n"
    if micro:
        text += f"\n## Micro-benchmarks (pytest-benchmark)\n\n```\n{micro}\n```\n"
    (RESULTS / "latest.md").write_text(text)
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=1, default=str))
    made = plots(results, RESULTS)
    churn_s = a.churn if a.churn is not None else (0.0 if a.only else 1800.0)
    if churn_s > 0:
        churn_res = asyncio.run(churn.soak(churn_s, workers=8, sample_every=1.0))
        (RESULTS / "churn.json").write_text(json.dumps(churn_res, indent=1))
        made.append(churn.plot(churn_res, RESULTS / "churn.png"))
        text += f"\n## Connection churn\n\n{churn.summary(churn_res)}\n"
        (RESULTS / "latest.md").write_text(text)
    print(text)
    print(f"wrote {RESULTS / 'latest.md'}, {', '.join(map(str, made))} in "
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
