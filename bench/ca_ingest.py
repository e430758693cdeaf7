"""pvwire's CA ingest alone against aioca's floor: CPU per update taking updates off libca.

`python -m bench.ca_ingest [--pvs 1000] [--duration 10] [--rounds 2] [--modes a,b,...]`

Measured as bench/ingest.py describes (one child process per mode, rounds interleaved).

Modes:
- `aioca`: the floor, aioca's `camonitor` (FORMAT_TIME) with a trivial callback (as floor.py).
- `pvwire`: pvwire's CaBackend monitors into a counting sink (all of pvwire's CA ingest).

The spike that chose pvwire's hand-over (preemptive or polled context, thread state kept or not)
is in bench/JOURNAL.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .ingest import Tally, closer, main, monitor_backend

MODES = ("aioca", "pvwire")


def _subscribe(mode: str, names: list[str], tally: Tally) -> Callable[[], None]:
    """Start mode's subscriptions; returns what closes them."""
    if mode == "aioca":
        from aioca import FORMAT_TIME, camonitor

        def cb(value: Any, i: int) -> None:
            tally.update(i, value)

        subs = camonitor(names, cb, format=FORMAT_TIME)
        return closer(subs, lambda s: s.close())
    from pvwire.upstream.ca import CaBackend

    return monitor_backend(CaBackend(), names, tally)


if __name__ == "__main__":
    main("bench.ca_ingest", __doc__, MODES, _subscribe)
