"""What recording recent history costs a loaded server (core/history/), side by side: the same
load scenario (bench/harness.py) with the server's default history budget and with
`--history-mb 0`, interleaved (on, off, on, off, ...), so both sides see the same machine.

Per side: server CPU per delivered update (µs) of each run, its median, best and spread (max -
min, in µs and in % of the median), and the same for the event loop's thread alone (where
recording runs; libca's receive thread is most of the rest for CA); then what recording adds,
median on - median off, in µs and in % of the off figure, and on the loop's thread. The
difference means something only where it is larger than the spreads. Each run also reads the
server's /metrics: the channels recorded (all of them in an "on" run, none in an "off" one) and
the channels refused a history.

    .venv/bin/python -m bench.history_cost sim-1x2000 [--rounds 3] [--duration 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from typing import Any

from .harness import Scenario, run

# Sizes within the default budget (128 MiB, 2,782 channels of 48,240 B), so that every channel
# of an "on" run records: 2,000 sim counters (no IOC: the server's own work only) and 1,000 CA
# counters of a real IOC. Neither floor nor Coniql: the comparison is the server with itself.
SCENARIOS = {
    "sim-1x2000": Scenario("sim-1x2000", source="sim", pvs=2000, floor=False),
    "ca-1x1000": Scenario("ca-1x1000", source="ca", pvs=1000, floor=False),
}
OFF = ["--history-mb", "0"]


def scenario(name: str, quick: bool = False) -> Scenario:
    """The named scenario; with `quick`, the same at 10 PVs and a 2 s window."""
    sc = SCENARIOS[name]
    return replace(sc, pvs=min(sc.pvs, 10), warmup=1.0, duration=2.0) if quick else sc


def recorded(r: dict[str, Any]) -> float:
    """Channels with a history whose channel is monitored, as the run's /metrics said."""
    return float(r["history"].get("history_channels.monitored.true", -1))


def _side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    us = [r["server_us_per_update"] for r in runs]
    med = statistics.median(us)
    loop = [r["server_loop_us_per_update"] for r in runs]
    return {
        "us_per_update": us,
        "us_median": round(med, 3),
        "us_best": round(min(us), 3),
        "spread_us": round(max(us) - min(us), 3),
        "spread_pct": round(100.0 * (max(us) - min(us)) / med, 1) if med else 0.0,
        "loop_us_per_update": loop,
        "loop_us_median": round(statistics.median(loop), 3),
        "loop_spread_us": round(max(loop) - min(loop), 3),
        "server_cpu_median": round(statistics.median(r["server_cpu"] for r in runs), 2),
        "delivered_per_s_median": round(statistics.median(r["delivered_per_s"] for r in runs)),
        "missing": sum(r["missing"] for r in runs),
        "conflated": sum(r["conflated"] for r in runs),
        "history_channels_min": min(recorded(r) for r in runs),
        "history_channels_max": max(recorded(r) for r in runs),
        "history_refused_max": max(r["history"].get("history_refused_total", -1) for r in runs),
        "history_bytes_max": max(r["history"].get("history_bytes", -1) for r in runs),
    }


def measure(sc: Scenario, rounds: int, verbose: bool = True) -> dict[str, Any]:
    """`rounds` runs of `sc` with history on and as many with it off, interleaved."""
    on: list[dict[str, Any]] = []
    off: list[dict[str, Any]] = []
    for k in range(rounds):
        on.append(run(replace(sc, name=f"{sc.name}-history-on-{k + 1}"), verbose))
        args = [*sc.extra_args, *OFF]
        name = f"{sc.name}-history-off-{k + 1}"
        off.append(run(replace(sc, name=name, extra_args=args), verbose))
    a, b = _side(on), _side(off)
    added = a["us_median"] - b["us_median"]
    out: dict[str, Any] = {
        "scenario": sc.name,
        "describe": sc.describe(),
        "pvs": sc.pvs,
        "rounds": rounds,
        "on": a,
        "off": b,
        "added_us_median": round(added, 3),
        "added_pct_median": round(100.0 * added / b["us_median"], 1) if b["us_median"] else 0.0,
        "added_us_best": round(a["us_best"] - b["us_best"], 3),
        # The same on the event loop's thread, where recording runs (libca's threads excluded).
        "added_loop_us_median": round(a["loop_us_median"] - b["loop_us_median"], 3),
        # Above 1: the difference is larger than the wider of the two sides' spreads.
        "added_over_spread": round(abs(added) / max(a["spread_us"], b["spread_us"], 1e-9), 2),
        "loadavg_1m": [round(r["loadavg_1m"], 2) for p in zip(on, off, strict=True) for r in p],
    }
    if verbose:
        print(
            f"{sc.name}, {rounds} interleaved rounds: server CPU per delivered update "
            f"on {a['us_median']:.3f} µs (spread {a['spread_us']:.3f}), "
            f"off {b['us_median']:.3f} µs (spread {b['spread_us']:.3f}); "
            f"recording adds {added:+.3f} µs ({out['added_pct_median']:+.1f} %); "
            f"event loop's thread on {a['loop_us_median']:.3f} µs, off {b['loop_us_median']:.3f}"
            f" µs: {out['added_loop_us_median']:+.3f} µs",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=list(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=3, help="runs per side (default 3)")
    parser.add_argument("--duration", type=float, help="measured window, s (default 15)")
    parser.add_argument("--quick", action="store_true", help="10 PVs, 2 s windows")
    args = parser.parse_args()
    sc = scenario(args.name, args.quick)
    if args.duration:
        sc = replace(sc, duration=args.duration)
    print(json.dumps(measure(sc, args.rounds), indent=1))


if __name__ == "__main__":
    main()
