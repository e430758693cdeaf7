"""The load scenarios (bench/scenario.py) as pytest-benchmark tests: `make bench`.

Each scenario runs the real server against a real IOC (or sim channels) with load clients, then,
on the same IOC, the plain upstream library with a trivial callback (the floor: aioca's
`camonitor` or p4p's asyncio client) and, where bench/README.md compares them, Coniql 0.4.2
(`make coniql`). Its figures (updates/s delivered, CPU per update, the ratios to the floor and to
Coniql measured in that one run) are in `extra_info`; nothing is asserted about them.
The workers pairs run 1 and 2 workers back to back and record the ratios 2 / 1; the history
pairs run one scenario with recent history on and off, interleaved (bench/history_cost.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from . import history_cost
from .conftest import Measure, flatten
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


@pytest.mark.parametrize("name", list(history_cost.SCENARIOS))
def test_history_cost(measure: Measure, quick: bool, name: str) -> None:
    """The same scenario with the server's default history and with `--history-mb 0`,
    interleaved: server CPU per delivered update of each side, what recording adds, the spreads."""
    got = measure(
        lambda: history_cost.measure(history_cost.scenario(name, quick), 1 if quick else 3),
        flatten,
    )
    check_history_wiring(got)


def check_history_wiring(got: Mapping[str, Any]) -> None:
    """Not a timing assertion: every channel of an "on" run had a history, none of an "off" one."""
    pvs = got["pvs"]
    assert got["on"]["history_channels_min"] == pvs, got["on"]
    assert got["on"]["history_refused_max"] == 0, got["on"]
    assert got["off"]["history_channels_max"] == 0, got["off"]
    assert got["off"]["history_bytes_max"] == 0, got["off"]
