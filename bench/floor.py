"""The floor: the upstream library alone, a trivial callback, no pvwire.

`python -m bench.floor SPEC.json` (run by the harness): subscribes to the spec's PV names with
aioca (`camonitor`, FORMAT_TIME, as pvwire's CA backend does) or p4p's asyncio client (`nt=False`,
the plain p4p client), prints READY once every PV delivered its first update, waits for
`GO <t0> <t1>`, and counts the updates that arrive inside the window. The callback only counts
and keeps the latest value, so expected = sum over PVs of (last - first counter value) gives the
updates it should have seen.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any


class Counter:
    def __init__(self, n: int) -> None:
        self.window = [0.0, 0.0]
        self.count = 0
        self.first: list[float | None] = [None] * n
        self.last: list[float] = [0.0] * n
        self.connected = [False] * n
        self.seen = 0
        self.all_seen = asyncio.Event()

    def update(self, i: int, value: float) -> None:
        now = time.time()
        w0, w1 = self.window
        if w1 and w0 <= now <= w1:
            self.count += 1
            if self.first[i] is None:
                self.first[i] = self.last[i]  # the value before the window's first update
            self.last[i] = value
        elif not w1 or now < w0:
            if not self.connected[i]:
                self.connected[i] = True
                self.seen += 1
                if self.seen == len(self.connected):
                    self.all_seen.set()
            self.last[i] = value

    def result(self) -> dict[str, Any]:
        expected = sum(
            round(last - first)
            for first, last in zip(self.first, self.last, strict=True)
            if first is not None
        )
        return {"received": self.count, "expected": expected}


async def main_async(spec: dict[str, Any]) -> None:
    names = spec["names"]
    counter = Counter(len(names))
    loop = asyncio.get_running_loop()
    subs: list[Any] = []
    if spec["backend"] == "ca":
        from aioca import FORMAT_TIME, camonitor

        def ca_cb(value: Any, index: int) -> None:
            counter.update(index, value)

        subs = camonitor(names, ca_cb, format=FORMAT_TIME)
    else:
        from p4p.client.asyncio import Context

        ctx = Context("pva", nt=False)

        def make_cb(i: int) -> Any:
            async def cb(v: Any) -> None:
                if not isinstance(v, Exception):
                    counter.update(i, v["value"])

            return cb

        subs = [ctx.monitor(n, make_cb(i)) for i, n in enumerate(names)]
    await asyncio.wait_for(counter.all_seen.wait(), max(1.0, spec["deadline"] - time.time()))
    go = asyncio.Event()

    def read_go() -> None:
        line = sys.stdin.readline().split()
        if len(line) == 3 and line[0] == "GO":
            t0, t1 = float(line[1]), float(line[2])
            loop.call_soon_threadsafe(_start, t0, t1)
        loop.call_soon_threadsafe(go.set)

    def _start(t0: float, t1: float) -> None:
        counter.window[:] = [t0, t1]

    threading.Thread(target=read_go, daemon=True).start()
    print("READY", flush=True)
    await asyncio.wait_for(go.wait(), max(1.0, spec["deadline"] - time.time()))
    await asyncio.sleep(max(0.0, min(counter.window[1], spec["deadline"]) - time.time() + 0.2))
    for s in subs:
        s.close()
    with open(spec["out"], "w") as f:
        json.dump(counter.result(), f)


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    import uvloop  # the server's loop too

    uvloop.run(main_async(spec))


if __name__ == "__main__":
    main()
