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
import statistics
from typing import Any

from pvwire.ioc import IocProcess
from pvwire.loopback import apply_loopback_env

from tests.replicas import Haproxy, start_replicas
from tests.server_process import ServerProcess
from tests.test_failover import fail_over

DB = "tests/dbs/test.db"


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


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args()
    import os
    from pathlib import Path

    apply_loopback_env()
    ioc = IocProcess([Path(DB)])
    os.environ.update(ioc.ports.client_env())
    ioc.start()
    try:
        print("| stop | trials | clients moved | kill to snapshot, median / max (s) "
              "| loss to snapshot, median (s) | missed updates, median / max |")  # fmt: skip
        print("|---|---:|---:|---|---:|---|")
        for kind in ("sigkill", "sigterm"):
            runs = [asyncio.run(trial(kind)) for _ in range(args.trials)]
            moved = sum(r[f"failover_{kind}_clients_moved"] for r in runs)
            medians = [r[f"failover_{kind}_resume_s_median"] for r in runs]
            worst = max(r[f"failover_{kind}_resume_s_max"] for r in runs)
            missed = [m for r in runs for m in r[f"failover_{kind}_missed_updates"]]
            loss = [t for r in runs for t in r["times"]]
            print(
                f"| {kind} | {len(runs)} | {moved} | {statistics.median(medians):.2f} / "
                f"{worst:.2f} | {statistics.median(loss):.2f} | "
                f"{statistics.median(missed):g} / {max(missed)} |",
                flush=True,
            )
    finally:
        ioc.stop()


if __name__ == "__main__":
    main()
