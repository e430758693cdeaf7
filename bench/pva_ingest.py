"""PVA ingest paths side by side: CPU per update of each way to take updates off p4p.

`python -m bench.pva_ingest [--pvs 1000] [--duration 10] [--rounds 2] [--modes a,b,...]`

One IOC with N counters at 10 Hz (bench/harness.py's database); each mode runs in its own child
process, one after the other, rounds interleaved so that the machine's changing load hits every
mode alike. Each child subscribes to every PV, waits until each delivered its first update,
measures its own CPU time over the window and checks every counter: an update whose value jumps
by more than one is counted as missing (merged or lost upstream of the callback).

Modes:
- `asyncio`: the floor, p4p's asyncio client with a trivial `async` callback (as bench/floor.py).
- `thread`: p4p's thread client; the callback appends the raw Value to a buffer and wakes the loop
  only when the buffer was empty; the loop drains the buffer and reads value and time.
- `raw-pywake`: p4p's raw subscriptions (`raw.Context.monitor`); the Python wake-up callback
  appends to a ready list and wakes the loop (`call_soon_threadsafe`) only when the list was
  empty; the loop pops every ready FIFO until empty. Reads the value only.
- `raw-cwake`: raw subscriptions whose wake-up is a C call (`deque.append`, no bytecode),
  the deque drained by a 5 ms timer (no cross-thread loop wake-up at all).
- `pvwire`: pvwire's PvaBackend monitors into a counting sink (all of pvwire's ingest).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("asyncio", "thread", "raw-pywake", "raw-cwake", "pvwire")


POLL_S = 0.005


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


def _closer(items: list[Any], close_one: Callable[[Any], object]) -> Callable[[], None]:
    def close() -> None:
        for item in items:
            close_one(item)

    return close


def _subscribe(mode: str, names: list[str], tally: Tally) -> Callable[[], None]:
    """Start mode's subscriptions; returns what closes them."""
    loop = asyncio.get_running_loop()
    if mode == "asyncio":
        from p4p.client.asyncio import Context

        ctx = Context("pva", nt=False)

        def make_cb(i: int) -> Any:
            async def cb(v: Any) -> None:
                if not isinstance(v, Exception):
                    tally.update(i, v["value"])

            return cb

        subs = [ctx.monitor(n, make_cb(i)) for i, n in enumerate(names)]
        return _closer(subs, lambda s: s.close())
    if mode == "thread":
        import threading

        from p4p.client.thread import Context as ThreadContext

        tctx = ThreadContext("pva", nt=False)
        lock = threading.Lock()
        buffer: list[tuple[int, Any]] = []

        def drain() -> None:
            nonlocal buffer
            with lock:
                batch, buffer = buffer, []
            for i, v in batch:
                if not isinstance(v, Exception):
                    v.changedSet()
                    tally.update(i, v["value"])
                    v["timeStamp.secondsPastEpoch"]

        def make_tcb(i: int) -> Callable[[Any], None]:
            def cb(v: Any) -> None:
                with lock:
                    buffer.append((i, v))
                    if len(buffer) > 1:
                        return
                loop.call_soon_threadsafe(drain)

            return cb

        tsubs = [tctx.monitor(n, make_tcb(i)) for i, n in enumerate(names)]
        return _closer(tsubs, lambda s: s.close())
    if mode == "raw-pywake":
        import threading

        from p4p._p4p import ClientMonitor
        from p4p.client.raw import Context as RawContext

        rctx = RawContext("pva", nt=False, useenv=True)
        rlock = threading.Lock()
        ready: list[Any] = []
        scheduled = [False]
        rpop = ClientMonitor.pop

        def rdrain() -> None:
            nonlocal ready
            with rlock:
                batch, ready = ready, []
                scheduled[0] = False
            for sub in batch:
                while (v := rpop(sub.s)) is not None:
                    if not isinstance(v, Exception):
                        tally.update(sub.i, v["value"])

        def wake(sub: Any) -> None:
            with rlock:
                ready.append(sub)
                if scheduled[0]:
                    return
                scheduled[0] = True
            loop.call_soon_threadsafe(rdrain)

        class Sub:
            def __init__(self, i: int, name: str) -> None:
                self.i = i
                self.s = RawContext.monitor(rctx, name, lambda: wake(self), None)

        rsubs = [Sub(i, n) for i, n in enumerate(names)]
        return _closer(rsubs, lambda s: s.s.close())
    if mode == "raw-cwake":
        from collections import deque
        from functools import partial

        from p4p._p4p import ClientMonitor
        from p4p.client.raw import Context as RawContext

        cctx = RawContext("pva", nt=False, useenv=True)
        woken: deque[Any] = deque()
        cpop = ClientMonitor.pop

        class CSub:
            def __init__(self, i: int, name: str) -> None:
                self.i = i
                self.s = ClientMonitor(cctx._ctxt, name, handler=partial(woken.append, self),
                                       pvRequest=None)  # fmt: skip

        def poll() -> None:
            while woken:
                sub = woken.popleft()
                while (v := cpop(sub.s)) is not None:
                    if not isinstance(v, Exception):
                        tally.update(sub.i, v["value"])
            handle[0] = loop.call_later(POLL_S, poll)

        handle = [loop.call_later(POLL_S, poll)]
        csubs = [CSub(i, n) for i, n in enumerate(names)]
        return _closer([*csubs, None], lambda s: s.s.close() if s else handle[0].cancel())
    from pvwire.model import ConnState, Metadata, Value
    from pvwire.upstream.pva import PvaBackend

    backend = PvaBackend()

    class Sink:
        def __init__(self, i: int) -> None:
            self.i = i

        def on_update(self, value: Value, *_: Any) -> None:
            tally.update(self.i, value)  # type: ignore[arg-type]

        def on_meta(self, meta: Metadata) -> None:
            pass

        def on_connection(self, state: ConnState, reason: str = "") -> None:
            pass

    mons = [backend.monitor(n, Sink(i)) for i, n in enumerate(names)]
    return _closer(mons, lambda m: m.close())


async def child(mode: str, names: list[str], duration: float, out: str) -> None:
    tally = Tally(len(names))
    close = _subscribe(mode, names, tally)
    t_sub = time.monotonic()
    with contextlib.suppress(TimeoutError):  # reported: `never` = PVs with no first update
        await asyncio.wait_for(tally.all_seen.wait(), 60)
    connect_s = time.monotonic() - t_sub
    await asyncio.sleep(2.0)  # settle
    tally.counting = True
    cpu0, t0, main0 = time.process_time(), time.monotonic(), time.thread_time()
    await asyncio.sleep(duration)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    main_cpu = time.thread_time() - main0
    tally.counting = False
    close()
    result = {
        "mode": mode,
        "cpu_pct": 100 * cpu / wall,
        "updates": tally.updates,
        "missing": tally.missing,
        "us_per_update": 1e6 * cpu / max(1, tally.updates),
        "main_us_per_update": 1e6 * main_cpu / max(1, tally.updates),
        "connect_s": connect_s,
        "never": len(names) - tally.seen,
    }
    Path(out).write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pva_ingest", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--pvs", type=int, default=1000)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--child", nargs=3, metavar=("MODE", "NAMES", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    import uvloop  # the server's loop too

    if a.child:
        mode, names_file, out = a.child
        names = json.loads(Path(names_file).read_text())
        uvloop.run(child(mode, names, a.duration, out))
        return
    from pvwire.ioc import IocProcess

    from .harness import write_db

    modes = a.modes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        names = write_db(db, a.pvs, waveform=False)
        names_file = Path(tmp) / "names.json"
        names_file.write_text(json.dumps(names))
        ioc = IocProcess([db])
        ioc.start()
        env = {**os.environ, **ioc.ports.client_env()}
        rows: list[dict[str, Any]] = []
        try:
            for r in range(a.rounds):
                floor = None
                for mode in modes:
                    out = Path(tmp) / f"{mode}-{r}.json"
                    subprocess.run(
                        [sys.executable, "-m", "bench.pva_ingest", "--duration", str(a.duration),
                         "--child", mode, str(names_file), str(out)],
                        env=env, check=True, timeout=a.duration + 180,
                    )  # fmt: skip
                    res = json.loads(out.read_text())
                    if mode == "asyncio":
                        floor = res["us_per_update"]
                    res["round"] = r
                    res["ratio"] = res["us_per_update"] / floor if floor else None
                    rows.append(res)
                    print(
                        f"round {r} {mode:9} cpu {res['cpu_pct']:5.1f} %  "
                        f"{res['us_per_update']:6.2f} µs/update (loop thread "
                        f"{res['main_us_per_update']:5.2f})  updates {res['updates']:7d}  "
                        f"missing {res['missing']:5d}  subscribe {res['connect_s']:.1f} s  "
                        f"never {res['never']}"
                        + (f"  ratio to floor {res['ratio']:.2f}" if res["ratio"] else ""),
                        flush=True,
                    )
        finally:
            ioc.stop()
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
