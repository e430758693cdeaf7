"""Coniql 0.4.2, the server pvwire is compared with: where it is installed and how it is started.

`make coniql` (a dependency of `make bench` and `make test`) installs it from PyPI, pinned by
bench/coniql.lock, into `.venv-coniql` at the repository root: its own environment, since its
pins clash with pvwire's (graphql-core 3.2 against 3.3, strawberry). `CONIQL_PYTHON` points at
another interpreter with Coniql installed instead. Coniql binds its port itself; it is started
here on 127.0.0.1 only, with its `ca` plugin (0.4.2 has `ca` and `sim`, no PVA).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pvwire_dev.ioc import _wait_tcp, free_port

VERSION = "0.4.2"
VENV = Path(__file__).resolve().parent.parent / ".venv-coniql"
MAIN = (
    "import sys; from aiohttp import web; from coniql.app import create_app; "
    "web.run_app(create_app(False, False, False), host='127.0.0.1', port=int(sys.argv[1]), "
    "print=None)"
)


def coniql_python() -> str:
    """The interpreter that has Coniql: `CONIQL_PYTHON`, else the repository's `.venv-coniql`."""
    override = os.environ.get("CONIQL_PYTHON")
    if override:
        return override
    python = VENV / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"Coniql {VERSION} is not installed: run `make coniql` ({VENV})")
    return str(python)


class ConiqlServer:
    """A Coniql process on a free loopback port; `env` carries the IOC's EPICS client settings."""

    def __init__(self, env: dict[str, str], python: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Coniql's environment is its own: none of the bench's PYTHONPATH.
        env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen(
            [python or coniql_python(), "-c", MAIN, str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid
        try:
            _wait_tcp("127.0.0.1", self.port, 30)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
