"""The identity circuits alone (upstream/ca_identity.py) against a real IOC enforcing
tests/dbs/acf.acf: the user and host names the IOC decides with, the bounds on circuits, idle
closing, and failures confined to one circuit. No libca: the IOC's address is given."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pvwire.errors import ChannelNotFound, IocDenied, PutRejected, WriteDenied
from pvwire.upstream.ca_identity import Address, IdentityCircuits
from pvwire_dev.ioc import IocProcess, free_port

from tests.eventually import eventually_async

pytestmark = pytest.mark.ioc

DBS = Path(__file__).parent / "dbs"
DBR_STRING, DBR_DOUBLE = 0, 6


@pytest.fixture(scope="module")
def ioc() -> Iterator[IocProcess]:
    with IocProcess([DBS / "acf.db"], acf=DBS / "acf.acf") as ioc:
        yield ioc


@pytest.fixture
def address(ioc: IocProcess) -> Address:
    return ("127.0.0.1", ioc.ports.ca_server)


async def put(circuits: IdentityCircuits, user: str, address: Address, name: str, v: float) -> None:
    await circuits.put(user, address, name, [v], DBR_DOUBLE, 1, True, 10.0)


async def test_the_ioc_decides_with_the_user_name(address: Address) -> None:
    circuits = IdentityCircuits("pvwire-host")
    try:
        await put(circuits, "olga", address, "ACF:SP", 1.25)
        for other in ("vic", "Ольга", "olga2"):  # any name but olga's, in any script
            with pytest.raises(IocDenied, match=other):
                await put(circuits, other, address, "ACF:SP", 2.5)
        for forged in ("olga\x00vic", "olga\n", "o" * 300, ""):  # the IOC would misread these
            with pytest.raises(WriteDenied):
                await put(circuits, forged, address, "ACF:SP", 2.5)
        await circuits.put("olga", address, "ACF:STR", [b"olga's"], DBR_STRING, 1, True, 10.0)
        assert len(circuits) == 4  # one per user
    finally:
        circuits.close()


async def test_the_ioc_decides_with_the_host_name_sent(address: Address) -> None:
    for host, allowed in (("console7", True), ("laptop", False)):
        circuits = IdentityCircuits(host)
        try:
            if allowed:
                await put(circuits, "vic", address, "ACF:CONSOLE", 3.0)
            else:
                with pytest.raises(IocDenied):
                    await put(circuits, "vic", address, "ACF:CONSOLE", 3.0)
        finally:
            circuits.close()


async def test_circuits_are_bounded_and_closed_when_idle(address: Address) -> None:
    # Idle for an hour first: a put slower than a short idle time on a busy machine must not
    # close u2's circuit while u3's opens.
    circuits = IdentityCircuits("pvwire-host", max_circuits=2, idle_s=3600.0)
    try:
        for user in ("u1", "u2", "u3"):
            await put(circuits, user, address, "ACF:OPEN", float(len(user)))
        assert len(circuits) == 2  # u1's circuit, the least recently used, was closed
    finally:
        circuits.close()
    circuits = IdentityCircuits("pvwire-host", idle_s=0.5)
    try:
        for user in ("u1", "u2"):
            await put(circuits, user, address, "ACF:OPEN", 2.0)
        await eventually_async(lambda: len(circuits) == 0)  # nobody puts: all closed after idle_s
        await put(circuits, "u1", address, "ACF:OPEN", 4.0)  # a new circuit on demand
        assert len(circuits) == 1
    finally:
        circuits.close()


async def test_failures_stay_with_their_circuit(address: Address) -> None:
    circuits = IdentityCircuits("pvwire-host")
    try:
        with pytest.raises(PutRejected, match="no circuit"):  # nothing listens there
            await put(circuits, "olga", ("127.0.0.1", free_port()), "ACF:OPEN", 1.0)
        with pytest.raises(ChannelNotFound, match="ca://ACF:NO_SUCH_RECORD"):
            await put(circuits, "olga", address, "ACF:NO_SUCH_RECORD", 1.0)
        await put(circuits, "olga", address, "ACF:OPEN", 5.0)  # the same user, still fine
        wave = np.array([1, 2, 3], dtype=np.int16)
        await circuits.put("olga", address, "ACF:WAVE", wave, 1, 3, True, 10.0)
    finally:
        circuits.close()
