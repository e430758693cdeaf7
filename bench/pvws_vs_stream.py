"""Server CPU of N pvws-protocol clients against the same N clients on `/stream`.

Both phases run against ONE server process, one after the other, on the same channels: M sim
counters at R Hz (no IOC, so the upstream costs the same in both), every client watching all M.
The server's CPU comes from /proc (user + system over the window); delivered updates are counted
by the clients, which run in this process.

    .venv/bin/python -m bench.pvws_vs_stream [--clients 10] [--pvs 200] [--rate 10] [--duration 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass

from pvwire_client import Client
from websockets.asyncio.client import connect

from tests.server_process import ServerProcess, server_args_for_tests

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Result:
    endpoint: str
    clients: int
    pvs: int
    cpu_percent: float
    updates_per_s: float

    @property
    def us_per_update(self) -> float:
        return 1e4 * self.cpu_percent / self.updates_per_s if self.updates_per_s else 0.0


async def _pvws_client(
    url: str, ids: list[str], counts: list[int], i: int, stop: asyncio.Event
) -> None:
    async with connect(url.replace("http://", "ws://") + "/pvws/pv", max_size=None) as ws:
        await ws.send(json.dumps({"type": "subscribe", "pvs": ids}))
        # Until cancelled: a `wait_for` per message (to look at `stop`) cost this process more
        # than the server, and a client behind makes the server merge instead of sending.
        async for text in ws:
            if '"type":"update"' in str(text):
                counts[i] += 1


async def _stream_client(
    url: str, ids: list[str], counts: list[int], i: int, stop: asyncio.Event
) -> None:
    async with Client(url) as client:
        updates = client.monitor(ids)
        async for _ in updates:
            counts[i] += 1
            if stop.is_set():
                break


async def run_phase(
    server: ServerProcess, endpoint: str, n: int, ids: list[str], warmup: float, duration: float
) -> Result:
    counts = [0] * n
    stop = asyncio.Event()
    run = _pvws_client if endpoint == "pvws" else _stream_client
    tasks = [asyncio.create_task(run(server.url, ids, counts, i, stop)) for i in range(n)]
    await asyncio.sleep(warmup)  # connect, first values; the window starts after
    pid = server.pid
    assert pid is not None
    c0, n0, t0 = cpu_seconds(pid), sum(counts), time.monotonic()
    await asyncio.sleep(duration)
    c1, n1, t1 = cpu_seconds(pid), sum(counts), time.monotonic()
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = t1 - t0
    return Result(endpoint, n, len(ids), 100 * (c1 - c0) / elapsed, (n1 - n0) / elapsed)


async def compare(
    clients: int, pvs: int, rate: float, warmup: float, duration: float
) -> list[Result]:
    ids = [f"sim://counter/b{i}?rate={rate:g}" for i in range(pvs)]
    with ServerProcess(*server_args_for_tests(["--send-budget", str(16 << 20)])) as server:
        results = []
        for endpoint in ("stream", "pvws"):
            results.append(await run_phase(server, endpoint, clients, ids, warmup, duration))
            await asyncio.sleep(1.0)  # let the first phase's connections close
        return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--pvs", type=int, default=200)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--duration", type=float, default=15.0)
    a = p.parse_args()
    results = asyncio.run(compare(a.clients, a.pvs, a.rate, a.warmup, a.duration))
    head = ("endpoint", "clients", "pvs", "server CPU %", "updates/s", "us/update")
    print("{:8} {:>7} {:>5} {:>12} {:>10} {:>9}".format(*head))
    for r in results:
        print(
            f"{r.endpoint:8} {r.clients:7d} {r.pvs:5d} {r.cpu_percent:12.2f} "
            f"{r.updates_per_s:10.0f} {r.us_per_update:9.2f}"
        )
    stream, pvws = results
    if stream.us_per_update:
        print(f"pvws / stream CPU per update: {pvws.us_per_update / stream.us_per_update:.2f}")


if __name__ == "__main__":
    main()
