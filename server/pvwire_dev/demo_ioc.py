"""The demo IOC of `pvwire-server demo-ioc` and `run-demo` (`make run`): its records
(`demo/demo.db`), its images (`demo_images`), and what the server is told about them."""

from __future__ import annotations

import socket
from pathlib import Path

from .ioc import IocPorts, IocProcess, free_port

__all__ = [
    "DEMO_DB",
    "DEMO_IMAGES",
    "DEMO_PREFIX",
    "demo_catalogue",
    "demo_write_rules",
    "ports_or_default",
    "serve_demo_images",
    "start_demo_ioc",
]

DEMO_DB = Path(__file__).parent / "demo" / "demo.db"
DEMO_PREFIX = "PVWIRE:DEMO:"
DEMO_SAMPLES = 1000  # the demo waveform's length
# The records the page and search show, over CA and PVA.
DEMO_RECORDS = (
    "COUNTER",
    "COUNTER_1HZ",
    "SINE",
    "NOISE",
    "MODE",
    "MESSAGE",
    "SP",
    "RBV",
    "WAVEFORM",
)
# NTNDArrays served by a p4p server in the demo IOC's process (pvwire_dev.demo_images), PVA only.
DEMO_IMAGES = ("IMAGE", "IMAGE:RGB", "IMAGE:LZ4")


def demo_write_rules(prefix: str) -> list[str]:
    """The demo's own setpoints, over both protocols, plus sim's writable kinds."""
    names = ("SP", "MODE", "MESSAGE")
    return [f"{scheme}://{prefix}{n}" for scheme in ("ca", "pva") for n in names] + [
        "sim://value*",
        "sim://string*",
    ]


def demo_catalogue(prefix: str) -> list[str]:
    """The demo's channel ids, for search: its records over both protocols, its images."""
    records = [f"{s}://{prefix}{n}" for s in ("ca", "pva") for n in DEMO_RECORDS]
    return [*records, *(f"pva://{prefix}{n}" for n in DEMO_IMAGES)]


def start_demo_ioc(prefix: str, ports: IocPorts | None = None) -> IocProcess:
    """The demo IOC, with its waveform pre-filled so it is 1000 points long from the start, and
    its images (DEMO_IMAGES) served next to it."""
    ioc = IocProcess([DEMO_DB], macros={"P": prefix}, ports=ports)
    ioc.start()
    # The IOC console is Python; process the chain COUNTER -> NOISE -> WAVEFORM 1000 times.
    commands = [f"dbpf {prefix}{r}.PROC 1 >/dev/null" for r in ("COUNTER", "NOISE", "WAVEFORM")]
    ioc.execute(
        "import epicscorelibs.ioc as _e; "
        f"_ = [_e.iocshCmd(c.encode()) for _ in range({DEMO_SAMPLES}) for c in {commands!r}]"
    )
    serve_demo_images(ioc, prefix)
    return ioc


def serve_demo_images(ioc: IocProcess, prefix: str) -> None:
    """Start the demo images' p4p server in the IOC's process: again after each IOC restart, as
    a restarted IOC process serves its records only."""
    ioc.execute(
        f"import pvwire_dev.demo_images as _i; _i.serve({prefix!r}, {ioc.ports.pva_broadcast})"
    )


def ports_or_default() -> IocPorts:
    """EPICS's standard ports when free (so caget/pvget work as usual), else private ones."""
    try:
        for port, kind in (
            (5064, socket.SOCK_STREAM),
            (5075, socket.SOCK_STREAM),
            (5076, socket.SOCK_DGRAM),
        ):
            with socket.socket(socket.AF_INET, kind) as s:
                s.bind(("127.0.0.1", port))
        return IocPorts(5064, 5065, 5075, 5076)
    except OSError:
        return IocPorts(free_port(), free_port(), free_port(), free_port())
