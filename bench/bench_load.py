"""The load scenarios (bench/scenario.py) as pytest-benchmark tests: `make bench`.

Each scenario runs the real server against a real IOC (or sim channels) with load clients, then,
on the same IOC, the plain upstream library with a trivial callback (the floor: aioca's
`camonitor` or p4p's asyncio client) and, where bench/README.md compares them, Coniql 0.4.2
(`make coniql`). Its figures (updates/s delivered, CPU per update, the ratios to the floor and to
Coniql measured in that one run) are in `extra_info`; nothing is asserted about them.
The workers pairs run 1 and 2 workers back to back and record the ratios 2 / 1.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from .conftest import Measure
from .harness import Scenario, run
from .report import WORKER_PAIRS, scenario_figures, workers_figures
from .scenario import scenarios

PAIRED = {name for pair in WORKER_PAIRS.values() for name in pair}
SINGLE = [name for name in scenarios() if name not in PAIRED]


def sized(name: str, quick: bool) -> Scenario:
    """The named scenario; with `quick`, the same shape at a few PVs and clients, 2 s window."""
    sc = scenarios()[name]
    if not quick:
        return sc
    pvs = 1 if sc.waveform else min(sc.pvs, 10)
    per = min(sc.per_client, 5) if sc.per_client else 0
    return replace(
        sc, pvs=pvs, per_client=per, clients=min(sc.clients, 2), warmup=1.0, duration=2.0
    )


@pytest.mark.parametrize("name", SINGLE)
def test_scenario(measure: Measure, quick: bool, name: str) -> None:
    sc = sized(name, quick)
    measure(lambda: run(sc), scenario_figures)


@pytest.mark.parametrize("pair", list(WORKER_PAIRS))
def test_workers(measure: Measure, quick: bool, pair: str) -> None:
    """The same load on 1 and 2 workers (`--workers`, one port), back to back."""
    one, two = (sized(name, quick) for name in WORKER_PAIRS[pair])

    def both() -> dict[str, Any]:
        return {"w1": run(one), "w2": run(two)}

    measure(both, lambda got: workers_figures(got["w1"], got["w2"]))
