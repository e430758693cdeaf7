"""Before and after in one session: control-room scenarios against two server trees, alternating.

    .venv/bin/python -m bench.control_compare --base /tmp/base/server control-stream-200 ...

`--base` is a copy of another revision's `server/` directory (with its compiled modules), e.g.
`git worktree add /tmp/base main && cp server/pvwire/*/*.so ...`. Each scenario runs on the base,
then on this tree, one after the other, so both see the same load on the machine; the results go
to bench/results/control-compare.json (what `python -m bench.control_plot` draws) and a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import control

RESULTS = Path(__file__).parent / "results"
OUT = RESULTS / "control-compare.json"


def row(label: str, r: dict[str, Any]) -> str:
    def f(key: str, fmt: str) -> str:
        v = r.get(key)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    return (
        f"| {r['scenario']} | {label} | {f('delivered_per_s', '{:,.0f}')} | "
        f"{f('server_cpu', '{:.0f}')} | {f('server_us_per_update', '{:.2f}')} | "
        f"{f('lat_p50_ms', '{:.0f}')} | {f('lat_p99_ms', '{:.0f}')} | "
        f"{f('open_p50_ms', '{:.0f}')} | {f('open_p99_ms', '{:.0f}')} | "
        f"{f('initial_open_p99_ms', '{:.0f}')} | {f('initial_open_max_ms', '{:.0f}')} | "
        f"{f('rss_per_client_kb', '{:.0f}')} | {f('missing_share', '{:.1%}')} | "
        f"{f('loadavg_1m', '{:.1f}')} |"
    )


HEAD = (
    "| scenario | server | delivered/s | server CPU % | µs/update | p50 ms | p99 ms | "
    "open p50 ms | open p99 ms | first open p99 ms | last ms | RSS/client kB | missing | load |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("names", nargs="+", help="control-* scenarios (python -m bench.scenario)")
    p.add_argument("--base", required=True, help="the other revision's server/ directory")
    p.add_argument("--after", default="", help="a copy of this tree's server/ to run instead "
                   "(the tree may change while a long comparison runs)")  # fmt: skip
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--append", action="store_true", help="add to the saved results")
    p.add_argument("--out", type=Path, default=OUT, help=f"results file (default {OUT.name})")
    a = p.parse_args()
    out = RESULTS / a.out.name if a.out.parent == Path() else a.out
    rooms = control.scenarios()
    base = os.path.abspath(a.base)
    saved: list[dict[str, Any]] = []
    if a.append and out.exists():
        saved = json.loads(out.read_text())
    for name in a.names:
        sc = replace(rooms[name], duration=a.duration)
        after = os.path.abspath(a.after) if a.after else ""
        for label, tree in (("before", base), ("after", after)):
            try:
                r = control.run(sc, server_tree=tree)
            except Exception as exc:  # a failed run is a row that says so
                r = {"scenario": name, "failed": f"{type(exc).__name__}: {exc}"}
            r["side"] = label
            saved.append(r)
            RESULTS.mkdir(exist_ok=True)
            out.write_text(json.dumps(saved, indent=1, default=str))
            print(HEAD)
            print(row(label, r) if "failed" not in r else f"| {name} | {label} | {r['failed']} |")
    print(HEAD)
    for r in saved:
        if "failed" not in r:
            print(row(r["side"], r))


if __name__ == "__main__":
    main()
