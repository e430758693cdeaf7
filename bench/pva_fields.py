"""Reading fields of real PVA updates: loop-thread CPU per update of each way, on cold Values.

`python -m bench.pva_fields [--pvs 1000] [--collect 8] [--chunk 2000]`

One IOC with N counters at 10 Hz (bench/harness.py's database). The process subscribes to every
PV (p4p's raw FIFOs), keeps every update it pops for `--collect` seconds, then runs each
way of reading them over chunks of those Values in arrival order, ways taking turns chunk by
chunk. Between two updates of one PV the reader has touched every other PV's Values and type, as
the server does: pvxs keeps one type (and one field-name map) per subscription, so with 1,000 PVs
a map is cold when its next update is read. Re-reading the same few Values in a loop measures
warm caches instead, and ranks the ways differently (changedSet looked cheaper than four
`changed` calls that way, and is not).

Ways:
- `changedSet`: p4p's `Value.changedSet()` (names each changed field by walking the name map);
- `changed-each`: `Value.changed(b"alarm")` ... for each top-level field but value and timeStamp;
- `changed-alarm`: `Value.changed(b"alarm")` alone (what a value-only pvRequest mask would need);
- `reads-str` / `reads-bytes`: value and the two time fields, by str or by bytes keys;
- `drain-inline`: what `PvaMonitor.drain` did per ordinary update before the compiled ingest
  (changedSet, subset test, three bytes-key reads).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PLAIN = frozenset(
    (
        "value",
        "timeStamp",
        "timeStamp.secondsPastEpoch",
        "timeStamp.nanoseconds",
        "timeStamp.userTag",
    )
)


def _ways() -> dict[str, Callable[[Any], object]]:
    from p4p import _p4p

    changed_set = _p4p._Value.changedSet
    changed = _p4p._Value.changed
    others = (b"alarm", b"display", b"control", b"valueAlarm")

    def drain_inline(v: Any) -> object:
        if changed_set(v, False, False) <= _PLAIN:
            return v[b"value"], v[b"timeStamp.secondsPastEpoch"], v[b"timeStamp.nanoseconds"]
        return None

    return {
        "changedSet": lambda v: changed_set(v, False, False),
        "changed-each": lambda v: any(changed(v, k) for k in others),
        "changed-alarm": lambda v: changed(v, b"alarm"),
        "reads-str": lambda v: (
            v["value"],
            v["timeStamp.secondsPastEpoch"],
            v["timeStamp.nanoseconds"],
        ),
        "reads-bytes": lambda v: (
            v[b"value"],
            v[b"timeStamp.secondsPastEpoch"],
            v[b"timeStamp.nanoseconds"],
        ),
        "drain-inline": drain_inline,
    }


async def _collect(names: list[str], seconds: float) -> list[Any]:
    """Every update popped from `names` for `seconds`, first updates left out.

    Through p4p's raw FIFOs, woken by a C call (`deque.append`) and popped by a 5 ms timer (the
    `raw-cwake` mode of bench/pva_ingest.py): the Values these ways read are p4p's.
    """
    from collections import deque
    from functools import partial

    from p4p._p4p import ClientMonitor
    from p4p.client.raw import Context as RawContext

    loop = asyncio.get_running_loop()
    ctx = RawContext("pva", nt=False, useenv=True)
    woken: deque[Sub] = deque()
    values: list[Any] = []
    firsts: set[int] = set()
    request = RawContext.makeRequest("record[queueSize=16]field()")

    class Sub:
        def __init__(self, i: int, name: str) -> None:
            self.i = i
            self.mon = ClientMonitor(ctx._ctxt, name, handler=partial(woken.append, self),
                                     pvRequest=request)  # fmt: skip

        def drain(self) -> None:
            while (v := self.mon.pop()) is not None:
                if isinstance(v, Exception):
                    continue
                if self.i in firsts:
                    values.append(v)
                else:
                    firsts.add(self.i)  # the first update marks every field

    def poll() -> None:
        while woken:
            woken.popleft().drain()
        handle[0] = loop.call_later(0.005, poll)

    handle = [loop.call_later(0.005, poll)]
    subs = [Sub(i, n) for i, n in enumerate(names)]
    await asyncio.sleep(seconds)
    handle[0].cancel()
    for s in subs:
        s.mon.close()
    ctx.close()
    return values


def _measure(values: list[Any], chunk: int) -> dict[str, list[float]]:
    ways = _ways()
    names = list(ways)
    out: dict[str, list[float]] = {n: [] for n in names}
    chunks = [values[i : i + chunk] for i in range(0, len(values) - chunk + 1, chunk)]
    gc.disable()
    try:
        for k, part in enumerate(chunks):
            name = names[k % len(names)]
            read = ways[name]
            t0 = time.thread_time_ns()
            for v in part:
                read(v)
            out[name].append((time.thread_time_ns() - t0) / len(part) / 1000)
    finally:
        gc.enable()
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pva_fields", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--pvs", type=int, default=1000)
    p.add_argument("--collect", type=float, default=8.0, help="seconds of updates to keep")
    p.add_argument("--chunk", type=int, default=2000, help="updates per timed chunk")
    a = p.parse_args()

    from pvwire.ioc import IocProcess

    from .harness import write_db

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        names = write_db(db, a.pvs, waveform=False)
        ioc = IocProcess([db])
        ioc.start()
        try:
            os.environ.update(ioc.ports.client_env())
            values = asyncio.run(_collect(names, a.collect))
        finally:
            ioc.stop()
    load = os.getloadavg()[0]
    print(f"{len(values)} updates of {a.pvs} PVs, chunks of {a.chunk}, load average {load:.1f}")
    print("| way | chunks | min µs/update | median µs/update |")
    print("|---|---:|---:|---:|")
    for name, xs in _measure(values, a.chunk).items():
        xs.sort()
        if xs:
            print(f"| {name} | {len(xs)} | {xs[0]:.2f} | {xs[len(xs) // 2]:.2f} |")


if __name__ == "__main__":
    main()
