"""CA monitors opened all at once, in process: how long until the last first value, and the CPU.

    .venv/bin/python -m bench.ca_open [--pvs 2000] [--rounds 3] [--base OTHER/server]

pvwire's CaBackend alone (no hub, no clients) opens `--pvs` monitors of the bench's IOC in one
loop pass, as a server does after a restart when every screen opens together; each monitor's
first value waits for its metadata (DBR_CTRL and DESC). `--base` runs the same in a copy of
another revision's `server/`, alternating with this tree, for a before and after in one run.
Each round is a child process of its own, so no libca state is shared between them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import _bench_env, write_db

HERE = Path(__file__).resolve().parent


class _FirstValues:
    """A ChannelSink that notes when each monitor's first value came."""

    def __init__(self, got: dict[int, float], key: int) -> None:
        self._got, self._key = got, key

    def on_update(self, *args: Any) -> None:
        self._got.setdefault(self._key, time.perf_counter())

    def on_meta(self, meta: Any) -> None:
        pass

    def on_connection(self, state: Any, reason: str = "") -> None:
        pass


async def _open_all(names: list[str], timeout: float) -> dict[str, float]:
    from pvwire.upstream.ca import CaBackend

    backend = CaBackend()
    lags = [0.0]

    async def lag() -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - start - 0.005)

    lagger = asyncio.ensure_future(lag())
    await asyncio.sleep(0.05)
    got: dict[int, float] = {}
    cpu0, t0 = time.process_time(), time.perf_counter()
    monitors = [backend.monitor(n, _FirstValues(got, i)) for i, n in enumerate(names)]
    while len(got) < len(names) and time.perf_counter() - t0 < timeout:
        await asyncio.sleep(0.005)
    cpu = time.process_time() - cpu0
    lagger.cancel()
    for m in monitors:
        m.close()
    await backend.close()
    firsts = sorted(t - t0 for t in got.values())
    return {
        "first_values": len(firsts),
        "p50_ms": 1000 * firsts[len(firsts) // 2] if firsts else float("nan"),
        "last_ms": 1000 * firsts[-1] if firsts else float("nan"),
        "cpu_ms": 1000 * cpu,
        "loop_lag_max_ms": 1000 * max(lags),
    }


def child(pvs: int, timeout: float) -> dict[str, Any]:
    """One round in this process: its own IOC, then the monitors."""
    from pvwire_dev.ioc import IocProcess

    with tempfile.TemporaryDirectory(prefix="pvwire-ca-open-") as tmp:
        names = write_db(Path(tmp) / "open.db", pvs, False)
        ioc = IocProcess([Path(tmp) / "open.db"])
        ioc.start()
        try:
            os.environ.update(ioc.ports.client_env())
            return asyncio.run(_open_all(names, timeout))
        finally:
            ioc.stop()


def run(pvs: int, rounds: int, base: str = "", timeout: float = 30.0) -> list[dict[str, Any]]:
    trees = [("base", base), ("this", "")] if base else [("this", "")]
    rows = []
    for k in range(rounds):
        for label, tree in trees:
            env = _bench_env()
            if tree:
                env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
            out = subprocess.run(
                [sys.executable, "-m", "bench.ca_open", "--child", str(pvs), str(timeout)],
                cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=timeout + 120,
                check=True,
            )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"tree": label, "round": k, "pvs": pvs, **row, "load": os.getloadavg()[0]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pvs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--base", default="", help="another revision's server/ directory")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(int(a.child[0]), float(a.child[1]))))
        return
    print("| tree | first values | p50 ms | last ms | CPU ms | loop lag max ms | load |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in run(a.pvs, a.rounds, a.base):
        print(
            f"| {r['tree']} | {r['first_values']:,} | {r['p50_ms']:.0f} | {r['last_ms']:.0f} | "
            f"{r['cpu_ms']:.0f} | {r['loop_lag_max_ms']:.0f} | {r['load']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
