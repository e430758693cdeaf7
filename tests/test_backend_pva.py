"""PvaBackend against the real test IOC (tests/dbs/test.db) over PVAccess (QSRV)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from pvwire.errors import ChannelNotFound, TypeMismatch
from pvwire.model import ConnState, Severity
from pvwire.upstream import pva as pva_module
from pvwire.upstream.pva import PvaBackend
from pvwire_dev.ioc import IocProcess

from tests.conftest import RecordingSink

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]


@pytest.fixture
async def pva() -> AsyncIterator[PvaBackend]:
    backend = PvaBackend()
    yield backend
    await backend.close()


async def test_get_float_with_metadata(pva: PvaBackend) -> None:
    r = await pva.get("PVW:AO", 5.0)
    assert isinstance(r.value, float)
    assert r.seconds > 1_600_000_000 and 0 <= r.nanoseconds < 1_000_000_000
    m = r.meta
    assert (m.type, m.count, m.units, m.precision, m.form) == ("float64", 1, "mm", 3, "Default")
    assert m.description == "Test output"
    assert m.display == (-100.0, 100.0) and m.control == (-100.0, 100.0)
    assert m.alarm == (-90.0, 90.0) and m.warning == (-70.0, 70.0)


async def test_get_int_enum_string_waveform(pva: PvaBackend) -> None:
    r = await pva.get("PVW:LONG", 5.0)
    assert type(r.value) is int
    assert (r.meta.type, r.meta.units, r.meta.description) == ("int32", "pcs", "Test long")

    r = await pva.get("PVW:MBBO", 5.0)
    assert type(r.value) is int
    assert r.meta.type == "enum" and r.meta.choices == ("Off", "On", "Fault")
    assert r.meta.description == "Test enum" and r.meta.display is None

    r = await pva.get("PVW:STR", 5.0)
    assert type(r.value) is str
    assert r.meta.type == "string" and r.meta.description == "Test string"

    r = await pva.get("PVW:WF", 5.0)
    assert type(r.value) is np.ndarray and r.value.dtype == np.float64
    assert r.meta.type == "float64" and r.meta.units == "V" and r.meta.count is None


async def test_get_unknown_is_not_found_within_timeout(pva: PvaBackend) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChannelNotFound, match="PVW:NOPE"):
        await pva.get("PVW:NOPE", 0.5)
    assert time.monotonic() - t0 < 5  # its 0.5 s, with room for a busy machine


async def test_monitor_order_and_increasing_timestamps(pva: PvaBackend) -> None:
    sink = RecordingSink()
    mon = pva.monitor("PVW:COUNTER", sink)
    try:
        await sink.wait(lambda: len(sink.updates) >= 4)
        kinds = [kind for kind, _ in sink.events]
        assert kinds[:3] == ["meta", "conn", "update"]
        assert kinds.count("meta") == 1, "metadata sent again although it did not change"
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


async def test_alarm_severity_follows_value(pva: PvaBackend) -> None:
    sink = RecordingSink()
    mon = pva.monitor("PVW:AO", sink)
    try:
        await sink.wait(lambda: sink.updates)
        await pva.put("PVW:AO", 95.0, True, 5.0)
        await sink.wait(lambda: sink.updates[-1].severity == Severity.MAJOR)
        assert sink.updates[-1].value == 95.0 and sink.updates[-1].message == "HIHI"
        await pva.put("PVW:AO", 1.5, True, 5.0)
        await sink.wait(lambda: sink.updates[-1].severity == Severity.NO_ALARM)
    finally:
        mon.close()


async def test_property_change_reaches_on_meta(pva: PvaBackend) -> None:
    sink = RecordingSink()
    mon = pva.monitor("PVW:AO", sink)
    try:
        await sink.wait(lambda: sink.updates)
        assert sink.metas[-1].units == "mm"
        await pva.put("PVW:AO.EGU", "cm", True, 5.0)
        await sink.wait(lambda: sink.metas[-1].units == "cm")
        assert len(sink.metas) == 2
    finally:
        await pva.put("PVW:AO.EGU", "mm", True, 5.0)
        mon.close()


async def test_put_enum_by_label_and_index(pva: PvaBackend) -> None:
    try:
        await pva.put("PVW:MBBO", "Fault", True, 5.0)
        assert (await pva.get("PVW:MBBO", 5.0)).value == 2
        await pva.put("PVW:MBBO", 0, True, 5.0)
        assert (await pva.get("PVW:MBBO", 5.0)).value == 0
        with pytest.raises(TypeMismatch, match="'Off', 'On', 'Fault'"):
            await pva.put("PVW:MBBO", "Bogus", True, 5.0)
    finally:
        await pva.put("PVW:MBBO", "On", True, 5.0)


async def test_put_types_past_the_bound_forget_the_least_recently_used(
    pva: PvaBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pva_module, "MAX_TYPES", 2)
    for name in ("PVW:LONG", "PVW:MBBO", "PVW:LONG", "PVW:AO"):
        await pva.get(name, 5.0)  # a get remembers the channel's put type
    assert list(pva._types) == ["PVW:LONG", "PVW:AO"]  # MBBO was the least recent
    try:
        await pva.put("PVW:MBBO", "Fault", True, 5.0)  # a forgotten type is learned again
        assert (await pva.get("PVW:MBBO", 5.0)).value == 2
        assert list(pva._types) == ["PVW:AO", "PVW:MBBO"]
    finally:
        await pva.put("PVW:MBBO", "On", True, 5.0)


async def test_put_values_of_each_type(pva: PvaBackend) -> None:
    await pva.put("PVW:LONG", "43", True, 5.0)
    assert (await pva.get("PVW:LONG", 5.0)).value == 43
    await pva.put("PVW:LONG", 42, True, 5.0)
    await pva.put("PVW:STR", "world", True, 5.0)
    assert (await pva.get("PVW:STR", 5.0)).value == "world"
    await pva.put("PVW:STR", "hello", True, 5.0)
    await pva.put("PVW:WF", [4, 5, 6, 7], True, 5.0)
    value = (await pva.get("PVW:WF", 5.0)).value
    assert isinstance(value, np.ndarray)
    np.testing.assert_array_equal(value, [4.0, 5.0, 6.0, 7.0])
    await pva.put("PVW:WF", np.array([1.0, 2.0, 3.0]), True, 5.0)


async def test_put_errors(pva: PvaBackend) -> None:
    with pytest.raises(TypeMismatch, match=r"cannot write 'abc' to pva://PVW:AO \(float64\)"):
        await pva.put("PVW:AO", "abc", True, 5.0)
    t0 = time.monotonic()
    with pytest.raises(ChannelNotFound, match="PVW:NOPE"):
        await pva.put("PVW:NOPE", 1.0, True, 0.5)
    assert time.monotonic() - t0 < 5  # its 0.5 s, with room for a busy machine


async def test_monitor_survives_ioc_restart(pva: PvaBackend, epics_env: IocProcess) -> None:
    sink = RecordingSink()
    mon = pva.monitor("PVW:COUNTER", sink)
    loop = asyncio.get_running_loop()
    try:
        await sink.wait(lambda: sink.updates)
        await loop.run_in_executor(None, epics_env.stop)
        await sink.wait(lambda: sink.state == ConnState.DISCONNECTED, 30.0)
        n = len(sink.updates)
        await loop.run_in_executor(None, epics_env.start)
        await sink.wait(lambda: sink.state == ConnState.CONNECTED, 30.0)
        await sink.wait(lambda: len(sink.updates) > n + 1)
        assert [s for s, _ in sink.states] == [
            ConnState.CONNECTED,
            ConnState.DISCONNECTED,
            ConnState.CONNECTED,
        ]
    finally:
        mon.close()
        if not epics_env.running:
            epics_env.start()
