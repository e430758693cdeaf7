"""pvwire's PVA ingest alone against p4p's floor: CPU per update taking updates off pvxs.

`python -m bench.pva_ingest [--pvs 1000] [--duration 10] [--rounds 2] [--modes a,b,...]`

Measured as bench/ingest.py describes (one child process per mode, rounds interleaved).

Modes:
- `asyncio`: the floor, p4p's asyncio client with a trivial `async` callback (as bench/floor.py).
- `pvwire`: pvwire's PvaBackend monitors into a counting sink (all of pvwire's ingest).

The spike that chose pvwire's way off p4p (thread client, raw FIFOs with a Python or a C
wake-up) is in bench/JOURNAL.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .ingest import Tally, closer, main, monitor_backend

MODES = ("asyncio", "pvwire")


def _subscribe(mode: str, names: list[str], tally: Tally) -> Callable[[], None]:
    """Start mode's subscriptions; returns what closes them."""
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
    from pvwire.upstream.pva import PvaBackend

    return monitor_backend(PvaBackend(), names, tally)


if __name__ == "__main__":
    main("bench.pva_ingest", __doc__, MODES, _subscribe)
