"""What the upstream backends promise alike (upstream/base.py), checked on each: CaBackend and
PvaBackend against the real test IOC (tests/dbs/test.db), SimBackend in process where it has
the channel. Where they differ by design, the tables below say so; what only one backend does
is tested in its own file (tests/test_backend_ca.py, _pva.py, _sim.py)."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from pvwire.errors import ChannelNotFound, TypeMismatch
from pvwire.model import ConnState, Severity
from pvwire.upstream.base import Backend
from pvwire.upstream.ca import CaBackend
from pvwire.upstream.pva import PvaBackend
from pvwire.upstream.sim import SimBackend
from pvwire_dev.ioc import IocProcess

from tests.conftest import RecordingSink

# Where the backends differ by design.
COUNTER = {  # a channel counting up by one, in "counts", and its description
    "ca": ("PVW:COUNTER", "Counter"),
    "pva": ("PVW:COUNTER", "Counter"),
    "sim": ("counter?rate=50", "sim counter"),
}
WAVEFORM_COUNT = {"ca": 10, "pva": None}  # PVW:WF's element count: an NTScalarArray has none
FORM = {"ca": None, "pva": "Default"}  # CA has no display form
WRITABLE = {"ca": True, "pva": None}  # CA's access rights say; PVA's do not
NO_ALARM = {"ca": "NO_ALARM", "pva": ""}  # the alarm message once the alarm is cleared
BACKENDS: dict[str, type[Backend]] = {"ca": CaBackend, "pva": PvaBackend, "sim": SimBackend}

IOC = pytest.mark.ioc


@pytest.fixture(params=[pytest.param("ca", marks=IOC), pytest.param("pva", marks=IOC), "sim"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """Each backend in turn; CA and PVA with the shared test IOC running."""
    if request.param != "sim":
        request.getfixturevalue("epics_env")
    opened = BACKENDS[request.param]()
    yield opened
    await opened.close()


@pytest.fixture(params=[pytest.param("ca", marks=IOC), pytest.param("pva", marks=IOC)])
async def epics(request: pytest.FixtureRequest, epics_env: IocProcess) -> AsyncIterator[Backend]:
    """CA and PVA in turn, both against the test IOC's records."""
    opened = BACKENDS[request.param]()
    yield opened
    await opened.close()


async def test_get_float_with_metadata(epics: Backend) -> None:
    r = await epics.get("PVW:AO", 5.0)
    assert isinstance(r.value, float)
    assert r.seconds > 1_600_000_000 and 0 <= r.nanoseconds < 1_000_000_000
    m = r.meta
    assert (m.type, m.count, m.units, m.precision) == ("float64", 1, "mm", 3)
    assert m.description == "Test output"
    assert m.display == (-100.0, 100.0) and m.control == (-100.0, 100.0)
    assert m.alarm == (-90.0, 90.0) and m.warning == (-70.0, 70.0)
    assert m.form == FORM[epics.scheme] and m.writable is WRITABLE[epics.scheme]
    assert r.message == NO_ALARM[epics.scheme] or r.severity != 0


async def test_get_int_enum_string_waveform(epics: Backend) -> None:
    r = await epics.get("PVW:LONG", 5.0)
    assert type(r.value) is int
    assert (r.meta.type, r.meta.units, r.meta.description) == ("int32", "pcs", "Test long")

    r = await epics.get("PVW:MBBO", 5.0)
    assert type(r.value) is int
    assert r.meta.type == "enum" and r.meta.choices == ("Off", "On", "Fault")
    assert r.meta.description == "Test enum" and r.meta.display is None

    r = await epics.get("PVW:STR", 5.0)
    assert type(r.value) is str
    assert r.meta.type == "string" and r.meta.description == "Test string"

    r = await epics.get("PVW:WF", 5.0)
    assert type(r.value) is np.ndarray and r.value.dtype == np.float64
    assert r.meta.type == "float64" and r.meta.units == "V"
    assert r.meta.count == WAVEFORM_COUNT[epics.scheme]


async def test_get_unknown_is_not_found_within_timeout(epics: Backend) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChannelNotFound, match="PVW:NOPE"):
        await epics.get("PVW:NOPE", 0.5)
    assert time.monotonic() - t0 < 5  # its 0.5 s, with room for a busy machine


async def test_monitor_order_and_increasing_timestamps(backend: Backend) -> None:
    counter, description = COUNTER[backend.scheme]
    sink, witness = RecordingSink(), RecordingSink()
    mon = backend.monitor(counter, sink)
    kept = backend.monitor(counter, witness)
    try:
        await sink.wait(lambda: len(sink.updates) >= 4)
        kinds = [kind for kind, _ in sink.events]
        assert kinds[:3] == ["meta", "conn", "update"]
        assert kinds.count("meta") == 1, "metadata sent again although it did not change"
        assert sink.states[0][0] == ConnState.CONNECTED
        meta = sink.metas[0]
        assert meta.units == "counts" and meta.description == description
        stamps = [(u.seconds, u.nanoseconds) for u in sink.updates]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
        values = sink.numbers()
        assert all(b > a for a, b in itertools.pairwise(values))
        mon.close()
        n, seen = len(sink.events), len(witness.updates)
        # Two more counts reach the channel's other monitor: none reaches the closed one.
        await witness.wait(lambda: len(witness.updates) >= seen + 2)
        assert len(sink.events) == n, "no sink call after close()"
    finally:
        mon.close()
        kept.close()


async def test_alarm_severity_follows_value(epics: Backend) -> None:
    sink = RecordingSink()
    mon = epics.monitor("PVW:AO", sink)
    try:
        await sink.wait(lambda: sink.updates)
        await epics.put("PVW:AO", 95.0, True, 5.0)
        await sink.wait(lambda: sink.updates[-1].severity == Severity.MAJOR)
        last = sink.updates[-1]
        assert last.value == 95.0 and last.status == 3 and last.message == "HIHI"
        await epics.put("PVW:AO", 1.5, True, 5.0)
        await sink.wait(lambda: sink.updates[-1].severity == Severity.NO_ALARM)
        assert sink.updates[-1].message == NO_ALARM[epics.scheme]
    finally:
        mon.close()


async def test_property_change_reaches_on_meta(epics: Backend) -> None:
    sink = RecordingSink()
    mon = epics.monitor("PVW:AO", sink)
    try:
        await sink.wait(lambda: sink.updates)
        assert sink.metas[-1].units == "mm"
        await epics.put("PVW:AO.EGU", "cm", True, 5.0)
        await sink.wait(lambda: sink.metas[-1].units == "cm")
        assert len(sink.metas) == 2
        assert sink.metas[-1].description == "Test output"  # DESC kept across property events
    finally:
        await epics.put("PVW:AO.EGU", "mm", True, 5.0)
        mon.close()


async def test_put_enum_by_label_and_index(epics: Backend) -> None:
    try:
        await epics.put("PVW:MBBO", "Fault", True, 5.0)
        assert (await epics.get("PVW:MBBO", 5.0)).value == 2
        await epics.put("PVW:MBBO", 0, True, 5.0)
        assert (await epics.get("PVW:MBBO", 5.0)).value == 0
        with pytest.raises(TypeMismatch, match="'Off', 'On', 'Fault'"):
            await epics.put("PVW:MBBO", "Bogus", True, 5.0)
        with pytest.raises(TypeMismatch):
            await epics.put("PVW:MBBO", 7, True, 5.0)
    finally:
        await epics.put("PVW:MBBO", "On", True, 5.0)


async def test_put_values_of_each_type(epics: Backend) -> None:
    await epics.put("PVW:LONG", "43", True, 5.0)
    assert (await epics.get("PVW:LONG", 5.0)).value == 43
    await epics.put("PVW:LONG", 42, True, 5.0)
    await epics.put("PVW:STR", "world", True, 5.0)
    assert (await epics.get("PVW:STR", 5.0)).value == "world"
    await epics.put("PVW:STR", "hello", True, 5.0)
    await epics.put("PVW:WF", [4, 5, 6, 7], True, 5.0)
    value = (await epics.get("PVW:WF", 5.0)).value
    assert isinstance(value, np.ndarray)
    np.testing.assert_array_equal(value, [4.0, 5.0, 6.0, 7.0])
    await epics.put("PVW:WF", np.array([1.0, 2.0, 3.0]), True, 5.0)


async def test_put_errors(epics: Backend) -> None:
    scheme = epics.scheme
    with pytest.raises(TypeMismatch, match=rf"cannot write 'abc' to {scheme}://PVW:AO \(float64\)"):
        await epics.put("PVW:AO", "abc", True, 5.0)
    with pytest.raises(TypeMismatch, match="int32"):
        await epics.put("PVW:LONG", 1.5, True, 5.0)
    t0 = time.monotonic()
    with pytest.raises(ChannelNotFound, match="PVW:NOPE"):
        await epics.put("PVW:NOPE", 1.0, True, 0.5)
    assert time.monotonic() - t0 < 5  # its 0.5 s, with room for a busy machine


async def test_monitor_survives_ioc_restart(epics: Backend, epics_env: IocProcess) -> None:
    sink = RecordingSink()
    mon = epics.monitor("PVW:COUNTER", sink)
    loop = asyncio.get_running_loop()
    try:
        await sink.wait(lambda: sink.updates)
        await loop.run_in_executor(None, epics_env.stop)
        await sink.wait(lambda: sink.state == ConnState.DISCONNECTED, 30.0)
        n = len(sink.updates)
        await loop.run_in_executor(None, epics_env.start)
        # libca re-searches disconnected channels on a back-off: up to ~9 s.
        await sink.wait(lambda: sink.state == ConnState.CONNECTED, 30.0)
        await sink.wait(lambda: len(sink.updates) > n + 1)
        assert [s for s, _ in sink.states] == [
            ConnState.CONNECTED,
            ConnState.DISCONNECTED,
            ConnState.CONNECTED,
        ]
        assert not math.isnan(sink.numbers()[-1])
    finally:
        mon.close()
        if not epics_env.running:
            epics_env.start()
