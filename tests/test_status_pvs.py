"""`--status-prefix`: the server's own figures as PVA PVs, read by a real PVA client (p4p's) and
by pvwire itself through its own pva:// channels (GraphQL and /stream), on loopback ports of
their own; a PVA server that cannot start leaves the HTTP server serving; under `--workers N`
each worker serves its own figures under its number. The figures and alarms in memory:
tests/test_status_figures.py."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psutil
import pytest
from p4p.client.asyncio import Context, RemoteError
from pvwire import __version__
from pvwire.status import status_pvs
from pvwire_client import Client
from pvwire_dev.ioc import free_port

from tests.eventually import eventually, eventually_async
from tests.server_process import ServerProcess, refuse_bearer_tokens, server_args_for_tests

PREFIX = "PVWT:STS:"
TABLE = {pv.name: pv for pv in status_pvs(20.0)}  # the tests' servers tick every 20 ms


class StatusPorts:
    """The loopback ports a server's status PVs are served on, and what reaches them."""

    def __init__(self) -> None:
        self.tcp, self.udp = free_port(), free_port()

    def server_env(self) -> dict[str, str]:
        """For the pvwire server: its PVA server on these ports, and its own PVA client
        searching them too, beside the shared test IOC."""
        own = f"127.0.0.1:{self.udp}"
        return {
            "EPICS_PVAS_SERVER_PORT": str(self.tcp),
            "EPICS_PVAS_BROADCAST_PORT": str(self.udp),
            "EPICS_PVA_ADDR_LIST": f"{os.environ.get('EPICS_PVA_ADDR_LIST', '')} {own}".strip(),
        }

    def client_conf(self) -> dict[str, str]:
        return {
            "EPICS_PVA_ADDR_LIST": f"127.0.0.1:{self.udp}",
            "EPICS_PVA_AUTO_ADDR_LIST": "NO",
            "EPICS_PVA_BROADCAST_PORT": str(self.udp),
        }


@pytest.fixture(scope="module")
def ports() -> StatusPorts:
    return StatusPorts()


@pytest.fixture(scope="module")
def status_server(ports: StatusPorts) -> Iterator[ServerProcess]:
    args = server_args_for_tests(["--status-prefix", PREFIX])
    with ServerProcess(*args, env=ports.server_env()) as proc:
        yield proc


@pytest.fixture
def client_url(status_server: ServerProcess) -> str:
    return status_server.url


@pytest.fixture
async def pva(ports: StatusPorts) -> AsyncIterator[Context]:
    """p4p's asyncio client (its thread client can lose a subscription: DESIGN.md section 9)."""
    ctxt = Context("pva", conf=ports.client_conf(), useenv=False)
    try:
        yield ctxt
    finally:
        ctxt.close()


async def get(pva: Context, name: str, timeout: float = 30.0) -> Any:
    async with asyncio.timeout(timeout):
        return await pva.get(name)


class Monitor:
    """Every update p4p's monitor of one PV delivers, as raw Values."""

    def __init__(self, pva: Context, name: str) -> None:
        self.updates: list[Any] = []
        self.name = name

        async def keep(value: Any) -> None:
            if not isinstance(value, Exception):
                self.updates.append(value.raw)

        self.sub = pva.monitor(name, keep, notify_disconnect=True)

    def last(self) -> Any:
        return self.updates[-1] if self.updates else None

    def what(self) -> str:
        return f"{self.name}: {[(u.value, u.alarm.severity) for u in self.updates[-5:]]}"


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


async def test_every_status_pv_answers_with_its_type_units_and_alarm_limits(
    status_server: ServerProcess, pva: Context
) -> None:
    for name, pv in TABLE.items():
        v = (await get(pva, PREFIX + name)).raw
        assert v.getID() == "epics:nt/NTScalar:1.0", name
        assert v.display.units == pv.units and v.display.description == pv.description, name
        if pv.code != "s":
            assert v.display.precision == pv.precision, name
        if pv.alarm is None:
            assert "valueAlarm" not in v, name
            continue
        a, limits = pv.alarm, v.valueAlarm
        assert limits.active, name
        assert same(limits.highWarningLimit, a.high_warning) or pv.code == "i", name
        assert same(limits.highAlarmLimit, a.high_alarm) or pv.code == "i", name
        assert (limits.highWarningSeverity, limits.highAlarmSeverity) == (
            0 if math.isnan(a.high_warning) else 1,
            0 if math.isnan(a.high_alarm) else 2,
        ), name
        assert limits.lowAlarmSeverity == (0 if math.isnan(a.low_alarm) else 2), name
    assert (await get(pva, PREFIX + "version")) == __version__
    assert (await get(pva, PREFIX + "ready")) == 1  # /readyz answers 200
    lag = (await get(pva, PREFIX + "loopLag")).raw
    assert lag.valueAlarm.highAlarmLimit == 5.0 and lag.alarm.severity == 0


async def test_the_status_pvs_take_no_puts(pva: Context) -> None:
    with pytest.raises(RemoteError, match="not supported"):
        async with asyncio.timeout(30):
            await pva.put(PREFIX + "clients", 0)


async def test_figures_follow_the_clients_and_their_updates(
    status_server: ServerProcess, pva: Context, client: Client
) -> None:
    """Three clients receiving a 20 Hz counter: clients counts them, the rates are those of
    real updates and deliveries, and /metrics counted the same."""
    readers = [Client(status_server.url, timeout=10) for _ in range(2)]
    streams = [c.monitor("sim://counter/status?rate=20") for c in (client, *readers)]
    try:
        for s in streams:  # each has its first value: three clients are attached
            async with asyncio.timeout(30):
                await anext(s)
        figures = {n: Monitor(pva, PREFIX + n) for n in ("clients", "deliveriesPerSec")}

        def busy() -> bool:
            c, d = figures["clients"].last(), figures["deliveriesPerSec"].last()
            return c is not None and c.value >= 3 and d is not None and d.value >= 20

        await eventually_async(busy, lambda: "; ".join(m.what() for m in figures.values()))
        for name in ("updatesPerSec", "bytesPerSec"):
            assert (await get(pva, PREFIX + name)) > 0, name
        assert (await get(pva, PREFIX + "channels")) >= 1
        delivered = re.search(r"^pvwire_deliveries_total (\d+)$", status_server.metrics(), re.M)
        assert delivered and int(delivered[1]) >= 20
        for m in figures.values():
            m.sub.close()
    finally:
        for s in streams:
            await s.aclose()
        for c in readers:
            await c.aclose()


async def test_a_pv_is_posted_when_its_value_changes(pva: Context) -> None:
    """uptime changes every period, version never: its one update is the first value."""
    version, uptime = Monitor(pva, PREFIX + "version"), Monitor(pva, PREFIX + "uptime")
    try:
        await eventually_async(lambda: len(uptime.updates) >= 4 and version.updates, uptime.what)
        assert len(version.updates) == 1 and version.updates[0].value == __version__
        stamps = [u.timeStamp.secondsPastEpoch + u.timeStamp.nanoseconds * 1e-9
                  for u in uptime.updates]  # fmt: skip
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    finally:
        version.sub.close()
        uptime.sub.close()


async def test_refusals_raise_the_alarm_and_it_clears(
    status_server: ServerProcess, pva: Context
) -> None:
    """30 refused bearer tokens: 3 a second over the 10 s window, past the MINOR limit (1/s);
    once they are older than the window, the alarm clears."""
    refusals = Monitor(pva, PREFIX + "refusalsPerSec")
    try:
        await eventually_async(refusals.last, refusals.what)
        await asyncio.to_thread(refuse_bearer_tokens, status_server, 30)
        raised = await eventually_async(
            lambda: next((u for u in refusals.updates if u.alarm.severity == 1), None),
            refusals.what,
        )
        assert raised.value >= 1.0 and raised.alarm.message == "HIGH"
        await eventually_async(
            lambda: refusals.last().alarm.severity == 0 and refusals.last().value < 1.0,
            refusals.what,
        )
    finally:
        refusals.sub.close()


async def test_pvwire_reads_its_own_status_pvs_through_pva_channels(client: Client) -> None:
    """Its own PVA client finds its own PVA server: GraphQL gets the metadata the table gives,
    and a /stream monitor of `clients` counts that very monitor's client."""
    lag = await client.get(f"pva://{PREFIX}loopLag")
    assert isinstance(lag.value, float) and lag.severity == 0
    meta = lag.metadata
    assert meta["units"] == "s" and meta["precision"] == 3
    assert meta["alarm"][1] == 5.0 and meta["warning"][1] == 1.0  # highs; the lows are unset
    assert (await client.get(f"pva://{PREFIX}version")).value == __version__
    stream = client.monitor(f"pva://{PREFIX}clients")
    try:
        async with asyncio.timeout(60):
            async for u in stream:
                if isinstance(u.channel.value, int) and u.channel.value >= 1:
                    assert u.channel.metadata["units"] == "clients"
                    break
    finally:
        await stream.aclose()


def test_a_status_server_that_cannot_start_is_logged_once_and_http_goes_on() -> None:
    """Another program holds the PVA search port (UDP, not shared): the PVA server cannot
    start; the server says so once and serves HTTP, GraphQL and /stream as without it."""
    ports = StatusPorts()
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("127.0.0.1", ports.udp))
    try:
        args = server_args_for_tests(["--status-prefix", "PVWT:FAIL:"])
        with ServerProcess(*args, env=ports.server_env()) as proc:
            what = "PVWT:FAIL: are not served"
            eventually(lambda: what in proc.log(), proc.log)
            doc = proc.graphql('{ channel(id: "sim://counter/fail") { value } }')
            assert "errors" not in doc and doc["data"]["channel"]["value"] is not None
            with urllib.request.urlopen(f"{proc.url}/readyz", timeout=30) as r:
                assert r.status == 200
            assert "pvwire_clients" in proc.metrics()
            assert proc.log().count(what) == 1, proc.log()
    finally:
        holder.close()


def test_each_worker_serves_its_figures_under_its_number_and_a_replacement_takes_it() -> None:
    """`--workers 2`: PREFIX W1: and W2:; a worker killed is replaced by uvicorn, under a new
    process number (3), and its replacement serves under the number it left."""
    ports = StatusPorts()
    prefix = "PVWT:WRK:"
    args = server_args_for_tests(["--status-prefix", prefix, "--workers", "2"])

    async def uptimes() -> dict[str, float]:
        ctxt = Context("pva", conf=ports.client_conf(), useenv=False)
        try:
            names = [f"{prefix}W{n}:uptime" for n in (1, 2, 3)]
            got = await asyncio.gather(*(get(ctxt, n, 5) for n in names), return_exceptions=True)
            return {n: float(v) for n, v in zip(names, got, strict=True) if isinstance(v, float)}
        finally:
            ctxt.close()

    def both() -> dict[str, float] | None:
        found = asyncio.run(uptimes())
        return found if set(found) == {f"{prefix}W1:uptime", f"{prefix}W2:uptime"} else None

    with ServerProcess(*args, env=ports.server_env()) as proc:
        assert proc.pid is not None
        before = eventually(both, proc.log, timeout=60)
        workers = [p for p in psutil.Process(proc.pid).children() if is_worker(p)]
        assert len(workers) == 2
        workers[0].kill()
        workers[0].wait(30)

        def replaced() -> dict[str, float] | None:
            # Never W3: the replacement takes the number left. It started after `before` was
            # read, so the survivor has run longer than it by more than it had then.
            found = both()
            if found and max(found.values()) - min(found.values()) > min(before.values()):
                return found
            return None

        eventually(replaced, proc.log, timeout=90)


def is_worker(p: psutil.Process) -> bool:
    """One of uvicorn's workers (multiprocessing's spawned processes), not its resource tracker."""
    with contextlib.suppress(psutil.Error):
        return any("spawn_main" in part for part in p.cmdline())
    return False
