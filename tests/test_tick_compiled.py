"""The tick's routing and splicing compiled (core/_tick.c) against the same in Python.

Two identical worlds of channels and views go through the same ticks, one with the compiled
`Router`, one without: after each tick every view holds the same pending masks, emits the same
masks and the same entries (LATEST entries may come in another order: the compiled route reads
a view's channels in sid order), and the compiled entries are exactly what `encode_entries`
makes of them in their order.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pvwire.core import view as view_module
from pvwire.core.channel import Channel
from pvwire.core.reduce import NO_REDUCTION, Reduction
from pvwire.core.tick import Ticker
from pvwire.core.view import View, ViewKey
from pvwire.model import META, ConnState, Metadata
from pvwire.wire import codec as wire

from tests.hub_doubles import FakeBackend

ROUTER = view_module.ROUTER

VALUES: list[Any] = [1.5, 7, "text", np.arange(20.0), np.ones((4, 6), "<u2")]
LOOP = asyncio.new_event_loop()  # the tickers' timers are armed on it but never run


@pytest.fixture(autouse=True, scope="module")
def _close_loop() -> Any:
    yield
    LOOP.close()


@pytest.fixture(autouse=True)
def _compiled() -> None:
    """Every test here fails, none is skipped, where core/_tick.c is not built: the Python
    path compared with itself would pass whatever the compiled one does."""
    assert ROUTER is not None, "core/_tick.c is not built (`make ext` builds it)"


class World:
    """Channels and views linked as the registry links them, ticked by hand."""

    def __init__(self, kinds: list[int], views: list[dict[str, Any]]) -> None:
        self.ticker = Ticker(20.0, LOOP, records=False)
        backend = FakeBackend()
        self.kinds = kinds
        self.channels = []
        for i, _ in enumerate(kinds):
            ch = Channel(f"sim://c{i}", backend, f"c{i}", self.ticker)
            ch.on_meta(Metadata("float64", 1, "", "", 0))
            ch.on_connection(ConnState.CONNECTED)
            self.channels.append(ch)
        self.views = []
        for v in views:
            chans = [self.channels[i] for i in v["sids"]]
            key = ViewKey(
                tuple(c.id for c in chans), v["mode"], v["rate"], v["reduction"], v["writes"]
            )
            view = View(key, chans)
            view.link()
            self.views.append(view)

    def change(self, i: int, what: str, step: int) -> None:
        ch = self.channels[i]
        if what == "update":
            value = VALUES[self.kinds[i]]
            value = value + step if not isinstance(value, str) else f"{value}{step}"
            ch.on_update(value, 1_700_000_000 + step, i, 0, 0, "")
        elif what == "alarm":
            ch.on_update(VALUES[0] + step, 1_700_000_000 + step, i, 2, 3, "HIGH")
        elif what == "meta":
            ch.on_meta(Metadata("float64", 1, f"u{step}", "", 0))
        else:
            ch.on_connection(ConnState.DISCONNECTED, "gone")
            ch.on_connection(ConnState.CONNECTED)

    def tick(self, compiled: bool, now: float) -> list[tuple[dict[int, int], Any]]:
        """Route and emit as `Ticker.tick` does; each view's pending after the route, and
        what it emitted (masks, entries) if it was due."""
        router = ROUTER if compiled else None
        view_module.ROUTER = router
        try:
            dirty, self.ticker._dirty = self.ticker._dirty, []
            active, self.ticker._waiting = self.ticker._waiting, {}
            self.ticker._route_all(dirty, active)
            out: list[tuple[dict[int, int], Any]] = []
            for view in self.views:
                pending = dict(view.pending)
                emitted = None
                if view in active and view.pending and view.due(now):
                    view.emit(now)
                    entries = view.tick_entries
                    if compiled and not view.all_mode:
                        _check_spliced(view, entries)
                    emitted = (view.tick_masks, _decoded(view, entries))
                elif view in active and view.pending:
                    self.ticker._waiting[view] = None
                out.append((pending, emitted))
            return out
        finally:
            if ROUTER is not None:
                ROUTER.forget()
            view_module.ROUTER = ROUTER


def _decoded(view: View, entries: wire.Entries) -> Any:
    items = msgpack.unpackb(
        entries.head + entries.data, strict_map_key=False, ext_hook=lambda c, d: (c, d)
    )
    assert len(items) == entries.length
    return items if view.all_mode else {e[0]: e for e in items}


def _check_spliced(view: View, entries: wire.Entries) -> None:
    """The compiled entries are `encode_entries` of the same bodies in their order."""
    order = [e[0] for e in msgpack.unpackb(entries.head + entries.data, ext_hook=lambda c, d: 0)]
    masks = view.tick_masks
    assert sorted(order) == sorted(masks)
    r = view.reduction
    bodies = [view.channels[s].body(masks[s], True, r, view.writes[s] == 1) for s in order]
    assert entries == wire.encode_entries(order, bodies)


views_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "sids": st.lists(st.integers(0, 5), min_size=1, max_size=8),
            "mode": st.sampled_from(["LATEST", "LATEST", "ALL"]),
            "rate": st.sampled_from([0.0, 0.0, 4.0]),
            "reduction": st.sampled_from([NO_REDUCTION, NO_REDUCTION, Reduction(columns=3)]),
            "writes": st.booleans(),
        }
    ),
    min_size=1,
    max_size=6,
)
CHANGES = ["update", "update", "alarm", "meta", "conn"]
ticks_strategy = st.lists(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(CHANGES)),
        max_size=10,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    kinds=st.lists(st.integers(0, len(VALUES) - 1), min_size=6, max_size=6),
    views=views_strategy,
    ticks=ticks_strategy,
)
def test_compiled_and_python_ticks_give_every_view_the_same(
    kinds: list[int], views: list[dict[str, Any]], ticks: list[list[tuple[int, str]]]
) -> None:
    for v in views:
        if v["mode"] == "ALL":
            v["reduction"] = NO_REDUCTION  # the GraphQL layer refuses a reduced ALL view
        v["writes"] = bytes(s % 2 for s in range(len(v["sids"]))) if v["writes"] else b""
    worlds = [World(kinds, views), World(kinds, views)]
    for step, changes in enumerate(ticks):
        now = 0.1 * step
        for world in worlds:
            for i, what in changes:
                world.change(i, what, step)
        compiled, python = (w.tick(c, now) for w, c in zip(worlds, (True, False), strict=True))
        assert compiled == python
        assert not worlds[0].ticker.stats.failures  # the compiled route took every change
        for world in worlds:
            assert all(ch.dirty == 0 and not ch.history for ch in world.channels)


def test_entries_read_after_the_tick_are_the_channels_current_state() -> None:
    """A session catching up after the tick reads what the channel holds now, not the body the
    tick made: the tick's changes are let go when it ends."""
    world = World(
        [0, 0],
        [{"sids": [0, 1], "mode": "LATEST", "rate": 0.0, "reduction": NO_REDUCTION, "writes": b""}],
    )
    world.change(0, "update", 1)
    world.change(1, "update", 1)
    world.tick(True, 0.0)
    world.change(0, "update", 2)  # after the tick: the channel's cache holds the new value
    got = _decoded(world.views[0], world.views[0].entries_for({0: 3, 1: 3}))
    assert got[0][2] == VALUES[0] + 2 and got[1][2] == VALUES[0] + 1


def test_a_view_holding_a_channel_twice_is_told_at_both_sids_and_unlinks_cleanly() -> None:
    world = World(
        [0, 1],
        [
            {
                "sids": [0, 1, 0],
                "mode": "LATEST",
                "rate": 0.0,
                "reduction": NO_REDUCTION,
                "writes": b"",
            }
        ],
    )
    view, (c0, c1) = world.views[0], world.channels
    assert c0.latest_views == {view: 2} and c1.latest_views == {view: 1}
    world.tick(True, 0.0)  # their connection and metadata
    world.change(0, "update", 1)
    [(pending, emitted)] = world.tick(True, 0.0)
    assert set(pending) == {0, 2} and emitted is not None
    view.unlink()
    assert c0.latest_views == {} and c1.latest_views == {} and not c0.views and not c1.views


def test_channels_listed_under_one_number_still_reach_every_view() -> None:
    """A channel's number is held by it alone while the registry keeps it; should two changed
    channels share one all the same (a channel closed, then changed by a late callback), the
    compiled route reads each channel's own mask, as Python does."""
    views = [
        {
            "sids": [0, 1, 2],
            "mode": "LATEST",
            "rate": 0.0,
            "reduction": NO_REDUCTION,
            "writes": b"",
        },
        {"sids": [1], "mode": "LATEST", "rate": 0.0, "reduction": NO_REDUCTION, "writes": b""},
    ]
    worlds = [World([0, 1, 2], views), World([0, 1, 2], views)]
    for world in worlds:
        world.channels[1].number = world.channels[0].number  # numbers[] keeps the old one
        world.tick(True, 0.0)
    for world in worlds:
        world.change(0, "update", 1)
        world.change(1, "alarm", 1)
    compiled, python = worlds[0].tick(True, 0.1), worlds[1].tick(False, 0.1)
    assert compiled == python
    assert [sorted(p) for p, _ in compiled] == [[0, 1], [0]]


def test_a_closed_channel_s_number_goes_to_the_next_channel() -> None:
    world = World([0], [])
    (ch,) = world.channels
    number = ch.number
    ch.retire()
    assert ch.number == -1
    ch.retire()  # once only
    assert Channel("sim://next", FakeBackend(), "next", world.ticker).number == number
    assert Channel("sim://after", FakeBackend(), "after", world.ticker).number != number


def test_a_failing_all_mode_view_fails_alone(caplog: pytest.LogCaptureFixture) -> None:
    """`add_change` raising for one ALL-mode view: that view fails (its clients are closed to
    resume), every other view still gets the change, through the compiled route."""

    class BrokenView(View):
        __slots__ = ()

        def add_change(self, sid: int, mask: int, channel: Channel) -> bool:
            raise RuntimeError("broken view")

    world = World(
        [0],
        [
            {"sids": [0], "mode": "LATEST", "rate": 0.0, "reduction": NO_REDUCTION, "writes": b""},
        ],
    )
    (fine,) = world.views
    broken = BrokenView(ViewKey(fine.key.ids, "ALL", 0.0), fine.channels)
    broken.link()
    world.views.insert(0, broken)
    world.tick(True, 0.0)  # the connection and metadata: the broken view fails once already
    world.ticker.stats.failures.clear()
    world.change(0, "update", 1)
    with caplog.at_level(logging.ERROR, logger="pvwire.tick"):
        [_, (pending, emitted)] = world.tick(True, 0.0)
    assert pending == {0: fine.tick_masks[0]} and emitted is not None
    assert world.ticker.stats.failures == {"view": 1}
    assert "broken view" in caplog.text


def test_what_the_compiled_route_refuses_python_routes(caplog: pytest.LogCaptureFixture) -> None:
    """A dirty channel of another class stops the compiled route with its channels still dirty;
    the tick logs it once, counts it, and routes them all in Python: no view misses a change."""

    class OtherChannel(Channel):
        __slots__ = ()

    world = World(
        [0, 0],
        [{"sids": [0, 1], "mode": "LATEST", "rate": 0.0, "reduction": NO_REDUCTION, "writes": b""}],
    )
    odd = OtherChannel("sim://odd", FakeBackend(), "odd", world.ticker)
    odd.on_connection(ConnState.CONNECTED)
    view = View(ViewKey(("sim://odd",), "LATEST", 0.0), [odd])
    view.link()
    world.views.append(view)
    world.change(0, "update", 1)
    odd.on_update(5.0, 1_700_000_001, 0, 0, 0, "")
    world.change(1, "update", 1)
    with caplog.at_level(logging.ERROR, logger="pvwire.tick"):
        out = world.tick(True, 0.0)
    assert [sorted(p) for p, _ in out] == [[0, 1], [0]]
    assert all(e is not None for _, e in out)
    assert world.ticker.stats.failures == {"view": 1}
    assert "routing the tick's changes failed" in caplog.text
    assert odd.dirty == 0 and all(ch.dirty == 0 for ch in world.channels)


def test_the_router_takes_only_classes_with_these_slots() -> None:
    """As the journal's `Pending` and `Rings` (core/_slots.h): a name the class lacks, or one
    that is not a writable slot of its own, refuses the class."""
    assert ROUTER is not None
    with pytest.raises(AttributeError, match="pending"):
        type(ROUTER)(Channel, Channel, META)

    class Sub(View):  # its slots are View's, not its own: instances lay them out as View does
        __slots__ = ()

    with pytest.raises(TypeError, match=r"Router: Sub\.pending is not a writable slot of its own"):
        type(ROUTER)(Channel, Sub, META)


def test_all_mode_views_get_each_update_once_when_python_routes_what_the_compiled_route_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The compiled route stops at a channel it does not take after it handed the channels
    before it to their ALL-mode views: Python routes what is still dirty, and those views get
    each update once, as without the compiled route (LATEST views merge masks, where twice is
    once; ALL-mode views append every update)."""

    class OtherChannel(Channel):
        __slots__ = ()

    spec = {"mode": "ALL", "rate": 0.0, "reduction": NO_REDUCTION, "writes": b""}
    latest = {**spec, "mode": "LATEST", "sids": [0, 1]}
    views = [{**spec, "sids": [0, 1]}, {**spec, "sids": [1, 0, 1]}, latest]
    worlds = [World([0, 0], views), World([0, 0], views)]
    for world in worlds:
        odd = OtherChannel("sim://odd", FakeBackend(), "odd", world.ticker)
        odd.on_connection(ConnState.CONNECTED)
        view = View(ViewKey(("sim://odd",), "ALL", 0.0), [odd])
        view.link()
        world.views.append(view)
        world.tick(False, 0.0)  # connections and metadata
        for step in (1, 2):  # two updates of each channel within the tick, in upstream order
            world.change(0, "update", step)
            world.change(1, "update", step)
        odd.on_update(5.0, 1_700_000_001, 0, 0, 0, "")  # listed after them: the route stops
    with caplog.at_level(logging.ERROR, logger="pvwire.tick"):
        compiled = worlds[0].tick(True, 0.1)
    assert worlds[0].ticker.stats.failures == {"view": 1}
    assert "routing the tick's changes failed" in caplog.text
    assert compiled == worlds[1].tick(False, 0.1)
    emitted = compiled[0][1]
    assert emitted is not None
    once = [VALUES[0] + 1, VALUES[0] + 2]
    assert [e[2] for e in emitted[1] if e[0] == 0] == once
    assert [e[2] for e in emitted[1] if e[0] == 1] == once


class Resizing:
    """A view's channel whose body, made at the splice, grows or shrinks the view's channel
    list first: the splice must read only sids that both its list and its numbers still hold."""

    def __init__(self, real: Channel, view: View, grow: bool) -> None:
        self.real, self.view, self.grow, self.number = real, view, grow, real.number

    def body(self, mask: int, cache: bool, reduction: Any, writes: bool) -> wire.EntryBody:
        channels = self.view.channels
        if self.grow:
            channels += [self.real] * 4
        else:
            del channels[1:]
        return self.real.body(mask, cache, reduction, writes)


@pytest.mark.parametrize("grow", [True, False])
def test_a_splice_reads_no_sid_past_the_channels_it_was_given(grow: bool) -> None:
    assert ROUTER is not None
    world = World([0, 0], [])
    a, b = world.channels
    view = View(ViewKey((a.id, b.id), "LATEST", 0.0), [a, b])
    view.channels[0] = Resizing(a, view, grow)  # type: ignore[call-overload]
    view.writes = bytes(6)  # one per sid of the list grown: only the numbers bound sid 2
    world.tick(False, 0.0)
    with pytest.raises(IndexError, match=r"sid [12] out of range"):
        ROUTER.splice(view, {0: META, 1 if not grow else 2: META})
    view.channels[:] = [a, b]
    assert len(ROUTER.splice(view, {0: META, 1: META})[0]) > 0
