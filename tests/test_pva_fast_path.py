"""The compiled fast path of PVA monitors (upstream/_pvaingest.cpp) against a real p4p server.

An ordinary update (only value and timeStamp changed, a plain scalar or array) goes from pvxs
straight to the sink's `on_update`; everything else reaches `PvaMonitor._item` as p4p's Value.
Both must hand the sink the same thing: for every plain type, an update taken by the fast path
equals what a get (p4p's conversion, the full path) returns for the same update. A changed alarm
takes the full path and later fast updates carry it; a failure in the sink fails that channel
only; a reconnect turns the fast path off and on again; a finished subscription is opened again.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
from p4p.client.raw import Finished
from p4p.nt import NTScalar
from p4p.server.thread import SharedPV
from pvwire.model import ALARM_STATUS_NAMES, ConnState
from pvwire.upstream.base import ChannelSink
from pvwire.upstream.pva import PvaBackend, PvaMonitor

from tests.conftest import RecordingSink
from tests.p4p_server import p4p_server

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]

# NTScalar type codes and two values each: the initial one and the one posted.
PLAIN: dict[str, tuple[Any, Any]] = {
    "b": (-5, 7),
    "B": (5, 250),
    "h": (-300, 301),
    "H": (300, 65000),
    "i": (-70000, 70001),
    "I": (70000, 4_000_000_000),
    "l": (-(2**40), 2**62),
    "L": (2**40, 2**64 - 1),
    "f": (1.5, -2.25),
    "d": (0.1, 1e300),
    "s": ("one", "twö"),
    "ab": (np.array([-1, 2], np.int8), np.array([3, -4, 5], np.int8)),
    "aB": (np.array([1, 2], np.uint8), np.array([255], np.uint8)),
    "ah": (np.array([-1], np.int16), np.array([-2, 2], np.int16)),
    "aH": (np.array([1], np.uint16), np.array([65535, 0], np.uint16)),
    "ai": (np.array([-1], np.int32), np.array([2**31 - 1], np.int32)),
    "aI": (np.array([1], np.uint32), np.array([2**32 - 1, 1], np.uint32)),
    "al": (np.array([-1], np.int64), np.array([-(2**63)], np.int64)),
    "aL": (np.array([1], np.uint64), np.array([2**64 - 1], np.uint64)),
    "af": (np.array([0.5], np.float32), np.array([1.5, -0.0], np.float32)),
    "ad": (np.array([0.25], np.float64), np.array([], np.float64)),
    "as": (["a"], ["", "b", "çd"]),
}


def pv_name(code: str) -> str:
    return f"FAST:{code.replace('a', 'ARR_')}_{'U' if code[-1].isupper() else 'S'}"


@pytest.fixture(scope="module")
def pvs() -> Iterator[tuple[dict[str, SharedPV], dict[str, str]]]:
    """A p4p server on its own loopback ports with one PV per plain type, and its client env."""
    pvs = {pv_name(code): SharedPV(nt=NTScalar(code), initial=first)
           for code, (first, _) in PLAIN.items()}  # fmt: skip
    pvs["FAST:FINISH"] = SharedPV(nt=NTScalar("d"), initial=1.0)
    with p4p_server("fast", pvs) as client_env:
        yield pvs, client_env


@pytest.fixture
async def backend(
    pvs: tuple[dict[str, SharedPV], dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[PvaBackend]:
    # pvxs reads its environment when a context is created: the backend's are created later.
    for k, v in pvs[1].items():
        monkeypatch.setenv(k, v)
    b = PvaBackend()
    yield b
    await b.close()


class CountingMonitor(PvaMonitor):
    """A PvaMonitor that counts what reached Python's full path."""

    def __init__(self, backend: PvaBackend, name: str, sink: ChannelSink) -> None:
        self.items = 0
        super().__init__(backend, name, sink)

    def _item(self, item: Any) -> None:
        self.items += 1
        super()._item(item)


def same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return (
            type(got) is np.ndarray
            and got.dtype == want.dtype
            and got.flags.writeable == want.flags.writeable
            and np.array_equal(got, want)
        )
    return type(got) is type(want) and got == want


async def test_a_fast_update_equals_the_full_path_for_every_plain_type(
    backend: PvaBackend, pvs: tuple[dict[str, SharedPV], dict[str, str]]
) -> None:
    sinks = {pv_name(code): RecordingSink() for code in PLAIN}
    mons = {name: CountingMonitor(backend, name, sink) for name, sink in sinks.items()}
    try:
        for name, sink in sinks.items():
            await sink.wait(lambda s=sink: s.updates, timeout=20.0)  # type: ignore[misc]
            sub = mons[name]._sub
            assert sub is not None and sub.is_fast, f"{name}: the fast path is not on"
        for code, (_, second) in PLAIN.items():
            pvs[0][pv_name(code)].post(second)
        for code, (_, second) in PLAIN.items():
            name, sink, mon = pv_name(code), sinks[pv_name(code)], mons[pv_name(code)]
            await sink.wait(lambda s=sink: len(s.updates) >= 2, timeout=20.0)  # type: ignore[misc]
            assert mon.items == 1, f"{name}: an ordinary update took the full path"
            fast = sink.updates[1]
            full = await backend.get(name, 20.0)  # generous: a busy machine, a new channel
            assert same(fast.value, full.value), (name, fast.value, full.value)
            want = second if isinstance(second, list) else full.value
            assert same(fast.value, want), (name, fast.value, second)
            assert (fast.seconds, fast.nanoseconds) == (full.seconds, full.nanoseconds), name
            assert (fast.severity, fast.status, fast.message) == (0, 0, ""), name
            if isinstance(second, np.ndarray):
                assert isinstance(fast.value, np.ndarray), name
                assert np.array_equal(fast.value, second), name
            else:
                assert fast.value == second, name
    finally:
        for m in mons.values():
            m.close()


async def test_a_changed_alarm_takes_the_full_path_and_later_fast_updates_carry_it(
    backend: PvaBackend, pvs: tuple[dict[str, SharedPV], dict[str, str]]
) -> None:
    name = pv_name("d")
    pv = pvs[0][name]
    sink = RecordingSink()
    mon = CountingMonitor(backend, name, sink)
    try:
        await sink.wait(lambda: sink.updates, timeout=20.0)
        pv.post(5.0, severity=2, message="HIHI")
        await sink.wait(lambda: len(sink.updates) >= 2, timeout=20.0)
        assert mon.items == 2
        hihi = (2, ALARM_STATUS_NAMES.index("HIHI"), "HIHI")
        assert sink.updates[1][3:] == hihi
        pv.post(6.0)  # value and time only: the fast path, with the alarm read above
        await sink.wait(lambda: len(sink.updates) >= 3, timeout=20.0)
        assert mon.items == 2
        assert sink.updates[2].value == 6.0 and sink.updates[2][3:] == hihi
        pv.post(7.0, severity=0, message="NO_ALARM")
        await sink.wait(lambda: len(sink.updates) >= 4, timeout=20.0)
        assert sink.updates[3][3:] == (0, 0, "NO_ALARM") and mon.items == 3
    finally:
        mon.close()


class FailingSink(RecordingSink):
    """Raises in `on_update` for the values in `refuse`."""

    def __init__(self, refuse: set[float]) -> None:
        super().__init__()
        self.refuse = refuse

    def on_update(self, value: Any, *args: Any, **kwargs: Any) -> None:
        if value in self.refuse:
            raise RuntimeError(f"cannot take {value}")
        super().on_update(value, *args, **kwargs)


async def test_a_sink_failure_on_the_fast_path_fails_that_channel_until_a_good_update(
    backend: PvaBackend, pvs: tuple[dict[str, SharedPV], dict[str, str]]
) -> None:
    failing_pv, other_pv = pv_name("d"), pv_name("i")
    failing, other = FailingSink({13.0}), RecordingSink()
    mons = [PvaMonitor(backend, failing_pv, failing), PvaMonitor(backend, other_pv, other)]
    try:
        await failing.wait(lambda: failing.updates, timeout=20.0)
        await other.wait(lambda: other.updates, timeout=20.0)
        pvs[0][failing_pv].post(13.0)
        await failing.wait(lambda: failing.state is ConnState.FAILED, timeout=20.0)
        assert "cannot take 13.0" in failing.states[-1][1]
        pvs[0][other_pv].post(5)
        await other.wait(lambda: other.updates[-1].value == 5, timeout=20.0)
        assert other.state is ConnState.CONNECTED
        pvs[0][failing_pv].post(14.0)
        await failing.wait(lambda: failing.updates[-1].value == 14.0, timeout=20.0)
        assert failing.state is ConnState.CONNECTED
    finally:
        for m in mons:
            m.close()


async def test_arrays_from_the_fast_path_outlive_later_updates_unchanged(
    backend: PvaBackend, pvs: tuple[dict[str, SharedPV], dict[str, str]]
) -> None:
    name = pv_name("ad")
    sink = RecordingSink()
    mon = PvaMonitor(backend, name, sink)
    try:
        await sink.wait(lambda: sink.updates, timeout=20.0)
        for k in range(20):
            pvs[0][name].post(np.full(1000, float(k)))
            await sink.wait(lambda k=k: len(sink.updates) >= k + 2, timeout=20.0)  # type: ignore[misc]
        gc.collect()
        for k, update in enumerate(sink.updates[1:]):
            assert isinstance(update.value, np.ndarray) and not update.value.flags.writeable
            assert np.array_equal(update.value, np.full(1000, float(k))), k
    finally:
        mon.close()


async def test_a_closed_pv_disconnects_and_its_reopening_brings_the_fast_path_back(
    backend: PvaBackend, pvs: tuple[dict[str, SharedPV], dict[str, str]]
) -> None:
    pv = pvs[0]["FAST:FINISH"]
    sink = RecordingSink()
    mon = CountingMonitor(backend, "FAST:FINISH", sink)
    try:
        await sink.wait(lambda: sink.updates, timeout=20.0)
        pv.close()
        await sink.wait(lambda: sink.state is ConnState.DISCONNECTED, timeout=20.0)
        assert sink.states[-1][1] == "server disconnected"
        assert mon._sub is not None and not mon._sub.is_fast
        pv.open(2.0)
        await sink.wait(lambda: sink.updates[-1].value == 2.0, timeout=20.0)
        assert sink.state is ConnState.CONNECTED and mon._sub.is_fast
        items = mon.items
        pv.post(3.0)
        await sink.wait(lambda: sink.updates[-1].value == 3.0, timeout=20.0)
        assert mon.items == items, "the update after reconnecting took the full path"
    finally:
        mon.close()


async def test_a_finished_subscription_is_opened_again(
    backend: PvaBackend, pvs: tuple[dict[str, SharedPV], dict[str, str]]
) -> None:
    # pvxs ends a subscription with Finished when the server's source finishes it; p4p's
    # servers cannot, so the item arrives as the compiled drain would hand it over.
    pv = pvs[0]["FAST:FINISH"]
    pv.post(4.0)
    sink = RecordingSink()
    mon = PvaMonitor(backend, "FAST:FINISH", sink)
    try:
        await sink.wait(lambda: sink.updates, timeout=20.0)
        first = mon._sub
        mon._item(Finished("Subscription Finished"))
        assert sink.states[-1] == (ConnState.DISCONNECTED, "subscription finished")
        assert first is not None and first.closed and mon._sub is not first
        await sink.wait(lambda: sink.state is ConnState.CONNECTED, timeout=20.0)
        assert sink.updates[-1].value == 4.0
        pv.post(5.0)
        await sink.wait(lambda: sink.updates[-1].value == 5.0, timeout=20.0)
    finally:
        mon.close()
    assert backend.ingest().polling is False


async def test_a_monitor_dropped_without_close_is_collected_and_delivers_nothing(
    backend: PvaBackend, pvs: tuple[dict[str, SharedPV], dict[str, str]]
) -> None:
    # A PvaMonitor and its subscription hold each other (the subscription holds the monitor's
    # bound methods): only the collector, through the subscription's traverse and clear, ends
    # such a cycle, and with it the subscription.
    name = pv_name("l")
    pv = pvs[0][name]
    dropped, kept = RecordingSink(), RecordingSink()
    doomed = [PvaMonitor(backend, name, dropped)]
    mon = PvaMonitor(backend, name, kept)
    try:
        await kept.wait(lambda: kept.updates, timeout=20.0)
        await dropped.wait(lambda: dropped.updates, timeout=20.0)
        doomed.clear()  # dropped only now: the collector could take it before its first update
        gc.collect()
        seen = len(dropped.updates)
        pv.post(123)
        await kept.wait(lambda: kept.updates[-1].value == 123, timeout=20.0)
        pv.post(124)
        await kept.wait(lambda: kept.updates[-1].value == 124, timeout=20.0)
        assert len(dropped.updates) == seen
    finally:
        mon.close()
