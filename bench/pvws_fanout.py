"""pvws's per-delivery work with distinct screens, compiled (core/_fanout.c) against Python.

    .venv/bin/python -m bench.pvws_fanout [--screens 500] [--per-screen 200] [--pvs 2000]

In process, no sockets: `screens` pvws sessions, each subscribed to its own seeded random
`per-screen` of `pvs` sim-like channels (one one-channel view per channel, shared by its
sessions, as the hub opens them), a tenth of the channels updated per round (a 20 ms tick of
10 Hz counters), then the whole tick (`Ticker.tick`: route, emit, hand each change to each
attached session, each session's flush) and each session's write (`next_frames`,
`frames_written`). Prints ns per delivered update for each path, measured alternately in one
run, and checks that both paths write the same bytes. Load-independent alternative:
`valgrind --tool=callgrind .venv/bin/python -m bench.pvws_fanout --rounds 3`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

from pvwire.core import fanout
from pvwire.core.channel import Channel
from pvwire.core.tick import Ticker
from pvwire.core.view import View, ViewKey
from pvwire.model import VALUE, ConnState, Metadata
from pvwire.pvws.encoder import Entry, PvwsEncoder
from pvwire.pvws.pv import Opened, Pv, PvSource
from pvwire.pvws.session import PvwsSession
from pvwire.wire.session import SessionLimits
from pvwire.wire.tokens import Claims

from tests.hub_doubles import FakeBackend


class Host:
    """One view per channel, linked once and attached by every session of it."""

    def __init__(self, channels: dict[str, Channel]) -> None:
        self.channels = channels
        self.views: dict[str, View] = {}

    def open(self, name: str, session: PvwsSession, att: int, array: bool) -> Opened:
        view = self.views.get(name)
        if view is None:
            ch = self.channels[name]
            view = self.views[name] = View(ViewKey((ch.id,), "LATEST", 0.0), [ch])
            view.link()
        view.attachments[(session, att)] = None  # type: ignore[index]
        source: PvSource = view  # type: ignore[assignment]
        return Opened(source, Claims((name,), "LATEST", 0.0, 0, 0), may_write=False)

    def close(self, view: PvSource, session: PvwsSession, att: int) -> None:
        del view.attachments[(session, att)]  # type: ignore[attr-defined]


def build(
    loop: asyncio.AbstractEventLoop, screens: int, per_screen: int, pvs: int, compiled: bool
) -> tuple[Ticker, list[Channel], list[PvwsSession]]:
    ticker = Ticker(20.0, loop, records=False)  # `loop` never runs: its timer never fires
    backend = FakeBackend()
    channels = {f"c{i}": Channel(f"sim://c{i}", backend, f"c{i}", ticker) for i in range(pvs)}
    for i, ch in enumerate(channels.values()):
        ch.on_meta(Metadata("float64", 1, "counter", "", 0))
        ch.on_connection(ConnState.CONNECTED)
        ch.on_update(0.0, 1_700_000_000, i, 0, 0, "")
    host = Host(channels)
    encoder = PvwsEncoder()
    splicer = fanout.SPLICER(Pv, Channel, Entry, ConnState.CONNECTED, VALUE) if compiled else None
    rng = random.Random(43)
    sessions = []
    for n in range(screens):
        s = PvwsSession(
            n, "", host, encoder, SessionLimits(send_budget=1 << 30), lambda: None,
            image_bytes_per_s=1.5e6, splicer=splicer,
        )  # fmt: skip
        for name in rng.sample(sorted(channels), per_screen):
            s.receive(json.dumps({"type": "subscribe", "pvs": [name]}))
        sessions.append(s)
    return ticker, list(channels.values()), sessions


def one_round(
    ticker: Ticker, channels: list[Channel], sessions: list[PvwsSession], round_: int
) -> tuple[int, list[bytes]]:
    """One tick of a tenth of the channels changed, and every session's write: deliveries and
    what each session wrote."""
    step = round_ % 10
    for i in range(step, len(channels), 10):
        channels[i].on_update(float(round_ * 7 + i), 1_700_000_000 + round_, i, 0, 0, "")
    before = sum(s.deliveries for s in sessions)
    ticker.tick()
    writes = []
    for s in sessions:
        data = s.next_frames(1 << 30)
        if data is not None:
            s.frames_written(len(data))
            writes.append(data)
    return sum(s.deliveries for s in sessions) - before, writes


def measure(screens: int, per_screen: int, pvs: int, rounds: int) -> dict[str, Any]:
    if fanout.SPLICER is None or fanout.COLLECT is None:
        raise SystemExit("core/_fanout.c is not built: `make ext`")
    loop = asyncio.new_event_loop()
    collect = fanout.COLLECT
    worlds = {c: build(loop, screens, per_screen, pvs, c) for c in (True, False)}
    for ticker, channels, sessions in worlds.values():
        for s in sessions:  # the first values
            while (data := s.next_frames(1 << 30)) is not None:
                s.frames_written(len(data))
        one_round(ticker, channels, sessions, 0)  # every channel changed at its start
    spent = {True: 0.0, False: 0.0}
    delivered = {True: 0, False: 0}
    try:
        for r in range(1, rounds + 1):
            got = {}
            for compiled in (True, False) if r % 2 else (False, True):
                fanout.COLLECT = collect if compiled else None
                ticker, channels, sessions = worlds[compiled]
                t0 = time.process_time()
                n, writes = one_round(ticker, channels, sessions, r)
                spent[compiled] += time.process_time() - t0
                delivered[compiled] += n
                got[compiled] = writes
            if got[True] != got[False]:
                raise SystemExit(f"round {r}: the compiled path wrote other bytes")
    finally:
        fanout.COLLECT = collect
        loop.close()
    return {
        "screens": screens,
        "per_screen": per_screen,
        "pvs": pvs,
        "deliveries_per_round": delivered[True] / rounds,
        "compiled_ns": 1e9 * spent[True] / delivered[True],
        "python_ns": 1e9 * spent[False] / delivered[False],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--screens", type=int, default=500)
    p.add_argument("--per-screen", type=int, default=200)
    p.add_argument("--pvs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    print(json.dumps(measure(a.screens, a.per_screen, a.pvs, a.rounds), indent=1))


if __name__ == "__main__":
    main()
