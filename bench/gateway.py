"""What p4p's gateway (pvagw) adds: `python -m bench.gateway [--pvs N] [--duration S]`.

One IOC with N counters at 10 Hz, one pvwire server reading them over PVA, one Python client
streaming all of them; once straight from the IOC, once through pvagw (tests/pva_gateway.py).
Latency is the client's arrival time minus the record's timestamp (one host, one clock); CPU is
per process over the window. Prints a Markdown table with the gateway/direct ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from pvwire.loopback import apply_loopback_env
from pvwire_client import Client
from pvwire_client.state import CONNECTED
from pvwire_dev.ioc import IocProcess

from tests.pva_gateway import PvaGateway
from tests.server_process import ServerProcess

from .harness import write_db


async def measure_chain(
    url: str, ids: list[str], pids: dict[str, int], duration: float
) -> dict[str, Any]:
    lat: list[float] = []
    seen: set[str] = set()
    ready = asyncio.Event()
    procs = {k: psutil.Process(p) for k, p in pids.items()}

    async def follow() -> None:
        async with Client(url) as client:
            async for u in client.monitor(ids):
                ch = u.channel
                if ch.state != CONNECTED or ch.seconds is None or ch.nanoseconds is None:
                    continue
                if ready.is_set():
                    lat.append(time.time() - ch.seconds - ch.nanoseconds * 1e-9)
                else:
                    seen.add(ch.id)
                    if len(seen) == len(ids):
                        ready.set()

    task = asyncio.create_task(follow())
    await asyncio.wait_for(ready.wait(), 120)
    await asyncio.sleep(2)  # warm-up
    lat.clear()
    cpu0 = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
    t0 = time.monotonic()
    await asyncio.sleep(duration)
    wall = time.monotonic() - t0
    cpu = {k: 100 * (sum(p.cpu_times()[:2]) - cpu0[k]) / wall for k, p in procs.items()}
    n = len(lat)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # the client closes its connections before the loop ends
    lat.sort()
    return {
        "updates_per_s": n / wall,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[int(0.99 * (n - 1))],
        **{f"{k}_cpu": v for k, v in cpu.items()},
    }


def run(via_gateway: bool, ioc: IocProcess, ids: list[str], duration: float) -> dict[str, Any]:
    gateway = PvaGateway(ioc.ports) if via_gateway else None
    env = (gateway.ports if gateway else ioc.ports).client_env()
    server = ServerProcess("--log-level", "warning", env=env)
    try:
        if gateway:
            gateway.start()
        server.start()
        pids = {"server": server.pid or 0, "ioc": ioc.pid() or 0}
        if gateway:
            pids["gateway"] = gateway.pid or 0
        return asyncio.run(measure_chain(server.url, ids, pids, duration))
    finally:
        server.stop()
        if gateway:
            gateway.stop()


KEYS = ("updates_per_s", "p50_ms", "p99_ms", "server_cpu", "ioc_cpu")


def measure(pvs: int = 500, duration: float = 15.0) -> dict[str, Any]:
    """The same chain straight from the IOC and through pvagw, one after the other."""
    apply_loopback_env()
    with tempfile.TemporaryDirectory(prefix="pvwire-bench-") as tmp:
        names = write_db(Path(tmp) / "gw.db", pvs, waveform=False)
        ioc = IocProcess([Path(tmp) / "gw.db"])
        os.environ.update(ioc.ports.client_env())
        ioc.start()
        try:
            direct = run(False, ioc, [f"pva://{n}" for n in names], duration)
            gw = run(True, ioc, [f"pva://{n}" for n in names], duration)
        finally:
            ioc.stop()
    ratios = {k: gw[k] / direct[k] if direct[k] else math.nan for k in KEYS}
    return {"pvs": pvs, "duration": duration, "direct": direct, "gateway": gw, "ratio": ratios}


def table(res: dict[str, Any]) -> str:
    direct, gw = res["direct"], res["gateway"]
    rows = [
        f"PVA, {res['pvs']} counters at 10 Hz, one client, {res['duration']:g} s window",
        "",
        "| | direct | via pvagw | ratio |",
        "|---|---:|---:|---:|",
    ]
    rows += [f"| {k} | {direct[k]:.1f} | {gw[k]:.1f} | {res['ratio'][k]:.2f} |" for k in KEYS]
    rows.append(f"| gateway_cpu | - | {gw['gateway_cpu']:.1f} | - |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__)
    p.add_argument("--pvs", type=int, default=500)
    p.add_argument("--duration", type=float, default=15.0)
    args = p.parse_args()
    print(table(measure(args.pvs, args.duration)))


if __name__ == "__main__":
    main()
