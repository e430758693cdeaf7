"""CaBackend against the real test IOC (tests/dbs/test.db) over Channel Access."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from pvwire.errors import ChannelNotFound, ReadOnlyChannel, TypeMismatch
from pvwire.model import ConnState, Severity
from pvwire.upstream import ca as ca_module
from pvwire.upstream.ca import CaBackend
from pvwire_dev.ioc import IocProcess

from tests.conftest import RecordingSink

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]


@pytest.fixture
async def ca() -> AsyncIterator[CaBackend]:
    backend = CaBackend()
    yield backend
    await backend.close()


async def test_get_float_with_metadata(ca: CaBackend) -> None:
    r = await ca.get("PVW:AO", 5.0)
    assert isinstance(r.value, float)
    assert r.seconds > 1_600_000_000 and 0 <= r.nanoseconds < 1_000_000_000
    m = r.meta
    assert (m.type, m.count, m.units, m.precision) == ("float64", 1, "mm", 3)
    assert m.description == "Test output"
    assert m.display == (-100.0, 100.0) and m.control == (-100.0, 100.0)
    assert m.alarm == (-90.0, 90.0) and m.warning == (-70.0, 70.0)
    assert m.writable is True
    assert r.message == "NO_ALARM" or r.severity != 0


async def test_get_int_enum_string_waveform(ca: CaBackend) -> None:
    r = await ca.get("PVW:LONG", 5.0)
    assert type(r.value) is int
    assert (r.meta.type, r.meta.units, r.meta.description) == ("int32", "pcs", "Test long")

    r = await ca.get("PVW:MBBO", 5.0)
    assert type(r.value) is int
    assert r.meta.type == "enum" and r.meta.choices == ("Off", "On", "Fault")
    assert r.meta.display is None

    r = await ca.get("PVW:STR", 5.0)
    assert type(r.value) is str
    assert r.meta.type == "string" and r.meta.description == "Test string"

    r = await ca.get("PVW:WF", 5.0)
    assert type(r.value) is np.ndarray and r.value.dtype == np.float64
    assert r.meta.type == "float64" and r.meta.count == 10 and r.meta.units == "V"


async def test_get_field_channel(ca: CaBackend) -> None:
    r = await ca.get("PVW:AO.DESC", 5.0)
    assert r.value == "Test output"
    assert r.meta.type == "string" and r.meta.description is None


async def test_get_unknown_is_not_found_within_timeout(ca: CaBackend) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChannelNotFound, match="PVW:NOPE"):
        await ca.get("PVW:NOPE", 0.5)
    assert time.monotonic() - t0 < 5  # its 0.5 s, with room for a busy machine


async def test_monitor_order_and_increasing_timestamps(ca: CaBackend) -> None:
    sink = RecordingSink()
    mon = ca.monitor("PVW:COUNTER", sink)
    try:
        await sink.wait(lambda: len(sink.updates) >= 4)
        kinds = [kind for kind, _ in sink.events]
        assert kinds[:3] == ["meta", "conn", "update"]
        assert sink.states[0][0] == ConnState.CONNECTED
        assert sink.metas[0].units == "counts" and sink.metas[0].description == "Counter"
        stamps = [(u.seconds, u.nanoseconds) for u in sink.updates]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
        values = [u.value for u in sink.updates]
        assert all(b > a for a, b in itertools.pairwise(values))
    finally:
        mon.close()
    n = len(sink.events)
    await asyncio.sleep(0.3)
    assert len(sink.events) == n, "no sink call after close()"


async def test_alarm_severity_follows_value(ca: CaBackend) -> None:
    sink = RecordingSink()
    mon = ca.monitor("PVW:AO", sink)
    try:
        await sink.wait(lambda: sink.updates)
        await ca.put("PVW:AO", 95.0, True, 5.0)
        await sink.wait(lambda: sink.updates[-1].severity == Severity.MAJOR)
        last = sink.updates[-1]
        assert last.value == 95.0 and last.status == 3 and last.message == "HIHI"
        await ca.put("PVW:AO", 1.5, True, 5.0)
        await sink.wait(lambda: sink.updates[-1].severity == Severity.NO_ALARM)
        assert sink.updates[-1].message == "NO_ALARM"
    finally:
        mon.close()


async def test_property_change_reaches_on_meta(ca: CaBackend) -> None:
    sink = RecordingSink()
    mon = ca.monitor("PVW:AO", sink)
    try:
        await sink.wait(lambda: sink.updates)
        assert sink.metas[-1].units == "mm"
        await ca.put("PVW:AO.EGU", "cm", True, 5.0)
        await sink.wait(lambda: sink.metas[-1].units == "cm")
        assert sink.metas[-1].description == "Test output"  # DESC kept across property events
    finally:
        await ca.put("PVW:AO.EGU", "mm", True, 5.0)
        mon.close()


async def test_put_enum_by_label_and_index(ca: CaBackend) -> None:
    try:
        await ca.put("PVW:MBBO", "Fault", True, 5.0)
        assert (await ca.get("PVW:MBBO", 5.0)).value == 2
        await ca.put("PVW:MBBO", 0, True, 5.0)
        assert (await ca.get("PVW:MBBO", 5.0)).value == 0
        with pytest.raises(TypeMismatch, match="'Off', 'On', 'Fault'"):
            await ca.put("PVW:MBBO", "Bogus", True, 5.0)
        with pytest.raises(TypeMismatch):
            await ca.put("PVW:MBBO", 7, True, 5.0)
    finally:
        await ca.put("PVW:MBBO", "On", True, 5.0)


async def test_enum_labels_past_the_bound_forget_the_least_recently_used(
    ca: CaBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ca_module, "MAX_ENUM_CHOICES", 2)
    for name in ("PVW:AO.SCAN", "PVW:MBBO", "PVW:AO.SCAN", "PVW:LONG.SCAN"):
        await ca.get(name, 5.0)  # a get of an enum remembers its labels
    assert list(ca._choices) == ["PVW:AO.SCAN", "PVW:LONG.SCAN"]  # MBBO was the least recent
    try:
        await ca.put("PVW:MBBO", "Fault", True, 5.0)  # forgotten labels are read again
        assert (await ca.get("PVW:MBBO", 5.0)).value == 2
        assert list(ca._choices) == ["PVW:LONG.SCAN", "PVW:MBBO"]
    finally:
        await ca.put("PVW:MBBO", "On", True, 5.0)


async def test_put_values_of_each_type(ca: CaBackend) -> None:
    await ca.put("PVW:LONG", "43", True, 5.0)
    assert (await ca.get("PVW:LONG", 5.0)).value == 43
    await ca.put("PVW:LONG", 42, True, 5.0)
    await ca.put("PVW:STR", "world", True, 5.0)
    assert (await ca.get("PVW:STR", 5.0)).value == "world"
    await ca.put("PVW:STR", "hello", True, 5.0)
    await ca.put("PVW:WF", [4, 5, 6, 7], True, 5.0)
    value = (await ca.get("PVW:WF", 5.0)).value
    assert isinstance(value, np.ndarray)
    np.testing.assert_array_equal(value, [4.0, 5.0, 6.0, 7.0])
    await ca.put("PVW:WF", np.array([1.0, 2.0, 3.0]), True, 5.0)


async def test_put_errors(ca: CaBackend) -> None:
    with pytest.raises(TypeMismatch, match=r"cannot write 'abc' to ca://PVW:AO \(float64\)"):
        await ca.put("PVW:AO", "abc", True, 5.0)
    with pytest.raises(TypeMismatch, match="int32"):
        await ca.put("PVW:LONG", 1.5, True, 5.0)
    with pytest.raises(ReadOnlyChannel):
        await ca.put("PVW:AO.NAME", "X", True, 5.0)
    t0 = time.monotonic()
    with pytest.raises(ChannelNotFound, match="PVW:NOPE"):
        await ca.put("PVW:NOPE", 1.0, True, 0.5)
    assert time.monotonic() - t0 < 5  # its 0.5 s, with room for a busy machine


async def test_monitor_survives_ioc_restart(ca: CaBackend, epics_env: IocProcess) -> None:
    sink = RecordingSink()
    mon = ca.monitor("PVW:COUNTER", sink)
    loop = asyncio.get_running_loop()
    try:
        await sink.wait(lambda: sink.updates)
        await loop.run_in_executor(None, epics_env.stop)
        await sink.wait(lambda: sink.state == ConnState.DISCONNECTED, 30.0)
        n = len(sink.updates)
        await loop.run_in_executor(None, epics_env.start)
        # libca re-searches disconnected channels on a back-off: measured up to ~9 s here.
        await sink.wait(lambda: sink.state == ConnState.CONNECTED, 30.0)
        await sink.wait(lambda: len(sink.updates) > n + 1)
        assert not math.isnan(float(sink.updates[-1].value))  # type: ignore[arg-type]
    finally:
        mon.close()
        if not epics_env.running:
            epics_env.start()
