"""The reflective topology on real parts: IOC -> p4p's gateway (pvagw) -> two pvwire replicas over
PVA, each streaming to a Python client. QSRV's own report (`pvxsr`) shows the IOC serving ONE
monitor per PV, to the gateway, however many replicas watch; the same replicas pointed straight
at the IOC cost it one monitor each. bench/gateway.py measures what the gateway adds."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pvwire_client import Client
from pvwire_client.state import CONNECTED
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually_async
from tests.pva_gateway import PvaGateway, qsrv_monitors
from tests.server_process import ServerProcess, server_args_for_tests

# Names no other IOC on this host serves (other test runs may share the machine): a replica can
# then only have found them through this test's gateway or IOC.
PREFIX = f"GWT{uuid.uuid4().hex[:8]}:"
PVS = [f"{PREFIX}COUNTER", f"{PREFIX}SLOW", f"{PREFIX}WF"]
DB = (
    "".join(
        f'record(calc, "{pv}") {{\n  field(SCAN, "{scan}")\n  field(CALC, "A+1")\n'
        f'  field(INPA, "{pv} NPP")\n}}\n'
        for pv, scan in zip(PVS[:2], (".1 second", "1 second"), strict=True)
    )
    + f'record(waveform, "{PVS[2]}") {{\n  field(FTVL, "DOUBLE")\n  field(NELM, "16")\n}}\n'
)
REPLICAS = 2
BOUND = 60.0  # generous: a loaded 2-core machine


@pytest.fixture
def ioc(tmp_path: Path) -> Iterator[IocProcess]:
    db = tmp_path / "gateway.db"
    db.write_text(DB)
    with IocProcess([db]) as proc:  # its own ports: the shared test IOC is not touched
        yield proc


async def stream_values(server: ServerProcess) -> None:
    """A client of this replica gets every PV with a value (the replica's monitors are open)."""
    async with Client(server.url) as client:
        seen: set[str] = set()
        async for u in client.monitor([f"pva://{pv}" for pv in PVS]):
            if u.channel.state == CONNECTED and u.channel.value is not None:
                seen.add(u.channel.id)
            if len(seen) == len(PVS):
                return


def per_pv(monitors: Counter[tuple[str, str]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for (pv, _), n in monitors.items():
        out[pv] += n
    return out


async def wait_monitors(ioc: IocProcess, expected: dict[str, int]) -> Counter[tuple[str, str]]:
    """QSRV's report once it shows `expected` monitors per PV (monitors open asynchronously)."""
    last: list[Counter[tuple[str, str]]] = []

    async def report() -> Counter[tuple[str, str]] | None:
        last[:] = [await asyncio.to_thread(qsrv_monitors, ioc)]
        return last[0] if {pv: per_pv(last[0])[pv] for pv in PVS} == expected else None

    return await eventually_async(
        report, lambda: f"{expected} monitors; QSRV reports {last}", timeout=BOUND, interval=0.5
    )


async def test_the_ioc_serves_one_monitor_per_pv_whatever_the_number_of_replicas(
    ioc: IocProcess,
) -> None:
    gateway = PvaGateway(ioc.ports)
    replicas = [
        ServerProcess(*server_args_for_tests(), env=gateway.ports.client_env())
        for _ in range(REPLICAS)
    ]
    direct = [
        ServerProcess(*server_args_for_tests(), env=ioc.ports.client_env()) for _ in range(REPLICAS)
    ]
    with contextlib.ExitStack() as stack:
        gateway.start()
        stack.callback(gateway.stop)
        for r in replicas:
            r.start()
            stack.callback(r.stop)
        # Clients keep every replica's monitors open while the IOC is asked.
        tasks = [asyncio.create_task(hold(r)) for r in replicas]
        try:
            for r in replicas:
                await asyncio.wait_for(stream_values(r), BOUND)
            through_gateway = await wait_monitors(ioc, dict.fromkeys(PVS, 1))
            assert per_pv(through_gateway) == Counter(dict.fromkeys(PVS, 1)), through_gateway
            (gateway_peer,) = {peer for _, peer in through_gateway}

            # The same replicas without the gateway: the IOC serves each of them.
            for r in direct:
                r.start()
                stack.callback(r.stop)
            tasks += [asyncio.create_task(hold(r)) for r in direct]
            for r in direct:
                await asyncio.wait_for(stream_values(r), BOUND)
            mixed = await wait_monitors(ioc, dict.fromkeys(PVS, 1 + REPLICAS))
            assert per_pv(mixed) == Counter(dict.fromkeys(PVS, 1 + REPLICAS)), mixed
            peers = {peer for _, peer in mixed}
            assert gateway_peer in peers and len(peers) == 1 + REPLICAS
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t


async def hold(server: ServerProcess) -> None:
    """Keep a monitor of every PV open on `server` until cancelled."""
    async with Client(server.url) as client:
        async for _ in client.monitor([f"pva://{pv}" for pv in PVS]):
            pass
