"""Python client CPU: ``Client.monitor`` and ``Client.monitor_batches`` side by side, one run.

`python -m bench.client_cpu [--channels 1000] [--duration 15] [--save]` starts the real server
(sim counters, 10 Hz each: 10,000 updates/s for 1,000) and three client processes at once, each
watching every channel: ``monitor`` (an Update per entry), ``monitor_batches`` (a Batch per frame)
and a floor (the raw WebSocket with ``msgpack.unpackb`` and nothing else: what any Python
reader of the stream pays). Each reports its own CPU (process CPU time / wall time over the same
window, % of one core), updates received and conflated; the table gives each API's CPU per
update as a ratio to the floor's, since this machine's speed changes from day to day.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from .harness import _bench_env
from .scenario import RESULTS

APIS = ("floor", "monitor", "batches")


class Window:
    """The measured window: opens ``warmup`` seconds after the first update (however long the
    start took on a loaded machine), closes ``duration`` seconds later."""

    def __init__(self, warmup: float, duration: float) -> None:
        self.warmup = warmup
        self.opens: float | None = None
        self.duration = duration
        self.start: tuple[float, float, int] | None = None  # wall, CPU, updates at opening

    def over(self, received: int) -> bool:
        now = time.monotonic()
        if self.opens is None:
            if received:
                self.opens = now + self.warmup
            return False
        if self.start is None:
            if now >= self.opens:
                self.start = (now, time.process_time(), received)
            return False
        return now >= self.start[0] + self.duration

    def result(self, received: int) -> dict[str, float]:
        assert self.start is not None
        t0, cpu0, n0 = self.start
        wall, cpu, n = time.monotonic() - t0, time.process_time() - cpu0, received - n0
        return {
            "updates": n,
            "updates_per_s": n / wall,
            "cpu_pct": 100 * cpu / wall,
            "us_per_update": 1e6 * cpu / max(n, 1),
        }


async def _floor(url: str, ids: list[str], w: Window) -> tuple[int, int]:
    import msgpack
    from pvwire_client import Client
    from pvwire_client.graphql import M_SUBSCRIBE
    from websockets.asyncio.client import connect
    from websockets.typing import Subprotocol

    async with Client(url) as c:
        reg = (await c._graphql(M_SUBSCRIBE, {"ids": ids, "options": {}}))["subscribe"]
    received = 0
    ws_url = "ws" + url.removeprefix("http") + reg["streamPath"]
    async with connect(ws_url, subprotocols=[Subprotocol("pvwire.v1")], max_size=2**28) as ws:
        await ws.send(msgpack.packb([16, 1, reg["token"]]))
        async for frame in ws:
            msg = msgpack.unpackb(frame)
            if msg[0] == 3:  # DATA
                received += sum(len(g[1]) for g in msg[2])
            if w.over(received):
                return received, 0
    raise RuntimeError("the stream closed")


async def _monitor(url: str, ids: list[str], w: Window) -> tuple[int, int]:
    from pvwire_client import Client

    received, conflated = 0, dict.fromkeys(ids, 0)
    async with Client(url, queue_size=4096) as c:
        async for u in c.monitor(ids):
            received += 1
            conflated[u.channel.id] = u.channel.conflated
            if w.over(received):
                return received, sum(conflated.values())
    raise RuntimeError("the monitor ended")


async def _batches(url: str, ids: list[str], w: Window) -> tuple[int, int]:
    from pvwire_client import Client

    received = 0
    async with Client(url, queue_size=4096) as c:
        async for b in c.monitor_batches(ids):
            received += len(b)
            if w.over(received):
                return received, sum(s.conflated for s in b.states)
    raise RuntimeError("the monitor ended")


def child(api: str, url: str, channels: int, warmup: float, duration: float) -> None:
    ids = [f"sim://counter/cpu{i}" for i in range(channels)]
    w = Window(warmup, duration)
    run = {"floor": _floor, "monitor": _monitor, "batches": _batches}[api]
    received, conflated = asyncio.run(run(url, ids, w))
    print(json.dumps({"api": api, **w.result(received), "conflated": conflated}), flush=True)


def measure(channels: int = 1000, warmup: float = 5.0, duration: float = 15.0) -> dict[str, Any]:
    """One run: the server, then the three clients at once; their results by API."""
    from tests.server_process import ServerProcess

    env = _bench_env()
    with ServerProcess("--log-level", "warning", env=env) as server:
        procs = {
            api: subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.client_cpu",
                    "--child",
                    api,
                    "--url",
                    server.url,
                    "--channels",
                    str(channels),
                    "--warmup",
                    str(warmup),
                    "--duration",
                    str(duration),
                ],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for api in APIS
        }
        out: dict[str, Any] = {"channels": channels, "expected_per_s": 10.0 * channels}
        for api, p in procs.items():
            stdout, _ = p.communicate(timeout=warmup + duration + 120)
            if p.returncode != 0:
                raise RuntimeError(f"{api} client exited with {p.returncode}")
            out[api] = json.loads(stdout.strip().splitlines()[-1])
    floor = out["floor"]["us_per_update"]
    for api in ("monitor", "batches"):
        out[api]["ratio_to_floor"] = out[api]["us_per_update"] / floor
    return out


def table(res: dict[str, Any]) -> str:
    rows = [
        f"{res['channels']} sim counters x 10 Hz ({res['expected_per_s']:,.0f} updates/s expected)",
        "",
        "| client | updates/s | CPU % of a core | µs/update | x floor | conflated |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for api in APIS:
        r = res[api]
        ratio = f"{r['ratio_to_floor']:.2f}" if "ratio_to_floor" in r else "1"
        rows.append(
            f"| {api} | {r['updates_per_s']:,.0f} | {r['cpu_pct']:.1f} | "
            f"{r['us_per_update']:.2f} | {ratio} | {r['conflated']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.client_cpu", description=__doc__)
    p.add_argument("--channels", type=int, default=1000)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--save", action="store_true", help="write results/client_cpu.json")
    p.add_argument("--child", choices=APIS, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a.child, a.url, a.channels, a.warmup, a.duration)
        return
    res = measure(a.channels, a.warmup, a.duration)
    print(table(res))
    if a.save:
        (RESULTS / "client_cpu.json").write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
