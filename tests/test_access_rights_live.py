"""CA access rights changed at run time reach the clients' `writable` while they watch: a record
moved to another access security group (`dbpf REC.ASG ...`) and an ACF reloaded with `asInit`,
on a real IOC enforcing tests/dbs/acf.acf, seen through a real server by the Python client.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pvwire_client import Client, Update
from pvwire_dev.ioc import IocProcess

from tests.server_process import ServerProcess

pytestmark = pytest.mark.ioc

DBS = Path(__file__).parent / "dbs"


@pytest.fixture(scope="module")
def acf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the ACF, which a test rewrites before asking the IOC to read it again."""
    path = tmp_path_factory.mktemp("acf") / "acf.acf"
    shutil.copy(DBS / "acf.acf", path)
    return path


@pytest.fixture(scope="module")
def ioc(acf: Path) -> Iterator[IocProcess]:
    with IocProcess([DBS / "acf.db"], acf=acf) as ioc:
        yield ioc


@pytest.fixture(scope="module")
def server(ioc: IocProcess) -> Iterator[ServerProcess]:
    args = ("--write-rule", "ca://ACF:*", "--log-level", "warning")
    with ServerProcess(*args, env=ioc.ports.client_env()) as server:
        yield server


def iocsh(ioc: IocProcess, command: str) -> None:
    ioc.execute(f"import epicscorelibs.ioc as _e; _e.iocshCmd({command!r}.encode())")


async def until_writable(updates: AsyncIterator[Update], writable: bool) -> Update:
    """The first update whose channel is (or is not) writable; 30 s at most."""
    async with asyncio.timeout(30):
        async for u in updates:
            if u.channel.writable is writable:
                return u
    raise AssertionError("the monitor ended")


async def test_a_records_new_asg_reaches_writable(ioc: IocProcess, server: ServerProcess) -> None:
    async with Client(server.url) as c:
        updates = c.monitor("ca://ACF:FLIP")
        first = await until_writable(updates, True)
        assert first.channel.metadata["writable"] is True
        iocsh(ioc, "dbpf ACF:FLIP.ASG READONLY")
        u = await until_writable(updates, False)
        assert u.channel.metadata["writable"] is False and "metadata" in u.changed
        assert not (await c.get("ca://ACF:FLIP")).writable  # the cached reading follows too
        iocsh(ioc, "dbpf ACF:FLIP.ASG DEFAULT")
        u = await until_writable(updates, True)
        assert u.channel.metadata["writable"] is True


async def test_losing_read_access_too_reaches_writable(
    ioc: IocProcess, server: ServerProcess
) -> None:
    """rsrv tells a client of new rights twice: an access rights message, then one more event on
    each subscription, which carries no value (ECA_NORDACCESS) when read access is gone too.
    Only the access rights message can then say that the channel is no longer writable."""
    async with Client(server.url) as c:
        updates = c.monitor("ca://ACF:FLIP")
        await until_writable(updates, True)
        try:
            iocsh(ioc, "dbpf ACF:FLIP.ASG NOACCESS")
            u = await until_writable(updates, False)
            assert u.channel.metadata["writable"] is False
        finally:
            iocsh(ioc, "dbpf ACF:FLIP.ASG DEFAULT")
        await until_writable(updates, True)


async def test_a_reloaded_acf_reaches_writable(
    ioc: IocProcess, server: ServerProcess, acf: Path
) -> None:
    original = acf.read_text()
    async with Client(server.url) as c:
        updates = c.monitor("ca://ACF:OPEN")
        await until_writable(updates, True)
        try:
            # DEFAULT loses its WRITE rule: every record in it turns read-only.
            acf.write_text(
                original.replace(
                    "    RULE(1, READ)\n    RULE(1, WRITE)\n", "    RULE(1, READ)\n", 1
                )
            )
            iocsh(ioc, "asInit")
            u = await until_writable(updates, False)
            assert u.channel.metadata["writable"] is False
        finally:
            acf.write_text(original)
            iocsh(ioc, "asInit")
        await until_writable(updates, True)
