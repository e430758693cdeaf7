"""PVA connections under a user's name (upstream/pva_identity.py) against real servers: a QSRV
soft IOC enforcing tests/dbs/acf.acf, and a p4p server that reports the account each put came
with. The bounds on connections, channels, names and messages, idle closing, and failures kept
to one connection. No pvxs client: the server's address comes from our own search."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from p4p.client.thread import Context
from p4p.nt import NTEnum, NTScalar
from p4p.server.thread import SharedPV
from pvwire.errors import ChannelNotFound, IocDenied, PutRejected, TypeMismatch, WriteDenied
from pvwire.limits import PVA_IDENTITY_MESSAGE_BYTES
from pvwire.upstream.pva_identity import Address, IdentityConnections, PvaSearch
from pvwire_dev.ioc import IocProcess, free_port

from tests.eventually import eventually_async
from tests.p4p_server import Accepting, p4p_server

pytestmark = pytest.mark.ioc

DBS = Path(__file__).parent / "dbs"


@pytest.fixture(scope="module")
def ioc() -> Iterator[IocProcess]:
    with IocProcess([DBS / "acf.db"], acf=DBS / "acf.acf") as ioc:
        yield ioc


@pytest.fixture
async def search(ioc: IocProcess) -> AsyncIterator[PvaSearch]:
    search = PvaSearch(ioc.ports.client_env())
    yield search
    search.close()


@pytest.fixture
async def address(search: PvaSearch) -> Address:
    return await search.find("ACF:SP", 30.0)


def read(ioc: IocProcess, name: str) -> Any:
    """The record's value as a plain pvxs client reads it."""
    with Context("pva", conf=ioc.ports.client_env(), useenv=False, nt=False) as ctx:
        return ctx.get(name, timeout=30.0)["value"]


async def test_the_ioc_decides_with_the_user_name(ioc: IocProcess, address: Address) -> None:
    connections = IdentityConnections("pvwire-host")
    try:
        await connections.put("olga", address, "ACF:SP", "value", 1.25, True, 30.0)
        assert await asyncio.to_thread(read, ioc, "ACF:SP") == 1.25
        for other in ("vic", "Ольга", "olga2"):  # any name but olga's, in any script
            with pytest.raises(IocDenied, match=other):
                await connections.put(other, address, "ACF:SP", "value", 2.5, True, 30.0)
        with pytest.raises(IocDenied):  # without waiting for the record: refused all the same
            await connections.put("vic", address, "ACF:SP", "value", 2.5, False, 30.0)
        for forged in ("olga\x00vic", "olga\n", "o" * 300, ""):  # the IOC would misread these
            with pytest.raises(WriteDenied):
                await connections.put(forged, address, "ACF:SP", "value", 2.5, True, 30.0)
        assert len(connections) == 4  # one per user who got as far as the IOC
        assert await asyncio.to_thread(read, ioc, "ACF:SP") == 1.25
        # Every kind of value a put writes, on the same connection.
        await connections.put("olga", address, "ACF:STR", "value", "olga's", True, 30.0)
        await connections.put("olga", address, "ACF:MODE", "value.index", 2, True, 30.0)
        wave = np.array([3, -4, 5], dtype=np.int16)
        await connections.put("olga", address, "ACF:WAVE", "value", wave, True, 30.0)
        assert await asyncio.to_thread(read, ioc, "ACF:STR") == "olga's"
        assert (await asyncio.to_thread(read, ioc, "ACF:MODE"))["index"] == 2
        assert list(await asyncio.to_thread(read, ioc, "ACF:WAVE")) == [3, -4, 5]
    finally:
        connections.close()


async def test_the_host_qsrv_decides_with_is_the_peer_address(address: Address) -> None:
    """ACF:PEER lets host 127.0.0.1 write: QSRV takes the connection's peer address, whatever
    host name is sent (docs/ACCESS.md)."""
    connections = IdentityConnections("laptop")
    try:
        await connections.put("vic", address, "ACF:PEER", "value", 3.0, True, 30.0)
    finally:
        connections.close()


async def test_connections_are_bounded_and_closed_when_idle(address: Address) -> None:
    # Idle for an hour first: a put slower than a short idle time on a busy machine must not
    # close u2's connection while u3's opens.
    connections = IdentityConnections("pvwire-host", max_connections=2, idle_s=3600.0)
    try:
        for user in ("u1", "u2", "u3"):
            await connections.put(user, address, "ACF:OPEN", "value", 1.0, True, 30.0)
        assert len(connections) == 2  # u1's, the least recently used, was closed
    finally:
        connections.close()
    connections = IdentityConnections("pvwire-host", idle_s=0.5)
    try:
        for user in ("u1", "u2"):
            await connections.put(user, address, "ACF:OPEN", "value", 2.0, True, 30.0)
        await eventually_async(lambda: len(connections) == 0)  # nobody puts: all closed
        await connections.put("u1", address, "ACF:OPEN", "value", 4.0, True, 30.0)
        assert len(connections) == 1  # a new one on demand
    finally:
        connections.close()


async def test_channels_per_connection_are_bounded(ioc: IocProcess, address: Address) -> None:
    connections = IdentityConnections("pvwire-host", max_channels=2)
    try:
        for name in ("ACF:OPEN", "ACF:PEER", "ACF:FLIP", "ACF:OPEN"):
            await connections.put("olga", address, name, "value", 6.0, True, 30.0)
        assert connections.channels() == 2
        assert await asyncio.to_thread(read, ioc, "ACF:FLIP") == 6.0
    finally:
        connections.close()


async def test_failures_stay_with_their_connection(address: Address) -> None:
    connections = IdentityConnections("pvwire-host")
    try:
        with pytest.raises(PutRejected, match="no connection") as refused:  # nobody listens
            await connections.put("olga", ("127.0.0.1", free_port()), "X", "value", 1, True, 30.0)
        assert str(refused.value).count("pva://X") == 1, refused.value  # the cause said once
        with pytest.raises(ChannelNotFound, match="pva://ACF:NO_SUCH_RECORD"):
            await connections.put("olga", address, "ACF:NO_SUCH_RECORD", "value", 1, True, 30.0)
        with pytest.raises(TypeMismatch, match="ACF:OPEN"):  # a string into a double
            await connections.put("olga", address, "ACF:OPEN", "value", "one", True, 30.0)
        with pytest.raises(TypeMismatch, match="no field"):
            await connections.put("olga", address, "ACF:OPEN", "value.index", 1, True, 30.0)
        await connections.put("olga", address, "ACF:OPEN", "value", 5.0, True, 30.0)
    finally:
        connections.close()


async def test_a_server_that_sends_too_much_loses_its_connection() -> None:
    """A message longer than the bound is refused from its header, before its body is read."""

    async def oversize(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\xca\x02\x40\x01" + struct.pack("<I", PVA_IDENTITY_MESSAGE_BYTES + 1))
        await reader.read()  # until the client hangs up
        writer.close()

    server = await asyncio.start_server(oversize, "127.0.0.1", 0)
    connections = IdentityConnections("pvwire-host")
    try:
        address = server.sockets[0].getsockname()[:2]
        with pytest.raises(PutRejected, match="more than"):
            await connections.put("olga", address, "X", "value", 1.0, True, 30.0)
    finally:
        connections.close()
        server.close()
        await server.wait_closed()


async def test_search_finds_the_server_and_remembers_a_bounded_number_of_names(
    ioc: IocProcess,
) -> None:
    search = PvaSearch(ioc.ports.client_env(), max_names=2)
    try:
        found = {await search.find(name, 30.0) for name in ("ACF:SP", "ACF:OPEN", "ACF:FLIP")}
        assert found == {("127.0.0.1", ioc.ports.pva_server)}
        assert len(search) == 2
        with pytest.raises(ChannelNotFound, match="pva://ACF:NOBODY"):
            await search.find("ACF:NOBODY", 0.5)
    finally:
        search.close()


async def test_a_host_name_in_the_address_list_is_resolved_once(
    ioc: IocProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not once per search: a lookup blocks, and a slow name server would stall every client."""
    lookups: list[str] = []
    resolve = socket.gethostbyname

    def counted(host: str) -> str:
        lookups.append(host)
        return resolve(host)

    monkeypatch.setattr(socket, "gethostbyname", counted)
    env = ioc.ports.client_env()
    env["EPICS_PVA_ADDR_LIST"] = env["EPICS_PVA_ADDR_LIST"].replace("127.0.0.1", "localhost")
    assert "localhost" in env["EPICS_PVA_ADDR_LIST"]
    search = PvaSearch(env)
    try:
        for name in ("ACF:SP", "ACF:OPEN", "ACF:FLIP"):
            assert await search.find(name, 30.0) == ("127.0.0.1", ioc.ports.pva_server)
        assert lookups.count("localhost") == 1
    finally:
        search.close()


async def test_a_p4p_server_hears_the_users_name_and_every_kind_of_value() -> None:
    """The pvxs server p4p wraps: what its put handler sees of the account and the values."""
    handler = Accepting()

    def pv(nt: Any, initial: Any) -> SharedPV:
        return SharedPV(nt=nt, initial=initial, handler=handler)

    pvs = {
        "P:D": pv(NTScalar("d"), 0.0),
        "P:S": pv(NTScalar("s"), ""),
        "P:U8": pv(NTScalar("B"), 0),
        "P:AI": pv(NTScalar("ai"), [0]),
        "P:AS": pv(NTScalar("as"), ["x"]),
        "P:E": pv(NTEnum(), {"index": 0, "choices": ["a", "b", "c"]}),
    }
    with p4p_server("identity", pvs) as env:
        search = PvaSearch(env)
        connections = IdentityConnections("pvwire-host")
        try:
            for name, path, value in (
                ("P:D", "value", -2.5),
                ("P:S", "value", "Ольга's"),
                ("P:U8", "value", 255),
                ("P:AI", "value", np.array([1, -2, 3])),
                ("P:AS", "value", ["one", "two"]),
                ("P:E", "value.index", 2),
            ):
                address = await search.find(name, 30.0)
                await connections.put("olga", address, name, path, value, True, 30.0)
            with pytest.raises(TypeMismatch):
                await connections.put("olga", address, "P:U8", "value", 256, True, 30.0)
        finally:
            connections.close()
            search.close()
    seen = handler.seen
    assert [(n, a) for n, a, _ in seen] == [
        (n, "olga") for n in ("P:D", "P:S", "P:U8", "P:AI", "P:AS", "P:E")
    ]
    values = [v for _, _, v in seen]
    assert values[:3] == [-2.5, "Ольга's", 255]
    assert list(values[3]) == [1, -2, 3] and list(values[4]) == ["one", "two"]
    assert values[5]["index"] == 2


@pytest.mark.parametrize("puts", [2, 5])
async def test_concurrent_puts_of_one_user_to_one_pv_each_get_their_own_answer(puts: int) -> None:
    """A slider, a double click, two tabs: puts of one user to one PV at once, on one
    connection. Each is answered as itself (on one request id, the first timed out while the
    second took its answer), and the server sees every value."""
    handler = Accepting()
    pvs = {"C:X": SharedPV(nt=NTScalar("d"), initial=0.0, handler=handler)}
    with p4p_server("concurrent", pvs) as env:
        search = PvaSearch(env)
        connections = IdentityConnections("pvwire-host")
        try:
            address = await search.find("C:X", 30.0)
            rounds = [(True, True), (True, False), (False, False)]  # (first puts, wait)
            for first, wait in rounds:  # the channel and operation made, then already there
                results = await asyncio.gather(
                    *(connections.put("olga", address, "C:X", "value", float(v), wait, 10.0)
                      for v in range(puts)),
                    return_exceptions=True,
                )  # fmt: skip
                assert results == [None] * puts, (first, wait, results)
            assert len(connections) == 1 and connections.channels() == 1
        finally:
            connections.close()
            search.close()
    expected = [float(v) for v in range(puts)] * len(rounds)
    assert sorted(v for _, _, v in handler.seen) == sorted(expected)
    assert {account for _, account, _ in handler.seen} == {"olga"}


async def test_concurrent_puts_to_the_ioc_each_complete(ioc: IocProcess, address: Address) -> None:
    """The same against QSRV, waiting for the record to process: the last value is the IOC's."""
    connections = IdentityConnections("pvwire-host")
    try:
        await connections.put("olga", address, "ACF:SP", "value", 0.5, True, 30.0)
        values = [1.5, 2.5, 3.5]
        results = await asyncio.gather(
            *(connections.put("olga", address, "ACF:SP", "value", v, True, 10.0) for v in values),
            return_exceptions=True,
        )
        assert results == [None] * len(values), results
        assert await asyncio.to_thread(read, ioc, "ACF:SP") == values[-1]
    finally:
        connections.close()


async def test_the_backend_refuses_what_it_cannot_write_as_a_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PvaBackend.put_as writes the value of an NTScalar, NTScalarArray or NTEnum; any other
    structure is refused before a connection is opened, naming what is supported."""
    from p4p.nt import NTTable
    from pvwire.upstream.pva import PvaBackend

    table = NTTable([("a", "d")])
    pvs = {
        "T:TABLE": SharedPV(nt=table, initial=table.wrap([{"a": 1.0}])),
        "T:E": SharedPV(
            nt=NTEnum(), initial={"index": 0, "choices": ["a", "b"]}, handler=Accepting()
        ),
    }
    with p4p_server("backend", pvs) as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        backend = PvaBackend(forward_identity=True)
        try:
            with pytest.raises(TypeMismatch, match="NTScalar, NTEnum, NTScalarArray"):
                await backend.put_as("olga", "T:TABLE", {"a": [2.0]}, True, 30.0)
            assert len(backend._connections or ()) == 0
            await backend.put_as("olga", "T:E", "b", True, 30.0)  # by label
            assert (await backend.get("T:E", 30.0)).value == 1
            with pytest.raises(TypeMismatch, match="valid labels"):
                await backend.put_as("olga", "T:E", "z", True, 30.0)
        finally:
            await backend.close()


async def test_the_backend_follows_a_server_that_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """The address remembered for a name goes stale when its server restarts elsewhere: the put
    that finds nobody there searches again and goes to the new server (nothing was sent)."""
    from pvwire.upstream.pva import PvaBackend

    backend = PvaBackend(forward_identity=True)
    connections = backend._connections
    assert connections is not None
    try:
        for value in (1.0, 2.0):
            handler = Accepting()
            pv = SharedPV(nt=NTScalar("d"), initial=0.0, handler=handler)
            with p4p_server("moving", {"M:X": pv}) as env:
                for key, setting in env.items():
                    monkeypatch.setenv(key, setting)
                await backend.put_as("olga", "M:X", value, True, 30.0)
            assert [(account, v) for _, account, v in handler.seen] == [("olga", value)]
            await eventually_async(lambda: len(connections) == 0)  # the server's end was seen
    finally:
        await backend.close()


async def test_a_restarted_ioc_gets_a_new_connection() -> None:
    """The IOC's end of the connection is seen; the next put opens a new one, same user."""
    with IocProcess([DBS / "acf.db"], acf=DBS / "acf.acf") as own:
        search = PvaSearch(own.ports.client_env())
        connections = IdentityConnections("pvwire-host")
        try:
            address = await search.find("ACF:SP", 30.0)
            await connections.put("olga", address, "ACF:SP", "value", 7.0, True, 30.0)
            own.stop()
            await eventually_async(lambda: len(connections) == 0)
            own.start()
            await connections.put("olga", address, "ACF:SP", "value", 8.0, True, 30.0)
            assert await asyncio.to_thread(read, own, "ACF:SP") == 8.0
            assert len(connections) == 1
        finally:
            connections.close()
            search.close()
