"""Draw the control-room runs: server CPU, CPU per delivery, p99 latency and screen open time
against screens, per endpoint.

    .venv/bin/python -m bench.control_plot [bench/results/control-compare.json] [OUT.png]

Reads the runs bench/control_compare.py saved (single-endpoint sweep scenarios
`control-stream-N` and `control-pvws-N`, before and after); writes bench/results/control.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

HERE = Path(__file__).parent


Point = tuple[int, float, float, float, float]


def series(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[Point]]:
    """(endpoint, side) -> [(screens, server CPU %, µs per update, p99 ms, open p99 ms)] by
    screens, of the sim sweep (one worker, screens replaced during the window)."""
    out: dict[tuple[str, str], list[Point]] = {}
    for r in runs:
        if "failed" in r or r.get("endpoint") not in ("stream", "pvws"):
            continue
        if r.get("source", "sim") != "sim" or r.get("workers", 1) != 1:
            continue
        key = (str(r["endpoint"]), str(r.get("side", "")))
        point = (
            int(r["clients"]),
            r["server_cpu"],
            r["server_us_per_update"],
            r["lat_p99_ms"],
            r["open_p99_ms"],
        )
        out.setdefault(key, []).append(point)
    return {k: sorted(v) for k, v in out.items()}


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results" / "control-compare.json"
    dst = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "results" / "control.png"
    runs = json.loads(src.read_text())
    data = series(runs)
    loads = [r["loadavg_1m"] for r in runs if r.get("loadavg_1m") is not None]
    load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "unknown"
    fig, (cpu, per, p99, opened) = plt.subplots(1, 4, figsize=(18, 4))
    styles = {"stream": "tab:blue", "pvws": "tab:orange"}
    for (endpoint, side), points in sorted(data.items()):
        xs = [p[0] for p in points]
        kw: dict[str, Any] = {
            "color": styles[endpoint],
            "linestyle": "--" if side == "before" else "-",
            "marker": "o",
            "label": f"/{'pvws/pv' if endpoint == 'pvws' else 'stream'} {side}",
        }
        cpu.plot(xs, [p[1] for p in points], **kw)
        per.plot(xs, [p[2] for p in points], **kw)
        p99.plot(xs, [p[3] for p in points], **kw)
        opened.plot(xs, [p[4] for p in points], **kw)
    cpu.set(xlabel="screens (200 of 2,000 PVs each, 10 Hz)", ylabel="server CPU % of one core")
    per.set(xlabel="screens", ylabel="server CPU µs per delivered update")
    p99.set(xlabel="screens", ylabel="latency p99 ms")
    opened.set(xlabel="screens", ylabel="screen open p99 ms (screens replaced in the window)")
    for ax in (cpu, per, p99, opened):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        "control room: each screen its own 200 of 2,000 sim PVs at 10 Hz "
        f"(2 cores with the load clients, load average {load})"
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=80)
    print(dst)


if __name__ == "__main__":
    main()
