"""The tick's fan-out to pvws clients compiled (core/_fanout.c) against the same in Python.

Two sets of pvws sessions watch the same real channels through the same ticks, one splicing
compiled, one in Python (`PvwsSession._splice`): after every tick each pair queued exactly the
same bytes (the same messages, in the same order) and counted the same deliveries. The changes
cover what sends more than the plain value (metadata, severity, a disconnect, a fault, an image
paced to the connection's budget, a string) and subscriptions made and cleared between ticks.
`collect` hands a view's attachments to their clients as the Python loop of `Ticker._emit`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pvwire.core import fanout
from pvwire.core.channel import Channel
from pvwire.core.tick import Ticker
from pvwire.model import VALUE, ConnState, Metadata
from pvwire.pvws.encoder import Entry, PvwsEncoder
from pvwire.pvws.frames import read_text_frame
from pvwire.pvws.pv import Opened, Pv, PvSource
from pvwire.pvws.session import PvwsSession
from pvwire.wire.session import SessionLimits
from pvwire.wire.tokens import Claims

from tests.hub_doubles import FakeBackend

LOOP = asyncio.new_event_loop()  # the ticker's timers are armed on it but never run
IMAGE = Metadata("uint16", 64, "")
SCALAR = Metadata("float64", 1, "d", "mm", 2)


@pytest.fixture(autouse=True, scope="module")
def _close_loop() -> Any:
    yield
    LOOP.close()


@pytest.fixture(autouse=True)
def _compiled() -> None:
    """Every test here fails, none is skipped, where core/_fanout.c is not built."""
    assert fanout.SPLICER is not None and fanout.COLLECT is not None, "`make ext` builds it"


@dataclass
class OneChannel:
    channels: list[Channel]


class Host:
    def __init__(self, channels: dict[str, Channel]) -> None:
        self.channels = channels

    def open(self, name: str, session: PvwsSession, att: int, array: bool) -> Opened:
        view: PvSource = OneChannel([self.channels[name]])
        return Opened(view, Claims((name,), "LATEST", 0.0, 0, 0), may_write=att % 3 == 0)

    def close(self, view: PvSource, session: PvwsSession, att: int) -> None:
        pass


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class World:
    """Channels, and pairs of sessions (compiled, Python) that do the same things."""

    def __init__(self, kinds: list[str], sessions: int, budget: int, image_rate: float) -> None:
        ticker = Ticker(20.0, LOOP, records=False)
        backend = FakeBackend()
        self.clock = Clock()
        self.kinds = kinds
        self.channels: dict[str, Channel] = {}
        for i, kind in enumerate(kinds):
            ch = Channel(f"{'ca' if i % 2 else 'pva'}://c{i}", backend, f"c{i}", ticker)
            ch.on_meta(IMAGE if kind == "image" else SCALAR)
            ch.on_connection(ConnState.CONNECTED)
            self.channels[f"c{i}"] = ch
            self.update(i, 0)
        host = Host(self.channels)
        splicer = fanout.SPLICER(Pv, Channel, Entry, ConnState.CONNECTED, VALUE)  # type: ignore[misc]
        self.pairs: list[tuple[PvwsSession, PvwsSession]] = []
        wall = lambda: 1_700_000_000.5  # noqa: E731  # the disconnect stamps agree
        # One encoder per side, as one endpoint's: a frame one session made serves the others.
        encoders = {
            side: PvwsEncoder(wall=lambda: 1_700_000_000_500_000_000) for side in (splicer, None)
        }
        for n in range(sessions):
            pair = tuple(
                PvwsSession(
                    n, "", host, encoders[s],
                    SessionLimits(send_budget=budget if n % 2 else 1 << 20), lambda: None,
                    clock=self.clock, wall=wall,
                    image_bytes_per_s=image_rate, splicer=s,
                )
                for s in (splicer, None)
            )  # fmt: skip
            self.pairs.append(pair)  # type: ignore[arg-type]

    def update(self, i: int, step: int, severity: int | None = None) -> None:
        """A new value, of the same severity as before unless `severity` says."""
        ch = self.channels[f"c{i}"]
        kind = self.kinds[i]
        value: Any = {
            "float": 1.5 + step,
            "int": 7 + step,
            "string": f"text {step} é",
            "array": np.arange(5.0) + step,
            "image": np.full((4, 8), step, "<u2"),
        }[kind]
        level = ch.severity if severity is None else severity
        ch.on_update(value, 1_700_000_000 + step, i, level, 0, "")

    def change(self, i: int, what: str, step: int) -> None:
        ch = self.channels[f"c{i}"]
        if what == "update":
            self.update(i, step)
        elif what == "alarm":
            self.update(i, step, severity=(ch.severity + 1 + step % 3) % 4)  # another one
        elif what == "meta":
            ch.on_meta(Metadata("float64", 1, f"d{step}", "mm", step % 3))
        elif what == "fault":
            ch.fault = f"value cannot be sent: {step}"
        elif what == "disconnect":
            ch.on_connection(ConnState.DISCONNECTED, "gone")
        else:
            ch.fault = ""
            ch.on_connection(ConnState.CONNECTED)

    def each(self, text: str, only: int | None = None) -> None:
        for n, pair in enumerate(self.pairs):
            for s in pair:
                if only is None or n == only % len(self.pairs):
                    s.receive(text)

    def tick(self, atts: list[int]) -> None:
        self.clock.now += 0.05
        for pair in self.pairs:
            for s in pair:
                for att in atts:
                    if att in s.pvs.by_att:
                        s.collect(att, None)
                s.flush_tick()

    def drained(self, only: int | None = None) -> None:
        """Each pair (pair `only`, or every pair) reads all it queued, both in step: each write
        the same bytes (what a catch-up queues on the way included), the same counts."""
        for n, (compiled, python) in enumerate(self.pairs):
            if only is not None and n != only % len(self.pairs):
                continue
            while True:
                assert compiled._flow._out._items == python._flow._out._items
                assert (compiled.deliveries, compiled.queued_bytes) == (
                    python.deliveries,
                    python.queued_bytes,
                )
                data = compiled.next_frames(4096)
                assert python.next_frames(4096) == data
                if data is None:
                    break
                at = 0
                while at < len(data):
                    text, at = read_text_frame(data, at)
                    json.loads(text)
                compiled.frames_written(len(data))
                python.frames_written(len(data))


KINDS = st.lists(st.sampled_from(["float", "int", "string", "array", "image"]), min_size=1,
                 max_size=6)  # fmt: skip
STEP = st.one_of(
    st.tuples(st.just("change"), st.integers(0, 5),
              st.sampled_from(["update"] * 6 + ["alarm", "meta", "fault", "disconnect",
                                                "connect"])),
    st.tuples(st.just("subscribe"), st.lists(st.integers(0, 5), max_size=3), st.integers(0, 2)),
    st.tuples(st.just("clear"), st.lists(st.integers(0, 5), max_size=2), st.integers(0, 2)),
    st.tuples(st.just("read"), st.just(0), st.integers(0, 2)),
)  # fmt: skip


@given(
    kinds=KINDS,
    sessions=st.integers(2, 3),
    budget=st.sampled_from([1 << 20, 600]),
    image_rate=st.sampled_from([0.0, 1.5e6, 300.0]),
    steps=st.lists(STEP, min_size=1, max_size=30),
)
@settings(max_examples=300, deadline=None)
def test_the_compiled_splice_queues_what_python_queues(
    kinds: list[str], sessions: int, budget: int, image_rate: float, steps: list[Any]
) -> None:
    world = World(kinds, sessions, budget, image_rate)
    names = [f"c{i}" for i in range(len(kinds))]
    world.each(json.dumps({"type": "echo"}))  # clients that read errors
    world.each(json.dumps({"type": "subscribe", "pvs": names}), only=0)
    world.drained()
    for k, (op, arg, what) in enumerate(steps, 1):
        if op == "change":
            i = arg % len(kinds)
            world.change(i, what, k)
            atts = [
                a for s, _ in world.pairs for a, pv in s.pvs.by_att.items() if pv.name == f"c{i}"
            ]
            world.tick(sorted(set(atts)))
        elif op == "subscribe":
            picked = [names[a % len(names)] for a in arg]
            world.each(json.dumps({"type": "subscribe", "pvs": picked}), only=what)
        elif op == "clear":
            picked = [names[a % len(names)] for a in arg]
            world.each(json.dumps({"type": "clear", "pvs": picked}), only=what)
        else:
            world.drained(only=what)
        for compiled, python in world.pairs:
            assert compiled._flow._out._items == python._flow._out._items
    world.drained()


@pytest.mark.parametrize("change", ["alarm", "meta"])
@pytest.mark.parametrize("image_rate", [0.0, 1.5e6])
def test_a_client_that_missed_a_change_gets_it_with_the_value_others_share(
    change: str, image_rate: float
) -> None:
    """B falls behind across a change of severity (or metadata); A, not behind, shares the plain
    frame of the next value; B's catch-up must carry the change all the same."""
    world = World(["float"] * 3, 2, 300, image_rate)  # pair 1 has the small budget
    names = ["c0", "c1", "c2"]
    world.each(json.dumps({"type": "echo"}))
    world.each(json.dumps({"type": "subscribe", "pvs": names}))
    world.drained(only=0)
    for k in range(1, 6):  # B reads nothing: behind
        world.update(0, k)
        world.tick([1])
    (_, _), (b, b_python) = world.pairs
    assert b.behind and b_python.behind
    world.change(0, change, 10)
    world.tick([1])
    world.update(0, 11)  # nothing else changed: plain for A, whose frame B's catch-up meets
    world.tick([1])
    world.drained()
    pv = b.pvs["c0"]
    assert pv.level == pv.ch.severity and pv.meta is pv.ch.meta


def test_a_tick_of_plain_values_is_spliced_without_python() -> None:
    """The common case never calls the session's Python: `slow` is not called once each
    channel's frame is made."""
    world = World(["float"] * 4, 1, 1 << 20, 1.5e6)
    world.each(json.dumps({"type": "subscribe", "pvs": ["c0", "c1", "c2", "c3"]}))
    world.drained()
    for i in range(4):
        world.update(i, 1)
    compiled, python = world.pairs[0]
    python.flush_tick()  # nothing collected: nothing sent
    for i in range(4):  # the frames of this state, made once by the Python side's encoder
        pv = compiled.pvs[f"c{i}"]
        assert pv.entry is not None
        compiled._encoder.value_frame(pv.name, pv.ch)
    calls: list[int] = []
    splicer = fanout.SPLICER(Pv, Channel, Entry, ConnState.CONNECTED, VALUE)  # type: ignore[misc]
    data, count = splicer.splice([1, 2, 3, 4], compiled.pvs.by_att, True, calls.append)
    assert count == 4 and calls == []
    assert data == b"".join(compiled.pvs[f"c{i}"].entry.plain_frame for i in range(4))  # type: ignore[union-attr]


class Slotted:
    __slots__ = ("collected", "number")

    def __init__(self, number: int) -> None:
        self.number = number
        self.collected: list[int] = []


class Plain:
    def __init__(self, number: int) -> None:
        self.number = number
        self.got: list[int] = []

    def collect(self, att: int, view: object) -> bool:
        first = not self.got
        self.got.append(att)
        return first


def test_collect_hands_each_attachment_to_its_client_as_the_python_loop_does() -> None:
    a, b, c = Slotted(1), Plain(2), Slotted(3)
    attachments = {(a, 1): None, (b, 7): None, (a, 2): None, (c, 5): None, (b, 8): None}
    touched: list[object] = []
    view = object()
    seen: list[tuple[object, int, object]] = []

    def fallback(client: Plain, att: int, v: object) -> bool:
        seen.append((client, att, v))
        return client.collect(att, v)

    assert fanout.COLLECT is not None
    fanout.COLLECT(attachments, touched, view, fallback)
    assert touched == [a, b, c]
    assert a.collected == [1, 2] and c.collected == [5] and b.got == [7, 8]
    assert seen == [(b, 7, view), (b, 8, view)]
    fanout.COLLECT(attachments, touched, view, fallback)  # not empty now: not touched again
    assert touched == [a, b, c] and a.collected == [1, 2, 1, 2]
    with pytest.raises(TypeError):
        fanout.COLLECT({(a,): None}, touched, view, fallback)


def test_a_view_whose_attachments_change_during_collect_is_an_error() -> None:
    b = Plain(2)
    attachments: dict[Any, None] = {(b, 1): None, (b, 2): None}

    def fallback(client: Plain, att: int, v: object) -> bool:
        attachments[(client, att + 10)] = None
        return False

    assert fanout.COLLECT is not None
    with pytest.raises(RuntimeError, match="attachments changed"):
        fanout.COLLECT(attachments, [], None, fallback)
