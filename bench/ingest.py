"""The measurement shared by bench/ca_ingest.py and bench/pva_ingest.py: ingest alone.

One IOC with N counters at 10 Hz (bench/harness.py's database); each mode runs in its own child
process, one after the other, rounds interleaved so that the machine's changing load hits every
mode alike. Each child subscribes to every PV, waits until each delivered its first update,
measures its own CPU time over the window and checks every counter: an update whose value jumps
by more than one is counted as missing (merged or lost upstream of the callback). Each module
supplies only its modes: `subscribe(mode, names, tally)` starts them and returns what closes them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Subscribe", "Tally", "closer", "main", "monitor_backend"]


class Tally:
    """Per-PV counters: updates in the window, and missing ones (counter jumps over one)."""

    def __init__(self, n: int) -> None:
        self.last: list[float | None] = [None] * n
        self.seen = 0
        self.counting = False
        self.updates = 0
        self.missing = 0
        self.all_seen = asyncio.Event()

    def update(self, i: int, value: float) -> None:
        last = self.last[i]
        if last is None:
            self.seen += 1
            if self.seen == len(self.last):
                self.all_seen.set()
        elif self.counting:
            self.updates += 1
            if value - last > 1:
                self.missing += int(value - last - 1)
        self.last[i] = value


Subscribe = Callable[[str, list[str], Tally], Callable[[], None]]


def closer(items: Sequence[Any], close_one: Callable[[Any], object]) -> Callable[[], None]:
    """What closes every subscription of a mode."""

    def close() -> None:
        for item in items:
            close_one(item)

    return close


def monitor_backend(backend: Any, names: list[str], tally: Tally) -> Callable[[], None]:
    """The `pvwire` mode: a pvwire backend's monitors into a sink that only counts."""

    class Sink:
        def __init__(self, i: int) -> None:
            self.i = i

        def on_update(self, value: Any, *_: Any) -> None:
            tally.update(self.i, value)

        def on_meta(self, meta: Any) -> None:
            pass

        def on_connection(self, state: Any, reason: str = "") -> None:
            pass

    mons = [backend.monitor(n, Sink(i)) for i, n in enumerate(names)]
    return closer(mons, lambda m: m.close())


async def _child(
    subscribe: Subscribe, mode: str, names: list[str], duration: float
) -> dict[str, Any]:
    tally = Tally(len(names))
    close = subscribe(mode, names, tally)
    t_sub = time.monotonic()
    with contextlib.suppress(TimeoutError):  # reported: `never` = PVs with no first update
        await asyncio.wait_for(tally.all_seen.wait(), 60)
    connect_s = time.monotonic() - t_sub
    await asyncio.sleep(min(2.0, duration))  # settle
    tally.counting = True
    cpu0, t0, main0 = time.process_time(), time.monotonic(), time.thread_time()
    await asyncio.sleep(duration)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    main_cpu = time.thread_time() - main0
    tally.counting = False
    close()
    return {
        "mode": mode,
        "cpu_pct": 100 * cpu / wall,
        "updates": tally.updates,
        "missing": tally.missing,
        "us_per_update": 1e6 * cpu / max(1, tally.updates),
        "main_us_per_update": 1e6 * main_cpu / max(1, tally.updates),
        "connect_s": connect_s,
        "never": len(names) - tally.seen,
    }


def main(module: str, doc: str | None, modes: Sequence[str], subscribe: Subscribe) -> None:
    """The command line of an ingest module: the parent runs the rounds, `--child` one mode."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--pvs", type=int, default=1000)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default=",".join(modes))
    p.add_argument("--child", nargs=3, metavar=("MODE", "NAMES", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        import uvloop  # the server's loop too

        mode, names_file, out = a.child
        names = json.loads(Path(names_file).read_text())
        result = uvloop.run(_child(subscribe, mode, names, a.duration))
        Path(out).write_text(json.dumps(result))
        return
    rows = run(module, a.pvs, a.duration, a.rounds, a.modes.split(","))
    print(json.dumps(rows))


def run(
    module: str, pvs: int, duration: float, rounds: int, modes: list[str]
) -> list[dict[str, Any]]:
    """Every mode in its own child process, `rounds` times; one row per child, printed too. The
    first mode is the floor the others are divided by."""
    from pvwire_dev.ioc import IocProcess

    from .harness import _bench_env, write_db

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        names = write_db(db, pvs, waveform=False)
        names_file = Path(tmp) / "names.json"
        names_file.write_text(json.dumps(names))
        ioc = IocProcess([db])
        ioc.start()
        env = {**_bench_env(), **ioc.ports.client_env()}
        try:
            for r in range(rounds):
                floor = None
                for mode in modes:
                    out = Path(tmp) / f"{mode}-{r}.json"
                    subprocess.run(
                        [sys.executable, "-m", module, "--duration", str(duration),
                         "--child", mode, str(names_file), str(out)],
                        env=env, check=True, timeout=duration + 180,
                    )  # fmt: skip
                    res = json.loads(out.read_text())
                    if floor is None:
                        floor = res["us_per_update"]
                    res["round"] = r
                    res["ratio"] = res["us_per_update"] / floor
                    res["load"] = os.getloadavg()[0]
                    rows.append(res)
                    print(
                        f"round {r} {mode:14} cpu {res['cpu_pct']:5.1f} %  "
                        f"{res['us_per_update']:6.2f} µs/update (loop thread "
                        f"{res['main_us_per_update']:5.2f})  updates {res['updates']:7d}  "
                        f"missing {res['missing']:5d}  subscribe {res['connect_s']:.1f} s  "
                        f"never {res['never']}  load {res['load']:.1f}  "
                        f"ratio to floor {res['ratio']:.2f}",
                        flush=True,
                    )
        finally:
            ioc.stop()
    return rows
