"""What a put under the user's own name costs (--forward-identity, docs/ACCESS.md).

`python -m bench.identity_puts [--puts 30] [--rounds 3]`

One IOC enforcing tests/dbs/acf.acf; CaBackend puts with `wait` to ACF:OPEN, whose libca channel
is already connected (as after a get or an earlier put), in one process, rounds interleaved:
- `libca`: `put`, through pvwire's own libca channel (pvwire's account);
- `new circuit`: `put_as` by a user never seen before: TCP connect, version exchange, host and
  user name, channel creation, the put;
- `open circuit`: `put_as` again by the same user, on that user's circuit.
And the same over PVA (PvaBackend, QSRV in the same IOC), against p4p's own put on an open
channel (p4p's asyncio Context, `get=False` as pvwire's put does; pvxs names pvwire's account):
- `p4p`: p4p's put;
- `new PVA connection`: `put_as` by a user never seen before: TCP connect, validation with the
  user's name, channel creation, put INIT, the put (the server's address and the channel's type
  already known, as after a first put);
- `open PVA connection`: `put_as` again by the same user, on that user's connection.
Prints the median and the 90th percentile of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from pvwire.loopback import apply_loopback_env
from pvwire_dev.ioc import IocProcess

ROOT = Path(__file__).resolve().parent.parent
DBS = ROOT / "tests" / "dbs"


async def timed(put: Callable[[int], Awaitable[None]], n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await put(i)
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


async def run(puts: int, rounds: int) -> dict[str, list[float]]:
    results = await run_ca(puts, rounds)
    results.update(await run_pva(puts, rounds))
    return results


async def run_pva(puts: int, rounds: int) -> dict[str, list[float]]:
    from p4p.client.asyncio import Context
    from pvwire.upstream.pva import PvaBackend

    backend = PvaBackend(forward_identity=True)
    ctx = Context("pva")
    kinds = ("p4p", "new PVA connection", "open PVA connection")
    results: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        await ctx.put("ACF:OPEN", 0.0, wait=True, get=False)  # connects p4p's channel
        await backend.put_as("warm-up", "ACF:OPEN", 0.0, True, 10.0)  # search and type known
        for r in range(rounds):
            results["p4p"] += await timed(
                lambda i: ctx.put("ACF:OPEN", float(i), wait=True, get=False), puts
            )
            results["new PVA connection"] += await timed(
                lambda i, r=r: backend.put_as(f"user{r}-{i}", "ACF:OPEN", i, True, 10.0), puts
            )
            results["open PVA connection"] += await timed(
                lambda i, r=r: backend.put_as(f"user{r}-0", "ACF:OPEN", i, True, 10.0), puts
            )
    finally:
        ctx.close()
        await backend.close()
    return results


async def run_ca(puts: int, rounds: int) -> dict[str, list[float]]:
    from pvwire.upstream.ca import CaBackend  # after the environment names the IOC

    backend = CaBackend(forward_identity=True)
    results: dict[str, list[float]] = {"libca": [], "new circuit": [], "open circuit": []}
    try:
        await backend.put("ACF:OPEN", 0.0, True, 10.0)  # connects pvwire's libca channel
        for r in range(rounds):
            results["libca"] += await timed(lambda i: backend.put("ACF:OPEN", i, True, 10.0), puts)
            results["new circuit"] += await timed(
                lambda i, r=r: backend.put_as(f"user{r}-{i}", "ACF:OPEN", i, True, 10.0), puts
            )
            results["open circuit"] += await timed(
                lambda i, r=r: backend.put_as(f"user{r}-0", "ACF:OPEN", i, True, 10.0), puts
            )
    finally:
        await backend.close()
    return results


def measure(puts: int, rounds: int) -> dict[str, dict[str, float]]:
    """Each kind of put's median and 90th percentile in ms, on an IOC of its own. The puts run
    in a child process: libca and pvxs read the environment that names the IOC once per
    process, and a caller (the test suite) may have made its contexts for another IOC already."""
    apply_loopback_env()
    with IocProcess([DBS / "acf.db"], acf=DBS / "acf.acf") as ioc:
        child = subprocess.run(
            [sys.executable, "-m", "bench.identity_puts", "--puts", str(puts),
             "--rounds", str(rounds), "--json"],
            env={**os.environ, **ioc.ports.client_env()},
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
    results: dict[str, list[float]] = json.loads(child.stdout)
    return {
        name: {
            "median_ms": statistics.median(times),
            "p90_ms": statistics.quantiles(times, n=10)[-1],
        }
        for name, times in results.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--puts", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--json", action="store_true",
        help="put to the IOC the environment names; print every put's time as JSON",
    )  # fmt: skip
    args = p.parse_args()
    if args.json:
        print(json.dumps(asyncio.run(run(args.puts, args.rounds))))
        return
    print(f"{'put':<20} {'median ms':>10} {'p90 ms':>8}")
    for name, figures in measure(args.puts, args.rounds).items():
        print(f"{name:<20} {figures['median_ms']:>10.2f} {figures['p90_ms']:>8.2f}")


if __name__ == "__main__":
    main()
