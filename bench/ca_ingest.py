"""CA ingest paths side by side: CPU per update of each way to take updates off libca.

`python -m bench.ca_ingest [--pvs 1000] [--duration 10] [--rounds 2] [--modes a,b,...]`

Measured as bench/ingest.py describes (one child process per mode, rounds interleaved).

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

import asyncio
import ctypes
import threading
from collections.abc import Callable
from typing import Any

from pvwire.upstream import ca_channel

from .ingest import Tally, closer, main, monitor_backend

MODES = ("aioca", "preemptive", "preemptive-pin", "polled", "polled-pin", "pvwire")

DBR_TIME_DOUBLE = 20
DBE_VALUE_ALARM = 1 | 4
# The server's own event layout and DBR_TIME_DOUBLE unpack, so the spike measures the same work.
TIME_DOUBLE = ca_channel._SCALAR_TIME[DBR_TIME_DOUBLE]


def _libca_subscribe(
    names: list[str], tally: Tally, preemptive: bool, pin: bool = False
) -> Callable[[], None]:
    """Raw libca subscriptions (DBR_TIME_DOUBLE) in a context of our own."""
    from epicscorelibs.ca import cadef

    loop = asyncio.get_running_loop()
    lib = cadef.libca
    cadef.ca_context_create(1 if preemptive else 0)

    handler_t = ca_channel._EVENT_HANDLER
    batch: list[tuple[int, tuple[Any, ...]]] = []
    unpack, string_at, size = TIME_DOUBLE.unpack, ctypes.string_at, TIME_DOUBLE.size
    scheduled = [False]

    def drain() -> None:
        nonlocal batch
        scheduled[0] = False
        todo, batch = batch, []
        update = tally.update
        for key, (_status, _sev, _secs, _nsec, value) in todo:
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
        return closer(subs, lambda s: s.close())
    if mode in ("preemptive", "preemptive-pin", "polled", "polled-pin"):
        return _libca_subscribe(names, tally, mode.startswith("preemptive"), mode.endswith("-pin"))
    from pvwire.upstream.ca import CaBackend

    return monitor_backend(CaBackend(), names, tally)


if __name__ == "__main__":
    main("bench.ca_ingest", __doc__, MODES, _subscribe)
