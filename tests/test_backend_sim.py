"""SimBackend: parsing, every kind, writable instances and rate groups."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from pvwire.errors import BadChannelId, ReadOnlyChannel, TypeMismatch
from pvwire.model import ConnState, Metadata, Value
from pvwire.upstream import sim as sim_module
from pvwire.upstream import sim_image
from pvwire.upstream.sim import KINDS, SimBackend, SimLimits, parse_sim

from tests.conftest import RecordingSink
from tests.eventually import eventually_async


@pytest.fixture
async def sim() -> AsyncIterator[SimBackend]:
    backend = SimBackend()
    yield backend
    await backend.close()


def test_parse_defaults_label_and_params() -> None:
    spec = parse_sim("sine/A?period=5&amplitude=2")
    assert (spec.kind, spec.label) == ("sine", "A")
    assert spec.params["period"] == 5.0 and spec.params["amplitude"] == 2.0
    assert spec.params["offset"] == 0.0 and spec.rate == 10.0
    assert parse_sim("enum?choices=a,b,c").params["choices"] == "a,b,c"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("bogus", "unknown sim kind 'bogus'"),
        ("sine?rate=abc", "rate='abc' is not a number"),
        ("sine?colour=red", "unknown parameter 'colour'"),
        ("sine?rate=0", "rate must be"),
        ("ramp?min=5&max=1", "min <= max"),
        ("ramp?step=0", "a step other than 0"),
        ("waveform?shape=square", "shape must be"),
        ("waveform?length=0", "length must be"),
        ("enum?choices=", "at least one choice"),
    ],
)
async def test_bad_ids_fail_with_reason(sim: SimBackend, name: str, reason: str) -> None:
    with pytest.raises(BadChannelId, match=reason):
        await sim.get(name, 1.0)
    sink = RecordingSink()
    mon = sim.monitor(name, sink)
    await sink.wait(lambda: sink.states)
    state, why = sink.states[0]
    assert state == ConnState.FAILED and reason in why and name in why
    mon.close()


@pytest.mark.parametrize("kind", [k for k in KINDS])
async def test_every_kind_gets_with_metadata(sim: SimBackend, kind: str) -> None:
    r = await sim.get(kind, 1.0)
    assert isinstance(r.meta, Metadata) and r.meta.type is not None
    assert r.meta.writable is (kind in ("value", "string"))
    assert abs(r.seconds + r.nanoseconds * 1e-9 - time.time()) < 5
    expected: dict[str, type] = {
        "counter": int, "enum": int, "string": str, "strings": str,
        "waveform": np.ndarray, "wave": np.ndarray, "image": np.ndarray,
    }  # fmt: skip
    assert isinstance(r.value, expected.get(kind, float))


async def test_counter_counts_from_zero_and_its_timer_stops_with_its_last_channel(
    sim: SimBackend,
) -> None:
    # Order, timestamps and silence after close(): tests/test_backend_contract.py.
    sink = RecordingSink()
    mon = sim.monitor("counter?rate=50", sink)
    try:
        await sink.wait(lambda: len(sink.updates) >= 5)
        assert sink.metas[0].type == "int64" and sink.metas[0].writable is False
        assert sink.numbers()[:5] == [0, 1, 2, 3, 4]
        assert sim.groups
    finally:
        mon.close()
    assert not sim.groups, "the last channel of a rate stops its timer"


async def test_periodic_kinds_update(sim: SimBackend) -> None:
    names = [
        "sine?rate=50&amplitude=2",
        "ramp?rate=50&min=0&max=3",
        "noise?rate=50",
        "waveform?rate=50&length=100",
        "enum?rate=50&choices=a,b,c",
    ]
    sinks = [RecordingSink() for _ in names]
    mons = [sim.monitor(n, s) for n, s in zip(names, sinks, strict=True)]
    try:
        await eventually_async(lambda: all(len(s.updates) >= 6 for s in sinks), "6 updates each")
        sine, ramp, noise, wave, enum = sinks
        assert all(-2 <= v <= 2 for v in sine.numbers())
        assert sine.metas[0].display == (-2.0, 2.0)
        assert {u.value for u in ramp.updates} <= {0.0, 1.0, 2.0, 3.0}
        assert len({u.value for u in noise.updates}) > 1
        w: Value = wave.updates[-1].value
        assert isinstance(w, np.ndarray) and w.dtype == np.float64 and w.shape == (100,)
        assert wave.metas[0].count == 100
        assert enum.metas[0].choices == ("a", "b", "c")
        assert {u.value for u in enum.updates} == {0, 1, 2}
        assert len(sim.groups) == 1, "all rate-50 channels share one timer"
    finally:
        for m in mons:
            m.close()


async def test_value_and_string_are_writable_instances(sim: SimBackend) -> None:
    a, b = RecordingSink(), RecordingSink()
    ma, mb = sim.monitor("value/A", a), sim.monitor("value/B", b)
    try:
        await a.wait(lambda: a.updates)
        await b.wait(lambda: b.updates)
        assert a.metas[0].writable is True and a.updates[0].value == 0.0
        await sim.put("value/A", "3.5", True, 1.0)
        await a.wait(lambda: a.updates[-1].value == 3.5)
        assert (await sim.get("value/A", 1.0)).value == 3.5
        assert (await sim.get("value/B", 1.0)).value == 0.0
        assert len(b.updates) == 1
        with pytest.raises(TypeMismatch, match=r"cannot write 'abc' to sim://value/A \(float64\)"):
            await sim.put("value/A", "abc", True, 1.0)
        await sim.put("string/S", "hi", True, 1.0)
        assert (await sim.get("string/S", 1.0)).value == "hi"
        with pytest.raises(ReadOnlyChannel):
            await sim.put("sine", 1.0, True, 1.0)
    finally:
        ma.close()
        mb.close()


async def test_stores_past_the_bound_forget_the_least_recently_written_unmonitored() -> None:
    sim = SimBackend(SimLimits(max_stores=2))
    await sim.put("value/A", 1.0, True, 1.0)
    await sim.put("value/B", 2.0, True, 1.0)
    await sim.put("value/A", 3.0, True, 1.0)  # B is now the least recently written
    await sim.put("value/C", 4.0, True, 1.0)
    assert list(sim.stores) == ["value/A", "value/C"]
    assert (await sim.get("value/B", 1.0)).value == 0.0  # forgotten: its initial value again
    await sim.close()


async def test_a_new_store_when_all_are_monitored_is_refused_naming_the_bound() -> None:
    sim = SimBackend(SimLimits(max_stores=2))
    sinks = [RecordingSink() for _ in range(3)]
    monitors = [sim.monitor(f"value/M{i}", sink) for i, sink in enumerate(sinks)]
    try:
        await sinks[0].wait(lambda: all(sink.states for sink in sinks))
        # Opened in one go: the third must not evict the first, whose monitor has not started.
        assert [s.state for s in sinks] == [ConnState.CONNECTED] * 2 + [ConnState.FAILED]
        assert "at most 2 writable sim instances (sim_max_stores)" in sinks[2].states[0][1]
        with pytest.raises(BadChannelId, match="sim_max_stores"):
            await sim.put("value/N", 1.0, True, 1.0)
        await sim.put("value/M0", 5.0, True, 1.0)
        await sinks[0].wait(lambda: sinks[0].updates[-1].value == 5.0)
        monitors[1].close()  # M1 unmonitored: a new instance takes its place
        late = RecordingSink()
        monitors.append(sim.monitor("value/M3", late))
        await late.wait(lambda: late.updates)
        assert late.state == ConnState.CONNECTED and list(sim.stores) == ["value/M0", "value/M3"]
    finally:
        for m in monitors:
            m.close()
        await sim.close()


async def test_a_new_store_past_the_bound_after_all_started_is_refused() -> None:
    sim = SimBackend(SimLimits(max_stores=2))
    first = [RecordingSink() for _ in range(2)]
    monitors = [sim.monitor(f"value/M{i}", sink) for i, sink in enumerate(first)]
    try:
        await first[0].wait(lambda: all(sink.updates for sink in first))
        over = RecordingSink()
        monitors.append(sim.monitor("value/M2", over))  # raised KeyError: it evicted itself
        await over.wait(lambda: over.states)
        assert over.state == ConnState.FAILED and "sim://value/M2" in over.states[0][1]
        assert list(sim.stores) == ["value/M0", "value/M1"]
    finally:
        for m in monitors:
            m.close()
        await sim.close()


def test_names_lists_kinds() -> None:
    assert {"sine", "ramp", "counter", "noise", "waveform", "enum", "value", "string"} <= set(
        SimBackend().names()
    )


class _CountingSink:
    def __init__(self) -> None:
        self.updates = 0

    def on_update(self, *args: object) -> None:
        self.updates += 1

    def on_meta(self, meta: Metadata) -> None:
        pass

    def on_connection(self, state: ConnState, reason: str = "") -> None:
        pass


async def test_ten_thousand_counters_share_one_timer(sim: SimBackend) -> None:
    # What they cost is bench's (test_scenario[sim-1x10000]: 10,000 counters at 10 Hz through a
    # whole server, bench/README.md); here, that one timer drives them all and stops with them.
    sinks = [_CountingSink() for _ in range(10_000)]
    mons = [sim.monitor(f"counter/{i}?rate=10", sink) for i, sink in enumerate(sinks)]
    try:
        await eventually_async(
            lambda: all(sink.updates >= 2 for sink in sinks), "two updates of every counter"
        )
        assert len(sim.groups) == 1
    finally:
        for m in mons:
            m.close()
    assert not sim.groups


async def test_waveform_tables_past_the_byte_bound_drop_the_least_recently_used(
    sim: SimBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small bound and an empty cache of this test's own: 1000 float64 are 8000 bytes.
    monkeypatch.setattr(sim_module, "_TABLE_BYTES", 20_000)
    monkeypatch.setattr(sim_module, "_tables", {})
    for length in (1000, 500, 1000, 1200):  # 1000 used again: 500 is now the least recent
        r = await sim.get(f"waveform?length={length}", 1.0)
        assert isinstance(r.value, np.ndarray) and r.value.shape == (length,)
        assert sum(t.nbytes for t in sim_module._tables.values()) <= 20_000
    assert list(sim_module._tables) == [(1000, "sine"), (1200, "sine")]


async def test_image_patterns_past_the_byte_bound_drop_the_least_recently_used(
    sim: SimBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pattern is the frame twice over: 64 x 8 float64 cache 8192 bytes.
    monkeypatch.setattr(sim_image, "_CACHE_BYTES", 20_000)
    monkeypatch.setattr(sim_image, "_patterns", {})
    sizes = ((64, 8), (32, 8), (64, 8), (64, 10))  # 64 x 8 used again: 32 x 8 is now the least
    for width, height in sizes:
        r = await sim.get(f"image?width={width}&height={height}&dtype=float64", 1.0)
        assert isinstance(r.value, np.ndarray) and r.value.shape == (height, width)
        assert sum(t.nbytes for t in sim_image._patterns.values()) <= 20_000
    assert list(sim_image._patterns) == [(64, 8, "float64", "mono"), (64, 10, "float64", "mono")]
