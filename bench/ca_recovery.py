"""How fast a monitored channel sees an IOC die and come back, through the real server.

One IOC and one server on private loopback ports; a client monitors `PVW:COUNTER` (10 Hz). Each
run kills the IOC (SIGKILL), waits `outage` seconds, starts it again on the same ports, and
records:
- down: from the kill to the client seeing DISCONNECTED;
- back: from the restarted IOC being ready (iocInit done, CA port listening) to the client's first
  CONNECTED value.

    .venv/bin/python -m bench.ca_recovery [--runs 3] [--outages 0,5,15] [--scheme ca]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from pvwire.loopback import apply_loopback_env
from pvwire_client import Client
from pvwire_dev.ioc import IocProcess

from tests.server_process import ServerProcess, server_args_for_tests

DB = Path(__file__).resolve().parent.parent / "tests" / "dbs" / "test.db"
CONNECTED, DISCONNECTED = 1, 2
TIMEOUT = 120.0


async def measure(scheme: str, runs: int, outages: list[float]) -> list[tuple[float, float, float]]:
    ioc = IocProcess([DB])
    ioc.start()
    server = ServerProcess(*server_args_for_tests(), env=ioc.ports.client_env())
    server.start()
    results: list[tuple[float, float, float]] = []
    try:
        async with Client(server.url) as client:
            updates = client.monitor([f"{scheme}://PVW:COUNTER"])

            async def until_state(state: int) -> float:
                async with asyncio.timeout(TIMEOUT):
                    async for u in updates:
                        if u.channel.state == state and u.channel.value is not None:
                            return time.monotonic()
                raise RuntimeError("monitor ended")

            await until_state(CONNECTED)
            for outage in outages:
                for _ in range(runs):
                    killed = time.monotonic()
                    ioc.stop()
                    down = await until_state(DISCONNECTED) - killed
                    await asyncio.sleep(outage)
                    ioc.start()
                    ready = time.monotonic()
                    back = await until_state(CONNECTED) - ready
                    results.append((outage, down, back))
                    print(
                        f"outage {outage:4.0f} s: DISCONNECTED after {down * 1000:6.1f} ms, "
                        f"value back {back:5.2f} s after the IOC was ready",
                        flush=True,
                    )
                    await asyncio.sleep(1.0)  # let the counter run before the next kill
            await updates.aclose()
    finally:
        server.stop()
        ioc.stop()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="runs per outage length")
    p.add_argument("--outages", default="0,5,15", help="seconds the IOC stays down, comma list")
    p.add_argument("--scheme", default="ca", choices=("ca", "pva"))
    args = p.parse_args()
    apply_loopback_env()
    outages = [float(x) for x in args.outages.split(",")]
    results = asyncio.run(measure(args.scheme, args.runs, outages))
    backs = [b for _, _, b in results]
    downs = [d for _, d, _ in results]
    print(
        f"{args.scheme}: {len(results)} runs; value back after the IOC was ready: "
        f"median {statistics.median(backs):.2f} s, max {max(backs):.2f} s; "
        f"DISCONNECTED after the kill: median {statistics.median(downs) * 1000:.0f} ms, "
        f"max {max(downs) * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
