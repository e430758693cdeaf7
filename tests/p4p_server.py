"""A p4p PVA server in the test process, on loopback ports of its own (for the types and
structures QSRV cannot serve)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from p4p.server import Server, StaticProvider
from p4p.server.thread import SharedPV
from pvwire.loopback import loopback_env
from pvwire_dev.ioc import free_port


class Accepting:
    """A p4p SharedPV handler that takes every put and records its name, account and value."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def put(self, pv: SharedPV, op: Any) -> None:
        self.seen.append((op.name(), op.account(), op.value().raw["value"]))
        pv.post(op.value())
        op.done()


@contextmanager
def p4p_server(name: str, pvs: Mapping[str, SharedPV]) -> Iterator[dict[str, str]]:
    """Serve `pvs` until the block ends; yields the EPICS_PVA_* settings that reach this server
    (and no other)."""
    server_port, broadcast_port = free_port(), free_port()
    conf = {
        **{k: v for k, v in loopback_env().items() if k.startswith("EPICS_PVA")},
        "EPICS_PVAS_INTF_ADDR_LIST": "127.0.0.1",
        "EPICS_PVAS_SERVER_PORT": str(server_port),
        "EPICS_PVAS_BROADCAST_PORT": str(broadcast_port),
    }
    provider = StaticProvider(name)
    for pv_name, pv in pvs.items():
        provider.add(pv_name, pv)
    with Server(providers=[provider], conf=conf, useenv=False):
        yield {
            "EPICS_PVA_ADDR_LIST": f"127.0.0.1:{broadcast_port}",
            "EPICS_PVA_BROADCAST_PORT": str(broadcast_port),
            "EPICS_PVA_AUTO_ADDR_LIST": "NO",
        }
