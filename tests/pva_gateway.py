"""p4p's PVA gateway (`python -m p4p.gw`, pvagw) between an IOC and pvwire, on loopback ports,
and what QSRV itself reports about the operations it serves (`pvxsr`), for the gateway test and
bench/gateway.py."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from itertools import count
from pathlib import Path

from pvwire.loopback import apply_loopback_env
from pvwire_dev.ioc import IocPorts, IocProcess, free_port

from tests.eventually import eventually

__all__ = ["PvaGateway", "qsrv_monitors"]


class PvaGateway:
    """pvagw with its client side on `upstream` (an IOC's ports) and its server side on ports of
    its own; `ports.client_env()` is what a pvwire replica needs to find the PVs through it."""

    def __init__(self, upstream: IocPorts) -> None:
        # Only the PVA ports matter to a PVA client; the CA ones are unused placeholders.
        self.ports = IocPorts(free_port(), free_port(), free_port(), free_port())
        self._dir = tempfile.TemporaryDirectory(prefix="pvwire-pvagw-")
        self.config = Path(self._dir.name) / "gw.conf"
        self.config.write_text(
            json.dumps(
                {
                    "version": 2,
                    "readOnly": True,
                    "clients": [
                        {
                            "name": "ioc",
                            "provider": "pva",
                            "addrlist": "127.0.0.1",
                            "autoaddrlist": False,
                            "serverport": upstream.pva_server,
                            "bcastport": upstream.pva_broadcast,
                        }
                    ],
                    "servers": [
                        {
                            "name": "replicas",
                            "clients": ["ioc"],
                            "interface": ["127.0.0.1"],
                            "addrlist": "127.0.0.1",
                            "autoaddrlist": False,
                            "serverport": self.ports.pva_server,
                            "bcastport": self.ports.pva_broadcast,
                            "statusprefix": "PVAGW:",
                        }
                    ],
                },
                indent=2,
            )
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        env = apply_loopback_env()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "p4p.gw", str(self.config)],
            env=dict(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pvagw exited with {self._proc.returncode}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.ports.pva_server)) == 0:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pvagw not listening after {timeout} s")
            time.sleep(0.1)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._dir.cleanup()


_marks = count(1)
# pvxsr's report: a "Peer<address> ..." line per connection, then a line per operation,
# "[<user>@<address>]  <PV> TX=.. RX=..  <state> ioid=.. MONITOR" (the prefix on the first only).
PEER = re.compile(r"^Peer(?P<peer>\S+)\s")
OPERATION = re.compile(r"^(?:\S+@\S+\s+)?(?P<pv>\S+)\s+TX=.*\b(?P<op>MONITOR|GET|PUT|RPC)$")


def qsrv_monitors(ioc: IocProcess, timeout: float = 30.0) -> Counter[tuple[str, str]]:
    """The IOC's own count of the PVA monitors it serves, per (PV, peer address), from QSRV's
    `pvxsr 5` report on the IOC console."""
    n = next(_marks)
    start, end = f"PVXSR-START-{n}", f"PVXSR-END-{n}"
    # pvxsr prints through C stdio, block-buffered into a pipe: fflush it before the end mark.
    ioc.execute(
        f"import ctypes, epicscorelibs.ioc as _e; print({start!r}, flush=True); "
        f"_e.iocshCmd(b'pvxsr 5'); ctypes.CDLL(None).fflush(None); print({end!r}, flush=True)"
    )

    def output_with_report() -> str:
        text = ioc.output()
        return text if end in text else ""

    text = eventually(
        output_with_report,
        lambda: f"a pvxsr report:\n{ioc.output()}",
        timeout=timeout,
        interval=0.1,
    )
    assert start in text, "the IOC's output buffer is too short for the report"
    report = text.split(start)[1].split(end)[0]
    found: Counter[tuple[str, str]] = Counter()
    peer = ""
    for line in report.splitlines():
        if p := PEER.match(line.strip()):
            peer = p["peer"]
        elif (m := OPERATION.match(line.strip())) and m["op"] == "MONITOR":
            found[m["pv"], peer] += 1
    return found
