"""README.md's Python and command-line blocks run as written, against the demo IOC.

Each ```python block runs in a fresh interpreter and each line of a ```sh block made of `pvwire`
commands runs in bash, as a reader would paste them. The only change is the server's address:
the README's http://127.0.0.1:8080 becomes this test's server (for the commands, via PVWIRE_URL,
which they read as written).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pvwire_dev.demo_ioc import DEMO_DB, DEMO_PREFIX, demo_write_rules, start_demo_ioc
from pvwire_dev.ioc import IocProcess

from tests.server_process import ServerProcess

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]

README = Path(__file__).resolve().parents[1] / "README.md"
README_URL = "http://127.0.0.1:8080"
BIN = Path(sys.executable).parent  # where `pvwire` is installed, next to this interpreter


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), re.M | re.S)


def commands(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


PYTHON = blocks("python")
# The command-line blocks; other sh blocks (make, pvwire-server) start servers of their own.
CLI = [c for b in blocks("sh") if all(c.startswith("pvwire ") for c in commands(b))
       for c in commands(b)]  # fmt: skip


@pytest.fixture(scope="module")
def demo_url(epics_env: IocProcess) -> Iterator[str]:
    """A server on the demo IOC set up as `make run` sets it up: the demo's setpoints writable,
    its records in the catalogue (what `pvwire search` finds before anyone watched them)."""
    ioc = start_demo_ioc(DEMO_PREFIX)
    names = re.findall(r'^record\(\w+, "\$\(P\)(\w+)"\)', DEMO_DB.read_text(), re.M)
    args = [
        *(a for rule in demo_write_rules(DEMO_PREFIX) for a in ("--write-rule", rule)),
        *(
            a
            for n in names
            for s in ("ca", "pva")
            for a in ("--catalogue", f"{s}://{DEMO_PREFIX}{n}")
        ),
        *("--log-level", "warning"),
    ]
    try:
        with ServerProcess(*args, env=ioc.ports.client_env()) as srv:
            yield srv.url
    finally:
        ioc.stop()


def test_the_readme_has_python_and_command_line_examples() -> None:
    assert len(PYTHON) >= 2 and all(README_URL in b for b in PYTHON)
    assert {c.split()[1] for c in CLI} >= {"get", "put", "monitor", "info", "search"}


@pytest.mark.parametrize("code", PYTHON, ids=[f"python{i}" for i in range(len(PYTHON))])
def test_python_example_runs(demo_url: str, code: str) -> None:
    p = subprocess.run(
        [sys.executable, "-c", code.replace(README_URL, demo_url)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stderr == "" and p.stdout.strip()
    # A monitor's first update carries a value: nothing printed is an empty, connecting state.
    assert "<no value>" not in p.stdout and "CONNECTING" not in p.stdout, p.stdout


@pytest.mark.parametrize("command", CLI)
def test_command_line_example_runs(demo_url: str, command: str) -> None:
    env = {**os.environ, "PVWIRE_URL": demo_url, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "" and p.stdout.strip()
    if command.startswith("pvwire monitor"):
        count = int(command.split("--count")[1].split()[0])
        assert len(p.stdout.splitlines()) == count
