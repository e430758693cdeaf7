"""PVA ingest paths side by side: CPU per update of each way to take updates off p4p.

`python -m bench.pva_ingest [--pvs 1000] [--duration 10] [--rounds 2] [--modes a,b,...]`

Measured as bench/ingest.py describes (one child process per mode, rounds interleaved).

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

import asyncio
from collections.abc import Callable
from typing import Any

from .ingest import Tally, closer, main, monitor_backend

MODES = ("asyncio", "thread", "raw-pywake", "raw-cwake", "pvwire")


POLL_S = 0.005


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
        return closer(subs, lambda s: s.close())
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
        return closer(tsubs, lambda s: s.close())
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
        return closer(rsubs, lambda s: s.s.close())
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
        return closer([*csubs, None], lambda s: s.s.close() if s else handle[0].cancel())
    from pvwire.upstream.pva import PvaBackend

    return monitor_backend(PvaBackend(), names, tally)


if __name__ == "__main__":
    main("bench.pva_ingest", __doc__, MODES, _subscribe)
