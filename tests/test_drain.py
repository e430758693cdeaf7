"""The drain on SIGTERM with real parts: three replicas behind a real HAProxy that checks
`/readyz` (as Kubernetes' readiness probe does), Python clients following the shared test IOC's
10 Hz counter in ALL mode with a backfill, the counter's history recorded on every replica.

SIGTERM to the busiest replica: its `/readyz` answers 503 at once; its clients keep receiving
for `drain_delay_s`; then they are closed with 4012 DRAINING one after another over
`drain_window_s` (their loss times spread over it, not all at once); a new stream to it in the
window is refused (1013) and a pvws client is closed with 1012; each client reconnects through
the proxy to another replica, re-attaching with `since`, and has every counter value, none lost;
the process exits with 0 within its grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import websockets
from pvwire_client import Client
from pvwire_client.state import CONNECTED, DISCONNECTED
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually_async
from tests.replicas import COUNTER, Haproxy, clients_per_replica, start_replicas
from tests.server_process import ServerProcess

CLIENTS = 9
DELAY_S, WINDOW_S = 2.0, 4.0
BOUND = 60.0  # a generous bound for a loaded machine, never a measure


@pytest.fixture
def cluster(epics_env: IocProcess) -> Iterator[tuple[list[ServerProcess], Haproxy]]:
    env = {"PVWIRE_DRAIN_DELAY_S": str(DELAY_S), "PVWIRE_DRAIN_WINDOW_S": str(WINDOW_S)}
    replicas = start_replicas(3, ["--history-channels", COUNTER], env)
    proxy = Haproxy([r.port for r in replicas], check="/readyz")
    try:
        proxy.start()
        yield replicas, proxy
    finally:
        proxy.stop()
        for r in replicas:
            r.stop()


@dataclass
class Follower:
    """One client following the counter: every value (past rows and live ones) and when the
    stream was lost (with why) and back."""

    url: str
    values: list[tuple[float, int, bool]] = field(default_factory=list)  # (arrival, value, past)
    lost: list[tuple[float, str]] = field(default_factory=list)
    resumed: list[float] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        async with Client(self.url) as c:
            async for u in c.monitor(COUNTER, mode="ALL", backfill=60):
                now, ch = time.monotonic(), u.channel
                if ch.state == DISCONNECTED:
                    self.lost.append((now, ch.reason or ""))
                elif ch.state == CONNECTED and ch.value is not None:
                    if len(self.resumed) < len(self.lost):
                        self.resumed.append(now)
                    self.values.append((now, int(ch.value), u.past))

    def live_between(self, start: float, end: float) -> int:
        return sum(start <= t < end and not past for t, _, past in self.values)


def resumed(f: Follower) -> bool:
    return bool(f.resumed)


def grew(f: Follower, to: int) -> bool:
    return len(f.values) >= to


def readyz(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


async def test_sigterm_drains_paced_and_clients_move_losing_nothing(
    cluster: tuple[list[ServerProcess], Haproxy],
    record_property: Callable[[str, object], None],
) -> None:
    replicas, proxy = cluster
    followers = [Follower(proxy.url) for _ in range(CLIENTS)]
    pvws: websockets.ClientConnection | None = None
    for f in followers:
        f.task = asyncio.create_task(f.run())
    try:
        await eventually_async(
            lambda: all(len(f.values) >= 3 for f in followers), "every client streaming",
            timeout=BOUND,
        )  # fmt: skip
        counts = clients_per_replica(replicas)
        assert sum(counts.values()) == CLIENTS, counts
        victim = next(r for r in replicas if r.port == max(counts, key=lambda p: counts[p]))
        served = counts[victim.port]
        assert served >= 2
        assert (await asyncio.to_thread(readyz, victim.url))[0] == 200
        # A pvws client on the victim itself, and one on a survivor that must not notice.
        pvws = await websockets.connect(victim.ws_url.replace("/stream", "/pvws/pv"))
        await pvws.send(json.dumps({"type": "subscribe", "pvs": ["ca://PVW:COUNTER"]}))
        await pvws.recv()

        term = time.monotonic()
        victim.signal(signal.SIGTERM)
        status, body = await asyncio.to_thread(readyz, victim.url)
        assert status == 503 and body["draining"] is True  # at once, the first answer
        moved = await eventually_async(
            lambda: [f for f in followers if f.lost] if sum(bool(f.lost) for f in followers)
            >= served else None,
            "the victim's clients closed", timeout=BOUND, interval=0.05,
        )  # fmt: skip
        assert len(moved) == served
        # A new stream to the victim once its closes began: refused before HELLO, 1013.
        async with websockets.connect(victim.ws_url) as late:
            with pytest.raises(websockets.ConnectionClosed) as refused:
                await late.recv()
            assert refused.value.rcvd is not None and refused.value.rcvd.code == 1013
        for f in moved:
            await eventually_async(functools.partial(resumed, f), "the client back", timeout=BOUND)
        # Closed only after the delay, each with 4012, and it kept receiving until then.
        losses = sorted(f.lost[0][0] for f in moved)
        for f in moved:
            when, reason = f.lost[0]
            assert when - term >= DELAY_S, when - term
            assert reason.startswith("stream closed: 4012 DRAINING (reconnect within "), reason
            assert f.live_between(term, when) >= 5  # 10 Hz for at least 2 s
        record_property("drain_closes_after_sigterm_s", [round(t - term, 2) for t in losses])
        print("closes after SIGTERM (s):", [round(t - term, 2) for t in losses])
        # Paced: the closes span most of the window ((n - 1) / n of it when ideal), not a blink.
        assert losses[-1] - losses[0] >= WINDOW_S * (served - 1) / served / 3, losses
        # The pvws client is closed paced too, with the code pvws clients reconnect on.
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with asyncio.timeout(BOUND):
                while True:
                    await pvws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
        # Every client on a surviving replica, and not one counter value lost by anyone.
        live = [r for r in replicas if r is not victim]
        await eventually_async(
            lambda: asyncio.to_thread(lambda: sum(clients_per_replica(live).values()) == CLIENTS),
            "every client on a survivor", timeout=BOUND,
        )  # fmt: skip
        for f in moved:
            await eventually_async(
                functools.partial(grew, f, len(f.values) + 3), "values after", timeout=BOUND
            )
            seen = {v for _, v, _ in f.values}
            missing = set(range(min(seen), max(seen) + 1)) - seen
            assert not missing, (sorted(missing), f.lost)
        # The process ends by itself, with 0, within the delay, the window and the shutdown.
        code = await asyncio.to_thread(victim.wait, DELAY_S + WINDOW_S + BOUND)
        assert code == 0, victim.log()
    finally:
        for f in followers:
            if f.task is not None:
                f.task.cancel()
        await asyncio.gather(*(f.task for f in followers if f.task), return_exceptions=True)
        if pvws is not None:
            with contextlib.suppress(Exception):
                await pvws.close()


async def test_workers_each_drain_and_the_supervisor_exits_with_0(epics_env: IocProcess) -> None:
    """`--workers 2`: uvicorn's supervisor passes SIGTERM to each worker, which drains as a lone
    server does (its streams closed with 4012 after the delay), then the whole exits with 0."""
    env = {"PVWIRE_DRAIN_DELAY_S": "1", "PVWIRE_DRAIN_WINDOW_S": "1"}
    with ServerProcess("--workers", "2", env=env) as server:
        streams = [await websockets.connect(server.ws_url) for _ in range(4)]
        for ws in streams:
            await ws.recv()  # HELLO
        term = time.monotonic()
        server.signal(signal.SIGTERM)
        for ws in streams:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                async with asyncio.timeout(BOUND):
                    while True:
                        await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4012
            assert time.monotonic() - term >= 1.0  # not before the delay
        assert await asyncio.to_thread(server.wait, BOUND) == 0
