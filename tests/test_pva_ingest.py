"""PVA monitors through the batched pvxs subscriptions (upstream/pva_ingest.py), on real IOCs.

DESIGN.md section 9: p4p's thread client once lost about one subscription in 1,000 at subscribe
time. 5,000 subscriptions opened at once from one IOC must each deliver their first value (the
right one), then the polling stops with the last monitor and starts again with the next.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pvwire.app import make_backends
from pvwire.config import Settings
from pvwire.model import ConnState
from pvwire.upstream import pva_ingest
from pvwire.upstream.pva import PvaBackend
from pvwire_dev.ioc import IocProcess

from tests.conftest import RecordingSink
from tests.eventually import eventually_async

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]

MANY = 5000


@pytest.fixture
def many_ioc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[IocProcess]:
    """An IOC with MANY passive `ao` records, ING:A{i} holding i; os.environ points PVA at it.

    pvxs reads its environment when a context is created: a backend created after this fixture
    reaches this IOC (and only it); the session's IOC and other backends are untouched.
    """
    db = tmp_path / "many.db"
    db.write_text(
        "".join(f'record(ao, "ING:A{i}") {{\n  field(VAL, "{i}")\n}}\n' for i in range(MANY))
    )
    ioc = IocProcess([db])
    ioc.start(timeout=60.0)
    for k, v in ioc.ports.client_env().items():
        monkeypatch.setenv(k, v)
    try:
        yield ioc
    finally:
        ioc.stop()


async def test_every_one_of_5000_subscriptions_delivers_its_first_value(
    many_ioc: IocProcess,
) -> None:
    backend = PvaBackend()
    sinks = [RecordingSink() for _ in range(MANY)]
    monitors = [backend.monitor(f"ING:A{i}", sink) for i, sink in enumerate(sinks)]
    try:
        # Generous: subscribing to 5,000 PVs takes well under a second on an idle machine.
        await eventually_async(
            lambda: all(s.updates for s in sinks), "every first value", timeout=120.0
        )
        silent = [i for i, s in enumerate(sinks) if not s.updates]
        assert not silent, f"{len(silent)} subscriptions never delivered: {silent[:10]}"
        for i, sink in enumerate(sinks):
            assert sink.updates[0].value == float(i)
            assert sink.states[0][0] is ConnState.CONNECTED
            assert [kind for kind, _ in sink.events[:3]] == ["meta", "conn", "update"]
    finally:
        for m in monitors:
            m.close()
        await backend.close()


async def test_polling_stops_with_the_last_monitor_and_starts_with_the_next() -> None:
    backend = PvaBackend()
    try:
        first = RecordingSink()
        mon = backend.monitor("PVW:COUNTER", first)
        assert backend.ingest().polling
        await first.wait(lambda: len(first.updates) >= 2)
        mon.close()
        assert not backend.ingest().polling
        seen = len(first.events)

        again = RecordingSink()
        mon = backend.monitor("PVW:COUNTER", again)
        try:
            assert backend.ingest().polling
            await again.wait(lambda: len(again.updates) >= 2)
        finally:
            mon.close()
        assert len(first.events) == seen, "a closed monitor's sink was called"
    finally:
        await backend.close()


async def test_a_backlog_larger_than_one_drain_is_delivered_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One update per drain: a FIFO holding several must be queued again by the drain itself,
    # since pvxs wakes a subscription only after a pop found its FIFO empty.
    monkeypatch.setattr(pva_ingest, "MAX_POPS", 1)
    backend = PvaBackend()
    sink = RecordingSink()
    mon = backend.monitor("PVW:COUNTER", sink)
    try:
        await sink.wait(lambda: len(sink.updates) >= 1)
        time.sleep(0.3)  # hold the loop: the 10 Hz counter queues ~3 updates in the FIFO
        before = len(sink.updates)
        await sink.wait(lambda: len(sink.updates) >= before + 6, timeout=10.0)
        values = sink.numbers()
        assert all(b > a for a, b in itertools.pairwise(values))
    finally:
        mon.close()
        await backend.close()


async def test_a_loop_held_for_a_second_loses_no_update_of_a_10_hz_counter() -> None:
    # pvxs merges the newest update into the last queued one once a subscription's queue is
    # full (4 by default: 0.4 s of this counter). pva_ingest asks for QUEUE_SIZE (16): a loop
    # held for 0.8 s (8 updates, twice the default queue) must still see every counter value.
    # Not longer: a busy machine may wake the sleep late, and 16 updates is 1.6 s.
    assert pva_ingest.QUEUE_SIZE >= 16
    backend = PvaBackend()
    sink = RecordingSink()
    mon = backend.monitor("PVW:COUNTER", sink)
    try:
        await sink.wait(lambda: len(sink.updates) >= 2)
        time.sleep(0.8)  # hold the loop (not a synchronisation): the FIFO queues ~8 updates
        before = len(sink.updates)
        await sink.wait(lambda: len(sink.updates) >= before + 15, timeout=20.0)
        values = sink.numbers()
        steps = {b - a for a, b in itertools.pairwise(values)}
        assert steps == {1.0}, f"counter steps {sorted(steps)}: an update was merged or lost"
    finally:
        mon.close()
        await backend.close()


async def test_the_queue_size_setting_reaches_every_monitor_request() -> None:
    app_backends = make_backends(Settings(pva_queue_size=3, sim_enabled=False))
    backend = app_backends["pva"]
    assert isinstance(backend, PvaBackend)
    assert backend.ingest().request.todict()["record"]["_options"] == {"queueSize": "3"}
    with pytest.raises(ValueError, match="at least 1"):
        pva_ingest.PvaIngest(asyncio.get_running_loop(), 0)


async def test_a_monitor_closed_after_its_backend_opens_no_new_context() -> None:
    backend = PvaBackend()
    sink = RecordingSink()
    mon = backend.monitor("PVW:COUNTER", sink)
    await sink.wait(lambda: len(sink.updates) >= 1)
    ingest = backend.ingest()
    await backend.close()  # a shutdown may close the backend before the hub's channels
    assert not ingest.polling
    mon.close()
    assert backend._ingest is None, "closing the monitor opened a new pvxs context"


def test_a_missing_module_says_how_to_build_it(tmp_path: Path) -> None:
    # The server package imported as a source checkout installed without `make` sees it.
    package = tmp_path / "pvwire"
    shutil.copytree(Path(pva_ingest.__file__).parent.parent, package,
                    ignore=shutil.ignore_patterns("_pvaingest*.so", "__pycache__"))  # fmt: skip
    # Importing works (the server still serves CA and sim); a PVA context is refused, saying why.
    script = (
        "import asyncio\n"
        "from pvwire.upstream import pva_ingest\n"
        "print(pva_ingest.UNAVAILABLE)\n"
        "try:\n"
        "    pva_ingest.PvaIngest(asyncio.new_event_loop())\n"
        "except RuntimeError as e:\n"
        "    print('refused:', e)\n"
    )
    probe = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    unavailable, refused = probe.stdout.splitlines()
    assert "pvwire's PVA module is not built" in unavailable and "make ext" in unavailable
    assert refused == f"refused: {unavailable}"
