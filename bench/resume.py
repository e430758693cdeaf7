"""Time to resume after a server outage: `python -m bench.resume [--outages 10,30] [--trials 3]`.

One server (sim channels only), one Python client (`Client.monitor`) and one TypeScript client
(`clients/ts/bench/resume_follow.mjs`, run by Node on the built `dist/`) follow
`sim://counter?rate=10`. Per trial: SIGKILL the server, keep it down for the outage, start it
again on the same port, then measure from the moment it answers `/healthz` to each client's first
connected value. Each trial uses fresh clients, so every outage starts from attempt 0 of the
backoff. `--ts-dist DIR` runs another build of the TypeScript client (e.g. an older one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from pvwire.loopback import apply_loopback_env
from pvwire_client import Client

from tests.server_process import ServerProcess

CHANNEL = "sim://counter?rate=10"
TS = Path(__file__).resolve().parents[1] / "clients" / "ts"
BOUND = 120.0  # seconds: a client not back by then counts as failed


class NodeFollower:
    """The TypeScript client in a Node process; keeps the times of its connected values."""

    def __init__(self, url: str, dist: str | None) -> None:
        cmd = ["node", str(TS / "bench" / "resume_follow.mjs"), url, CHANNEL]
        self.proc = subprocess.Popen(
            [*cmd, *([dist] if dist else [])], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.values: list[float] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:  # closed by its only reader, at the end
            for line in self.proc.stdout:
                ev = json.loads(line)
                if ev["ev"] == "value":
                    self.values.append(ev["t"] / 1000)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


async def first_after(values: list[float], mark: float) -> float:
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        later = [t for t in values if t > mark]
        if later:
            return later[0] - mark
        await asyncio.sleep(0.02)
    return float("nan")


async def trial(server: ServerProcess, outage: float, dist: str | None) -> dict[str, float]:
    py_values: list[float] = []

    async with Client(server.url) as client:

        async def follow() -> None:
            async for u in client.monitor(CHANNEL):
                if u.channel.connected and u.channel.value is not None:
                    py_values.append(time.time())

        task = asyncio.create_task(follow())
        node = NodeFollower(server.url, dist)
        try:
            now = time.time()
            await first_after(py_values, now - 60)
            await first_after(node.values, now - 60)
            server.kill()
            await asyncio.sleep(outage)
            await asyncio.to_thread(server.start)  # returns once /healthz answers
            up = time.time()
            py, ts = await asyncio.gather(first_after(py_values, up), first_after(node.values, up))
        finally:
            node.close()
            task.cancel()
    return {"python": py, "ts": ts}


async def run(outages: list[float], trials: int, dist: str | None) -> dict[str, Any]:
    """`trials` outages of each length; per outage and client, seconds from the server being
    up again to the first connected value (median, max and each trial), printed as a table."""
    server = ServerProcess("--log-level", "warning")
    server.start()
    out: dict[str, Any] = {}
    try:
        print(f"load average at start: {os.getloadavg()}")
        print("| outage | client | trials | up to first value: median / max (s) |")
        print("|---:|---|---:|---|")
        for outage in outages:
            got = [await trial(server, outage, dist) for _ in range(trials)]
            for who in ("python", "ts"):
                xs = [g[who] for g in got]
                out[f"outage_{outage:g}s.{who}"] = {
                    "back_s_median": statistics.median(xs), "back_s_max": max(xs), "trials": xs,
                }  # fmt: skip
                print(
                    f"| {outage:.0f} s | {who} | {trials} | {statistics.median(xs):.2f} / "
                    f"{max(xs):.2f} ({', '.join(f'{x:.2f}' for x in xs)}) |",
                    flush=True,
                )
        print(f"load average at end: {os.getloadavg()}")
    finally:
        server.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.resume", description=__doc__)
    p.add_argument("--outages", default="10,30", help="seconds down, comma-separated")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--ts-dist", default=None, help="the TypeScript client's built dist/")
    args = p.parse_args()
    apply_loopback_env()
    outages = [float(x) for x in args.outages.split(",")]
    asyncio.run(run(outages, args.trials, args.ts_dist))


if __name__ == "__main__":
    main()
