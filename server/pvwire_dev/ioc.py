"""Run a real EPICS IOC (base records, CA + PVA through QSRV) as a child process on private ports.

Used by `pvwire-server demo-ioc`, the test fixtures and the benchmarks. The IOC is the native
softIoc of `pvxslibs` (`python -m pvxslibs.ioc`), so records cost the IOC almost nothing.

Each IOC gets its own CA and PVA ports: CA name searches sent to 127.0.0.1 reach only one of the
servers bound to a UDP port, so two IOCs on the default ports would hide each other.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pvwire.loopback import loopback_env

__all__ = ["IocPorts", "IocProcess", "free_port"]


# `python -m pvxslibs.ioc` calls iocInit itself, and an ACF must be named before it (asInit at
# run time would leave the records open to everyone until it is done): wrap its iocInit.
_WITH_ACF = (
    "import runpy, sys; import epicscorelibs.ioc as e; acf = sys.argv.pop(1); init = e.iocInit; "
    "e.iocInit = lambda: (e.ioc(f'asSetFilename(\"{acf}\")'), init())[1]; "
    "runpy.run_module('pvxslibs.ioc', run_name='__main__')"
)

# Ports handed out below the kernel's ephemeral range, from here up.
_LOWEST_PORT = 10_000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (CA servers bind both on one number).

    Chosen at random below the kernel's ephemeral range, not with bind(0): a port bind(0) hands
    out comes from the range every outgoing connection draws from, so between this check and the
    server's own bind another process's connection could take it. With two test suites side by
    side that happened ("Address already in use" from a PVA server, once in ~6 rounds); below the
    range only another allocator like this one can take the port, one chance in ~20,000 a pick.
    """
    top = _ephemeral_start() - 1
    pick = random.SystemRandom().randint
    for _ in range(200):
        port = pick(_LOWEST_PORT, top) if top > _LOWEST_PORT else 0
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                tcp.bind(("127.0.0.1", port))
                port = tcp.getsockname()[1]
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                    udp.bind(("127.0.0.1", port))
        except OSError:
            continue
        return int(port)
    raise RuntimeError("no free port on 127.0.0.1")


@dataclass(frozen=True)
class IocPorts:
    ca_server: int
    ca_repeater: int
    pva_server: int
    pva_broadcast: int

    @classmethod
    def allocate(cls) -> IocPorts:
        return cls(free_port(), free_port(), free_port(), free_port())

    def server_env(self) -> dict[str, str]:
        """Environment for the IOC: loopback settings plus its own ports."""
        return {
            **loopback_env(),
            "EPICS_CA_SERVER_PORT": str(self.ca_server),
            "EPICS_CA_REPEATER_PORT": str(self.ca_repeater),
            "EPICS_PVAS_SERVER_PORT": str(self.pva_server),
            "EPICS_PVAS_BROADCAST_PORT": str(self.pva_broadcast),
        }

    def client_env(self) -> dict[str, str]:
        """Environment for a CA/PVA client (e.g. the pvwire server) that must find this IOC."""
        return {
            **loopback_env(),
            "EPICS_CA_ADDR_LIST": f"127.0.0.1:{self.ca_server}",
            "EPICS_CA_REPEATER_PORT": str(self.ca_repeater),
            "EPICS_PVA_ADDR_LIST": f"127.0.0.1:{self.pva_broadcast}",
            "EPICS_PVA_BROADCAST_PORT": str(self.pva_broadcast),
        }


class IocProcess:
    """A softIoc child process serving `.db` files over CA and PVA; restartable on the same ports.

    `python -m pvxslibs.ioc` reads an iocsh prompt from stdin and exits at EOF, so stdin is a pipe
    held open for the IOC's whole life.
    """

    def __init__(
        self,
        dbs: Sequence[Path | str],
        macros: Mapping[str, str] | None = None,
        ports: IocPorts | None = None,
        acf: Path | str | None = None,
    ) -> None:
        """`acf`: an access security file the IOC enforces from its start (asSetFilename)."""
        self.dbs = [Path(p) for p in dbs]
        self.acf = Path(acf) if acf is not None else None
        self.macros = dict(macros or {})
        self.ports = ports or IocPorts.allocate()
        self._proc: subprocess.Popen[bytes] | None = None
        self._output: deque[str] = deque(maxlen=200)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def output(self) -> str:
        """The IOC's last lines of output, for error messages."""
        return "\n".join(self._output)

    def start(self, timeout: float = 60.0) -> None:
        # 60 s: an IOC starts in about 1 s, but took more than 20 s on this 2-core machine with
        # two test suites and a benchmark running (load average 11-17).
        if self.running:
            return
        macro_text = ",".join(f"{k}={v}" for k, v in self.macros.items())
        args = [sys.executable, "-m", "pvxslibs.ioc"]
        if self.acf is not None:
            args = [sys.executable, "-c", _WITH_ACF, str(self.acf.resolve())]
        for db in self.dbs:
            args += ["-m", macro_text, "-d", str(db)] if macro_text else ["-d", str(db)]
        env = {**os.environ, **self.ports.server_env(), "PVXS_QSRV_ENABLE": "YES"}
        self._output.clear()
        ready = threading.Event()
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self._proc = proc

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                self._output.append(line)
                if "iocRun: All initialization complete" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=pump, name="ioc-output", daemon=True).start()
        if not ready.wait(timeout) or not self.running:
            out = self.output()
            self.stop()
            raise RuntimeError(f"IOC did not start within {timeout} s:\n{out}")
        # iocInit is done; give the CA/PVA servers a moment to bind.
        _wait_tcp("127.0.0.1", self.ports.ca_server, timeout)
        _wait_tcp("127.0.0.1", self.ports.pva_server, timeout)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def execute(self, python_line: str) -> None:
        """Run one line in the IOC's console (Python; `epicscorelibs.ioc.iocshCmd` runs iocsh)."""
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError("IOC is not running")
        self._proc.stdin.write(python_line.encode() + b"\n\n")
        self._proc.stdin.flush()

    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def __enter__(self) -> IocProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_tcp(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {host}:{port} after {timeout} s") from None
            time.sleep(0.05)
