"""The tick's per-delivery work with distinct screens, compiled (core/_tick.c) against Python.

    .venv/bin/python -m bench.tick_route [--screens 500] [--per-screen 200] [--pvs 2000]

In process, no sockets: `screens` views of their own seeded random `per-screen` of `pvs` sim-like
channels, every channel updated once per round, then the tick's two steps that run once per
delivered update: routing each change to each view that holds the channel (`Ticker._route_all`)
and splicing each view's entries (`View.entries_for`, what `tick_entries` calls). Prints ns per
delivered update for each step and path, measured alternately in one run, and checks that both
paths make the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import TYPE_CHECKING

from pvwire.core import view as view_module
from pvwire.core.channel import Channel
from pvwire.core.tick import Ticker
from pvwire.core.view import View, ViewKey

from tests.hub_doubles import FakeBackend

if TYPE_CHECKING:
    from pvwire.core._tick import Router


def build(
    loop: asyncio.AbstractEventLoop, screens: int, per_screen: int, pvs: int
) -> tuple[Ticker, list[Channel], list[View]]:
    ticker = Ticker(20.0, loop, records=False)  # `loop` never runs: its timer never fires
    backend = FakeBackend()
    channels = [Channel(f"sim://c{i}", backend, f"c{i}", ticker) for i in range(pvs)]
    rng = random.Random(36)
    views = []
    for _ in range(screens):
        mine = [channels[i] for i in rng.sample(range(pvs), per_screen)]
        view = View(ViewKey(tuple(ch.id for ch in mine), "LATEST", 0.0), mine)
        view.link()
        views.append(view)
    return ticker, channels, views


def update(channels: list[Channel], round_: int, ticker: Ticker) -> list[Channel]:
    ticker._dirty = []
    for i, ch in enumerate(channels):
        ch.on_update(float(round_ * 7 + i), 1_700_000_000 + round_, i, 0, 0, "")
    return ticker._dirty


def measure(screens: int, per_screen: int, pvs: int, rounds: int) -> dict[str, float]:
    """ns per delivered update of each step and path, `rounds` ticks of each, alternating."""
    router = view_module.ROUTER
    if router is None:
        raise SystemExit("core/_tick.c is not built: `make ext`")
    loop = asyncio.new_event_loop()
    try:
        return _measure(loop, router, screens, per_screen, pvs, rounds)
    finally:
        loop.close()


def _measure(
    loop: asyncio.AbstractEventLoop,
    router: Router,
    screens: int,
    per_screen: int,
    pvs: int,
    rounds: int,
) -> dict[str, float]:
    ticker, channels, views = build(loop, screens, per_screen, pvs)
    deliveries = screens * per_screen
    spent: dict[str, float] = {}

    def one_round(r: int, compiled: bool) -> dict[View, bytes]:
        dirty = update(channels, r, ticker)
        active: dict[View, None] = {}
        view_module.ROUTER = router if compiled else None
        path = "compiled" if compiled else "python"
        try:
            t0 = time.perf_counter()
            ticker._route_all(dirty, active)
            t1 = time.perf_counter()
            for view in active:
                view.emit(0.0)
            t2 = time.perf_counter()
            made = {view: view.entries_for(view.tick_masks).data for view in active}
            t3 = time.perf_counter()
        finally:
            view_module.ROUTER = router
        spent[f"route_{path}"] = spent.get(f"route_{path}", 0.0) + t1 - t0
        spent[f"splice_{path}"] = spent.get(f"splice_{path}", 0.0) + t3 - t2
        return made

    for r in range(2 * rounds):
        compiled = r % 2 == 0
        made = one_round(r, compiled)
        # The same state through the other path (still within the tick): the same bytes.
        view_module.ROUTER = None if compiled else router
        try:
            other = {v: v.entries_for(v.tick_masks).data for v in made}
        finally:
            view_module.ROUTER = router
            router.forget()  # the tick is over, as Ticker.tick ends it
        assert made == other and len(made) == len(views)
    out = {f"{k}_ns": round(v / rounds / deliveries * 1e9, 1) for k, v in sorted(spent.items())}
    out["deliveries_per_round"] = deliveries
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--screens", type=int, default=500)
    p.add_argument("--per-screen", type=int, default=200)
    p.add_argument("--pvs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    print(json.dumps(measure(a.screens, a.per_screen, a.pvs, a.rounds), indent=1))


if __name__ == "__main__":
    main()
