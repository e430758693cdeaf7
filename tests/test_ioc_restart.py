"""An IOC killed and restarted: clients see the disconnect, then values resume by themselves.

This test runs its own IOC and server (private ports) so stopping the IOC disturbs no other test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pvwire_client import Client
from pvwire_dev.ioc import IocProcess

from tests.server_process import ServerProcess, server_args_for_tests

DB = Path(__file__).parent / "dbs" / "test.db"
IDS = ["ca://PVW:COUNTER", "pva://PVW:COUNTER"]
# CA comes back within ~1 s of the IOC (bench/ca_recovery.py); PVA searches back off up to
# ~10 s (DESIGN.md section 9). Generous: this asserts that it comes back, not how fast.
RECONNECT_TIMEOUT = 30.0


@pytest.fixture
async def own_stack() -> AsyncIterator[tuple[IocProcess, ServerProcess]]:
    ioc = IocProcess([DB])
    ioc.start()
    server = ServerProcess(*server_args_for_tests(), env=ioc.ports.client_env())
    server.start()
    try:
        yield ioc, server
    finally:
        server.stop()
        ioc.stop()


async def test_ioc_restart_is_seen_and_recovered(
    own_stack: tuple[IocProcess, ServerProcess],
) -> None:
    ioc, server = own_stack
    async with Client(server.url) as client:
        updates = client.monitor(IDS)
        states: dict[str, list[tuple[int, object]]] = {i: [] for i in IDS}

        async def until(predicate: object, timeout: float) -> None:
            async with asyncio.timeout(timeout):
                async for u in updates:
                    states[u.channel.id].append((u.channel.state, u.channel.value))
                    if predicate():  # type: ignore[operator]
                        return

        def all_connected_with_value() -> bool:
            return all(s and s[-1][0] == 1 and s[-1][1] is not None for s in states.values())

        await until(all_connected_with_value, 15)
        ioc.stop()
        await until(lambda: all(s[-1][0] == 2 for s in states.values()), 15)
        # Disconnected channels keep their last value, flagged as disconnected. The 10 Hz
        # counter's last update may come in the same frame as the disconnect (one tick merges
        # both): the value held is the newest seen, never cleared or older.
        before: dict[str, float] = {}
        for i, s in states.items():
            down = next(k for k, (state, _) in enumerate(s) if state == 2)
            held = s[down][1]
            connected = [v for state, v in s[:down] if state == 1]
            assert isinstance(held, int | float) and connected, (i, s[-5:])
            assert held >= connected[-1], (i, s[-5:])  # type: ignore[operator]
            assert all(v == held for _, v in s[down:]), (i, s[down:])
            before[i] = held
        marks = {i: len(s) for i, s in states.items()}
        ioc.start()  # same ports: nothing on the client side changes

        def resumed() -> bool:
            return all(
                any(st == 1 for st, _ in s[marks[i] :]) and s[-1][0] == 1 and len(s) > marks[i] + 2
                for i, s in states.items()
            )

        await until(resumed, RECONNECT_TIMEOUT)
        await updates.aclose()
    # The restarted IOC counts from 0 again: fresh values arrived after the reconnect.
    for i in IDS:
        assert states[i][-1][1] != before[i]
