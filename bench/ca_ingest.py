"""CA ingest paths side by side: CPU per update of each way to take updates off libca.

`python -m bench.ca_ingest [--pvs 1000] [--duration 10] [--rounds 2] [--modes a,b,...]`

One IOC with N counters at 10 Hz (bench/harness.py's database); each mode runs in its own child
process, one after the other, rounds interleaved so that the machine's changing load hits every
mode alike. Each child subscribes to every PV, waits until each delivered its first update,
measures its own CPU time over the window and checks every counter: an update whose value jumps
by more than one is counted as missing (merged or lost upstream of the callback).

Modes:
- `aioca`: the floor, aioca's `camonitor` (FORMAT_TIME) with a trivial callback (as floor.py).
- `preemptive`: a preemptive libca context (aioca's way); the ctypes event callback unpacks the
  DBR_TIME_DOUBLE with one `struct` call and appends it to a batch; the loop is woken
  (`call_soon_threadsafe`) only when the batch was empty.
- `polled`: a libca context created with preemptive callbacks disabled; `ca_add_fd_registration`
  names its wake-up socket, the loop watches it (`add_reader`) and calls `ca_pend_event(1e-12)`
  (`ca_poll`) when readable; libca's receive thread runs the same callback meanwhile, and the loop
  drains the batch right after the poll returns: no cross-thread wake-up.
- `preemptive-pin`, `polled-pin`: the same, and the first callback on each libca thread takes one
  `PyGILState_Ensure` reference it never gives back, so ctypes stops creating and deleting a
  Python thread state around every callback (the server gives it back at thread exit).
- `pvwire`: pvwire's CaBackend monitors into a counting sink (all of pvwire's CA ingest).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("aioca", "preemptive", "preemptive-pin", "polled", "polled-pin", "pvwire")

# dbr_time_double (db_access.h): status, severity, stamp secs, stamp nsec, pad, value.
TIME_DOUBLE = struct.Struct("<hhIIid")
DBR_TIME_DOUBLE = 20
DBE_VALUE_ALARM = 1 | 4


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


def _libca_subscribe(
    names: list[str], tally: Tally, preemptive: bool, pin: bool = False
) -> Callable[[], None]:
    """Raw libca subscriptions (DBR_TIME_DOUBLE) in a context of our own."""
    from epicscorelibs.ca import cadef

    loop = asyncio.get_running_loop()
    lib = cadef.libca
    cadef.ca_context_create(1 if preemptive else 0)

    class EventArgs(ctypes.Structure):
        _fields_ = [
            ("usr", ctypes.c_void_p),
            ("chid", ctypes.c_void_p),
            ("type", ctypes.c_long),
            ("count", ctypes.c_long),
            ("raw_dbr", ctypes.c_void_p),
            ("status", ctypes.c_int),
        ]

    handler_t = ctypes.CFUNCTYPE(None, EventArgs)
    batch: list[tuple[int, tuple[Any, ...]]] = []
    unpack, string_at, size = TIME_DOUBLE.unpack, ctypes.string_at, TIME_DOUBLE.size
    scheduled = [False]

    def drain() -> None:
        nonlocal batch
        scheduled[0] = False
        todo, batch = batch, []
        update = tally.update
        for key, (_status, _sev, _secs, _nsec, _pad, value) in todo:
            update(key - 1, value)

    pinned: set[int] = set()
    get_ident = threading.get_ident

    def on_event(args: Any) -> None:  # a libca thread
        if pin and get_ident() not in pinned:
            # One GIL-state reference that is never given back keeps this thread's Python
            # thread state alive, instead of ctypes creating and deleting one per callback.
            pinned.add(get_ident())
            ctypes.pythonapi.PyGILState_Ensure()
        batch.append((args.usr, unpack(string_at(args.raw_dbr, size))))
        if preemptive and not scheduled[0]:
            scheduled[0] = True
            loop.call_soon_threadsafe(drain)

    c_on_event = handler_t(on_event)
    create_sub = lib["ca_create_subscription"]
    create_sub.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                           handler_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]  # fmt: skip
    create_chan = lib["ca_create_channel"]
    create_chan.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_void_p)]  # fmt: skip
    readers: list[int] = []
    timer: list[asyncio.TimerHandle] = []
    keep: list[Any] = [c_on_event]

    def poll() -> None:
        cadef.ca_pend_event(1e-12)
        drain()

    if not preemptive:
        fd_handler_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)

        def on_fd(_arg: Any, fd: int, opened: int) -> None:
            if opened:
                loop.add_reader(fd, poll)
                readers.append(fd)
            else:
                loop.remove_reader(fd)

        c_on_fd = fd_handler_t(on_fd)
        keep.append(c_on_fd)
        add_fd = lib["ca_add_fd_registration"]
        add_fd.argtypes = [fd_handler_t, ctypes.c_void_p]
        add_fd(c_on_fd, None)

        def tick() -> None:  # libca's own timers need no poll; a slow one catches anything else
            poll()
            timer[0] = loop.call_later(1.0, tick)

        timer.append(loop.call_later(1.0, tick))
    chids = []
    for i, name in enumerate(names):
        chid = ctypes.c_void_p()
        create_chan(name.encode(), None, None, 0, ctypes.byref(chid))
        evid = ctypes.c_void_p()
        # A subscription made before the channel connects is installed when it connects.
        create_sub(DBR_TIME_DOUBLE, 1, chid, DBE_VALUE_ALARM, c_on_event, i + 1,
                   ctypes.byref(evid))  # fmt: skip
        chids.append(chid)
    cadef.ca_flush_io()

    def close() -> None:
        for t in timer:
            t.cancel()
        for fd in readers:
            loop.remove_reader(fd)
        for chid in chids:
            cadef.ca_clear_channel(chid)
        cadef.ca_flush_io()
        keep.clear()

    return close


def _subscribe(mode: str, names: list[str], tally: Tally) -> Callable[[], None]:
    """Start mode's subscriptions; returns what closes them."""
    if mode == "aioca":
        from aioca import FORMAT_TIME, camonitor

        def cb(value: Any, i: int) -> None:
            tally.update(i, value)

        subs = camonitor(names, cb, format=FORMAT_TIME)

        def close_all() -> None:
            for s in subs:
                s.close()

        return close_all
    if mode in ("preemptive", "preemptive-pin", "polled", "polled-pin"):
        return _libca_subscribe(names, tally, mode.startswith("preemptive"), mode.endswith("-pin"))
    from pvwire.model import ConnState, Metadata, Value
    from pvwire.upstream.ca import CaBackend

    backend = CaBackend()

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

    def close_mons() -> None:
        for m in mons:
            m.close()

    return close_mons


async def child(mode: str, names: list[str], duration: float, out: str) -> None:
    tally = Tally(len(names))
    close = _subscribe(mode, names, tally)
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
    p = argparse.ArgumentParser(prog="python -m bench.ca_ingest", description=__doc__,
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
    rows = run(a.pvs, a.duration, a.rounds, a.modes.split(","))
    print(json.dumps(rows))


def run(pvs: int, duration: float, rounds: int, modes: list[str]) -> list[dict[str, Any]]:
    """Every mode in its own child process, `rounds` times; one row per child, printed too."""
    from pvwire.ioc import IocProcess

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
                        [sys.executable, "-m", "bench.ca_ingest", "--duration", str(duration),
                         "--child", mode, str(names_file), str(out)],
                        env=env, check=True, timeout=duration + 180,
                    )  # fmt: skip
                    res = json.loads(out.read_text())
                    if mode == "aioca":
                        floor = res["us_per_update"]
                    res["round"] = r
                    res["ratio"] = res["us_per_update"] / floor if floor else None
                    res["load"] = os.getloadavg()[0]
                    rows.append(res)
                    print(
                        f"round {r} {mode:14} cpu {res['cpu_pct']:5.1f} %  "
                        f"{res['us_per_update']:6.2f} µs/update (loop thread "
                        f"{res['main_us_per_update']:5.2f})  updates {res['updates']:7d}  "
                        f"missing {res['missing']:5d}  subscribe {res['connect_s']:.1f} s  "
                        f"never {res['never']}  load {res['load']:.1f}"
                        + (f"  ratio to floor {res['ratio']:.2f}" if res["ratio"] else ""),
                        flush=True,
                    )
        finally:
            ioc.stop()
    return rows


if __name__ == "__main__":
    main()
