"""Failover time and missed updates: `python -m bench.failover [--trials N]`.

Three replicas behind HAProxy (tests/replicas.py), six Python clients following the test IOC's
10 Hz counter plus sim load; per trial the busiest replica is killed (SIGKILL) or stopped
(SIGTERM, close 1012). Prints, per kind, the time from the kill to each moved client's fresh
snapshot and the counter steps it missed, as a Markdown row; the counter's period (100 ms) is the
unit to compare the missed counts with.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from pathlib import Path
from typing import Any

from pvwire.loopback import apply_loopback_env
from pvwire_dev.ioc import IocProcess

from tests.replicas import Haproxy, start_replicas
from tests.server_process import ServerProcess
from tests.test_failover import fail_over

DB = Path(__file__).resolve().parent.parent / "tests" / "dbs" / "test.db"
TARGET_S = 5.0  # the target: a moved client has its snapshot from another replica within 5 s


async def trial(kind: str) -> dict[str, Any]:
    got: dict[str, Any] = {}
    replicas = start_replicas(3)
    proxy = Haproxy([r.port for r in replicas])
    try:
        proxy.start()
        stop = ServerProcess.kill if kind == "sigkill" else ServerProcess.stop
        moved = await fail_over(replicas, stop, proxy.url, got.__setitem__, kind)
        got["times"] = [f.resumed_at - f.lost_at for f in moved if f.resumed_at and f.lost_at]
    finally:
        proxy.stop()
        for r in replicas:
            r.stop()
    return got


def measure(trials: int = 3) -> dict[str, Any]:
    """`trials` failovers of each kind against one IOC; per kind the figures of the table."""
    apply_loopback_env()
    ioc = IocProcess([DB])
    os.environ.update(ioc.ports.client_env())
    ioc.start()
    out: dict[str, Any] = {"trials": trials, "target_s": TARGET_S, "counter_hz": 10.0}
    try:
        for kind in ("sigkill", "sigterm"):
            runs = [asyncio.run(trial(kind)) for _ in range(trials)]
            missed = [m for r in runs for m in r[f"failover_{kind}_missed_updates"]]
            resume = statistics.median(r[f"failover_{kind}_resume_s_median"] for r in runs)
            out[kind] = {
                "clients_moved": sum(r[f"failover_{kind}_clients_moved"] for r in runs),
                "stop_to_snapshot_s_median": resume,
                "stop_to_snapshot_s_max": max(r[f"failover_{kind}_resume_s_max"] for r in runs),
                "loss_to_snapshot_s_median": statistics.median(t for r in runs for t in r["times"]),
                "missed_median": statistics.median(missed),
                "missed_max": max(missed),
                # Missed steps against the steps the counter made while the client was away: 1 is
                # "lost only the outage" (a snapshot replays nothing), more is extra loss.
                "missed_per_outage_step": statistics.median(missed) / (resume * 10.0),
                "snapshot_over_target": resume / TARGET_S,
            }
    finally:
        ioc.stop()
    return out


def table(res: dict[str, Any]) -> str:
    rows = [
        f"{res['trials']} trial(s) per kind; 6 clients on a 10 Hz counter, the busiest of 3 "
        "replicas stopped",
        "",
        "| stop | clients moved | stop to snapshot, median / max (s) | x the 5 s target "
        "| loss seen to snapshot, median (s) | missed updates, median / max "
        "| missed / steps while away |",
        "|---|---:|---|---:|---:|---|---:|",
    ]
    for kind in ("sigkill", "sigterm"):
        r = res[kind]
        rows.append(
            f"| {kind} | {r['clients_moved']} | {r['stop_to_snapshot_s_median']:.2f} / "
            f"{r['stop_to_snapshot_s_max']:.2f} | {r['snapshot_over_target']:.2f} | "
            f"{r['loss_to_snapshot_s_median']:.2f} | {r['missed_median']:g} / "
            f"{r['missed_max']} | {r['missed_per_outage_step']:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args()
    print(table(measure(args.trials)))


if __name__ == "__main__":
    main()
