"""Session-wide EPICS setup: one test IOC, and its client environment in os.environ.

libca and pvxs read the EPICS_* environment once, when their context is created, and the whole
suite runs in one pytest process; so the environment is set here, when the suite starts, before
any test creates a CA or PVA context: the loopback settings, and the ports of the one IOC that
every module shares (tests/dbs/test.db). The IOC itself runs only once a test requests it
(`epics_env`, directly or through a fixture such as `server`): unit tests start no IOC.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from pvwire.config import Settings
from pvwire.core.hub import Hub
from pvwire.loopback import apply_loopback_env
from pvwire.model import ConnState, Metadata, Value
from pvwire.wire.tokens import TokenSigner
from pvwire_client import Client
from pvwire_dev.ioc import IocProcess

from tests.keycloak import Keycloak
from tests.leaks import collect_after_each_module  # noqa: F401  (autouse: applies here)
from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess, server_args_for_tests

from . import hub_doubles
from .eventually import TIMEOUT, eventually_async

DBS = Path(__file__).parent / "dbs"

# One hypothesis profile for every property test, loaded here so that it is the default before
# any test module is imported (a test's own @settings inherits from it). The suite shares a 2-core
# machine with other jobs, so nothing may depend on how fast an example runs: no deadline, and no
# too_slow health check (it failed test_round_trip once under load). The other health checks flag
# a strategy's shape, not the machine's speed, so they stay on. CI runs the same examples every
# time (derandomize) and keeps no example database, so a red CI run can be reproduced anywhere.
hypothesis_settings.register_profile(
    "pvwire", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.register_profile(
    "pvwire-ci",
    hypothesis_settings.get_profile("pvwire"),
    derandomize=True,
    database=None,
    print_blob=True,
)
hypothesis_settings.load_profile(
    "pvwire-ci" if os.environ.get("CI", "").lower() in ("1", "true") else "pvwire"
)


# For this process and every process it starts, whether or not a test needs the IOC: its ports
# are chosen now (below the ephemeral range, see pvwire_dev.ioc.free_port), the IOC starts later.
apply_loopback_env()
_SHARED_IOC = IocProcess([DBS / "test.db"])
os.environ.update(_SHARED_IOC.ports.client_env())


@pytest.fixture(scope="session")
def epics_env() -> Iterator[IocProcess]:
    """The shared test IOC, already running; os.environ holds what a client needs to reach it.

    Tests that stop and restart it (`ioc.stop(); ioc.start()`, same ports) must leave it running.
    """
    _SHARED_IOC.start()
    try:
        yield _SHARED_IOC
    finally:
        _SHARED_IOC.stop()


class RecordingSink:
    """A ChannelSink test double: records every call, in order, and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.updates: list[Update] = []
        self.metas: list[Metadata] = []
        self.states: list[tuple[ConnState, str]] = []
        self.skipped = 0

    def on_update(
        self,
        value: Value,
        seconds: int,
        nanoseconds: int,
        severity: int,
        status: int,
        message: str,
        skipped: int = 0,
    ) -> None:
        self.skipped += skipped
        update = Update(value, seconds, nanoseconds, severity, status, message)
        self.updates.append(update)
        self.events.append(("update", update))

    def on_meta(self, meta: Metadata) -> None:
        self.metas.append(meta)
        self.events.append(("meta", meta))

    def on_connection(self, state: ConnState, reason: str = "") -> None:
        self.states.append((state, reason))
        self.events.append(("conn", state))

    @property
    def state(self) -> ConnState | None:
        return self.states[-1][0] if self.states else None

    def numbers(self) -> list[float]:
        """The updates' values, in order, each a number (a counter's, say)."""
        numbers = [u.value for u in self.updates if isinstance(u.value, int | float)]
        assert len(numbers) == len(self.updates), f"not all numbers: {self.updates[-10:]}"
        return numbers

    async def wait(self, predicate: Callable[[], object], timeout: float = TIMEOUT) -> None:
        """Until `predicate()` is true; fails with what was recorded after `timeout`."""
        await eventually_async(
            predicate, lambda: f"recorded: {self.events[-10:]}", timeout=timeout, interval=0.01
        )


class Update(NamedTuple):
    value: Value
    seconds: int
    nanoseconds: int
    severity: int
    status: int
    message: str


@pytest.fixture(scope="session")
def server(epics_env: IocProcess) -> Iterator[ServerProcess]:
    """One real pvwire server for the session, connected to the shared test IOC."""
    with ServerProcess(*server_args_for_tests()) as proc:
        yield proc


@pytest.fixture(scope="session")
def server_url(server: ServerProcess) -> str:
    return server.url


@pytest.fixture
def client_url(server_url: str) -> str:
    """The server `client` connects to: the session's, unless a module overrides this with its
    own server's."""
    return server_url


@pytest.fixture
async def client(client_url: str) -> AsyncIterator[Client]:
    """A pvwire Python client of `client_url`, closed after the test. Its `get` waits up to 10 s
    for a channel to connect: generous for a busy machine, as every test here needs."""
    async with Client(client_url, timeout=10) as c:
        yield c


@pytest.fixture
async def pvws_client(client_url: str) -> AsyncIterator[PvwsClient]:
    """A pvws client (tests/pvws_client.py) of `client_url`, closed after the test."""
    c = await PvwsClient.connect(client_url)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(scope="session")
def keycloak() -> Iterator[Keycloak]:
    """A real identity provider (tests/keycloak.py), started once, by the tests that ask."""
    kc = Keycloak()
    kc.start()
    try:
        yield kc
    finally:
        kc.stop()


# In-memory hub for unit tests of the core (tests/hub_doubles.py).
@pytest.fixture
def backend() -> hub_doubles.FakeBackend:
    return hub_doubles.FakeBackend()


@pytest.fixture
async def hub(backend: hub_doubles.FakeBackend) -> Any:
    settings = Settings(default_scheme="fake", linger_s=0.0, tick_ms=20)
    h = Hub({"fake": backend}, settings, TokenSigner(hub_doubles.KEYS, "k1"))
    h.start()
    yield h
    await h.stop()
