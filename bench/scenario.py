"""Run one load scenario: `python -m bench.scenario NAME [options]` (list them with `--list`).

Examples:
    .venv/bin/python -m bench.scenario ca-1x1000
    .venv/bin/python -m bench.scenario fanout-100x1000 --duration 20
    .venv/bin/python -m bench.scenario custom --source pva --pvs 300 --clients 3
    .venv/bin/python -m bench.scenario ca-1x1000 --profile   # py-spy the server (raw stacks)
    .venv/bin/python -m bench.scenario control-stream --clients 100   # bench/control.py

Prints the result as a Markdown row and JSON; `--save` also writes bench/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from . import control
from .harness import Scenario, run
from .report import markdown_table

RESULTS = Path(__file__).parent / "results"


def scenarios() -> dict[str, Scenario]:
    """Every named scenario, in the order `make bench` runs them (bench/bench_load.py)."""
    out: dict[str, Scenario] = {}
    for source in ("ca", "pva"):
        for n in (10, 50, 100, 200, 500, 1000, 2000):
            name = f"{source}-1x{n}"
            # Coniql beside pvwire and the floor where the issue compares them: 1,000 and 2,000.
            out[name] = Scenario(name, source=source, pvs=n, coniql=n >= 1000)
    out["ca-2x50"] = Scenario("ca-2x50", pvs=100, clients=2, per_client=50, shared=False)
    out["ca-10x10"] = Scenario("ca-10x10", pvs=100, clients=10, per_client=10, shared=False)
    for k in (10, 50, 100):
        name = f"fanout-{k}x1000"
        out[name] = Scenario(name, pvs=1000, clients=k, floor=False)
    # Across cores: the same load on 1 and 2 workers (`--workers`, one port). Fan-out: every
    # worker opens the same 1,000 monitors; many PVs: clients on disjoint slices of 2,000.
    # Each pair back to back, so the two runs of a ratio see the same load on the machine.
    for w in (1, 2):
        args = ["--workers", str(w)] if w > 1 else []
        name = f"fanout-20x1000-w{w}"
        out[name] = Scenario(name, pvs=1000, clients=20, floor=False, extra_args=args)
    for w in (1, 2):
        args = ["--workers", str(w)] if w > 1 else []
        name = f"ca-8x250-w{w}"
        out[name] = Scenario(
            name, pvs=2000, clients=8, per_client=250, shared=False, floor=False, extra_args=args
        )
    out["sim-1x10000"] = Scenario("sim-1x10000", source="sim", pvs=10000, floor=False)
    for source in ("ca", "pva"):
        name = f"waveform-{source}"
        out[name] = Scenario(name, source=source, pvs=1, waveform=True, floor=False)
    return out


def main(argv: list[str] | None = None) -> None:
    known = scenarios()
    p = argparse.ArgumentParser(prog="python -m bench.scenario", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("name", nargs="?", help="scenario name (see --list) or 'custom'")
    p.add_argument("--list", action="store_true", help="list the named scenarios")
    p.add_argument("--source", choices=["ca", "pva", "sim"])
    p.add_argument("--pvs", type=int, help="PVs in the IOC (or sim counters)")
    p.add_argument("--clients", type=int, help="WebSocket clients")
    p.add_argument("--per-client", type=int, help="PVs per client (default: all)")
    p.add_argument("--disjoint", action="store_true", help="clients get disjoint PV slices")
    p.add_argument("--waveform", action="store_true", help="one 1M-element float64 waveform")
    p.add_argument("--duration", type=float, help="measured window in s (default 15)")
    p.add_argument("--warmup", type=float, help="warm-up in s (default 3)")
    p.add_argument("--client-procs", type=int, help="load-client processes (default auto)")
    p.add_argument("--no-floor", action="store_true", help="skip the aioca/p4p floor")
    p.add_argument("--coniql", action=argparse.BooleanOptionalAction,
                   help="also run Coniql 0.4.2 (default: with 1,000 and 2,000 PVs)")  # fmt: skip
    p.add_argument("--profile", action="store_true", help="py-spy the server during the window")
    p.add_argument("--tick-ms", type=float, help="server tick (default: server's 20 ms)")
    p.add_argument("--save", action="store_true", help="write bench/results/NAME.json")
    p.add_argument("--churn", type=float, help="control-*: screens replaced per second")
    a = p.parse_args(argv)
    rooms = control.scenarios()
    if a.list or not a.name:
        for name, sc in known.items():
            print(f"{name:18} {sc.describe()}")
        for name, room in rooms.items():
            print(f"{name:18} {room.describe()}")
        return
    if a.name in rooms:
        run_control(rooms[a.name], a)
        return
    if a.name in known:
        sc = known[a.name]
    elif a.name == "custom":
        sc = Scenario("custom")
    else:
        sys.exit(f"unknown scenario {a.name!r}; --list shows them")
    changes = {
        "source": a.source, "pvs": a.pvs, "clients": a.clients, "per_client": a.per_client,
        "duration": a.duration, "warmup": a.warmup, "client_procs": a.client_procs,
        "tick_ms": a.tick_ms,
    }  # fmt: skip
    sc = replace(sc, **{k: v for k, v in changes.items() if v is not None})
    if a.disjoint:
        sc = replace(sc, shared=False)
    if a.waveform:
        sc = replace(sc, waveform=True, pvs=1)
    if a.no_floor:
        sc = replace(sc, floor=False)
    if a.coniql is not None:
        sc = replace(sc, coniql=a.coniql)
    if a.profile:
        sc = replace(sc, profile=True)
    res = run(sc)
    print(markdown_table([res]))
    print(json.dumps({k: v for k, v in res.items() if k != "per_client"}, indent=1, default=str))
    if a.save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{sc.name}.json").write_text(json.dumps(res, indent=1, default=str))


def run_control(sc: control.ControlScenario, a: argparse.Namespace) -> None:
    """A control-room scenario (bench/control.py), with the options that apply to it."""
    changes = {
        "source": a.source, "pvs": a.pvs, "clients": a.clients, "per_client": a.per_client,
        "duration": a.duration, "warmup": a.warmup, "client_procs": a.client_procs,
        "tick_ms": a.tick_ms, "churn_per_s": a.churn,
    }  # fmt: skip
    sc = replace(sc, **{k: v for k, v in changes.items() if v is not None})
    if a.profile:
        sc = replace(sc, profile=True)
    res = control.run(sc)
    print(json.dumps(res, indent=1, default=str))
    if a.save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{sc.name}.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
