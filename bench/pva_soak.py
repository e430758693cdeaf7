"""PVA monitor soak: memory and file descriptors of the PVA backend while monitors churn.

    .venv/bin/python -m bench.pva_soak --duration 240
    .venv/bin/python -m bench.pva_soak --pvs 2000 --churn 500 --duration 600

One IOC with `--pvs` counters at 10 Hz (bench/harness.py's database). This process monitors
every counter through pvwire's PvaBackend for the whole run, and every second opens `--churn`
more monitors on them and closes them half a second later, so subscriptions of the compiled
module (server/pvwire/upstream/_pvaingest.cpp) are made and ended all the time while updates
flow. RSS and open file descriptors are sampled every `--every` seconds after a full garbage
collection; over the run's second half both should stay flat. Writes bench/results/pva_soak.json
(unless `--out -`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import write_db

RESULTS = Path(__file__).parent / "results" / "pva_soak.json"


class CountingSink:
    updates = 0

    def on_update(self, *_: Any) -> None:
        CountingSink.updates += 1

    def on_meta(self, meta: Any) -> None:
        pass

    def on_connection(self, state: Any, reason: str = "") -> None:
        pass


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def soak(names: list[str], churn: int, duration: float, every: float) -> dict[str, Any]:
    from pvwire.upstream.pva import PvaBackend

    backend = PvaBackend()
    steady = [backend.monitor(n, CountingSink()) for n in names]
    samples: list[dict[str, float]] = []
    cycles = 0
    try:
        await asyncio.sleep(min(5.0, duration))  # connected, first values in
        t0 = time.monotonic()
        next_sample = 0.0
        while (elapsed := time.monotonic() - t0) < duration:
            if elapsed >= next_sample:
                gc.collect()
                sample = {"t": round(elapsed, 1), "rss_mb": round(rss_mb(), 2),
                          "fds": open_fds(), "updates": CountingSink.updates}  # fmt: skip
                samples.append(sample)
                print(f"{elapsed:7.1f} s  rss {sample['rss_mb']:7.1f} MB  fds {sample['fds']:4}"
                      f"  updates {sample['updates']:,}", flush=True)  # fmt: skip
                next_sample += every
            batch = [
                backend.monitor(names[(cycles * churn + j) % len(names)], CountingSink())
                for j in range(churn)
            ]
            await asyncio.sleep(0.5)
            for m in batch:
                m.close()
            await asyncio.sleep(0.5)
            cycles += 1
    finally:
        for m in steady:
            m.close()
        await backend.close()
    first, last = samples[0], samples[-1]
    # A leak grows steadily; the allocator's pools and pvxs's queues grow in steps (a loop held up
    # on a busy machine lets each subscription queue up to 16 updates) and then stay: growth is
    # counted over the second half of the run.
    settled = next((s for s in samples if s["t"] >= duration / 2), first)
    return {
        "pvs": len(names),
        "churn_per_s": churn,
        "duration_s": duration,
        "monitors_opened_and_closed": cycles * churn,
        "updates": last["updates"],
        "rss_first_half_mb": round(settled["rss_mb"] - first["rss_mb"], 2),
        "rss_growth_mb": round(last["rss_mb"] - settled["rss_mb"], 2),
        "rss_growth_from_s": settled["t"],
        "fd_growth": last["fds"] - first["fds"],
        "samples": samples,
        "loadavg_1m": os.getloadavg()[0],
    }


def run(pvs: int, churn: int, duration: float, every: float) -> dict[str, Any]:
    """The soak against a fresh IOC of `pvs` counters (EPICS_PVA_* pointed at it)."""
    from pvwire_dev.ioc import IocProcess

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "soak.db"
        names = write_db(db, pvs, False)
        ioc = IocProcess([db])
        ioc.start(timeout=60)
        saved = {k: os.environ.get(k) for k in ioc.ports.client_env()}
        os.environ.update(ioc.ports.client_env())  # pvxs reads them when the backend starts
        try:
            return asyncio.run(soak(names, churn, duration, every))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            ioc.stop()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pva_soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--pvs", type=int, default=1000)
    p.add_argument("--churn", type=int, default=200, help="monitors opened and closed per second")
    p.add_argument("--duration", type=float, default=240.0)
    p.add_argument("--every", type=float, default=15.0, help="seconds between samples")
    p.add_argument("--out", default=str(RESULTS), help="JSON file, or - for none")
    a = p.parse_args()
    from pvwire.loopback import apply_loopback_env

    apply_loopback_env()
    result = run(a.pvs, a.churn, a.duration, a.every)
    print(f"{result['monitors_opened_and_closed']:,} monitors opened and closed, "
          f"{result['updates']:,} updates: RSS {result['rss_first_half_mb']:+.1f} MB in the "
          f"first half, {result['rss_growth_mb']:+.1f} MB in the second; "
          f"fds {result['fd_growth']:+d}")  # fmt: skip
    if a.out != "-":
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
