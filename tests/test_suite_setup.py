"""The suite's own setup (tests/conftest.py): the shared IOC runs only for the tests that request
it, and every process gets the loopback settings and that IOC's ports whether or not it runs."""

from __future__ import annotations

import ast
import http.server
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pvwire.loopback import loopback_env
from pvwire_dev.ioc import free_port

from tests import server_process
from tests.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent


def setup_plan(*test_files: str) -> str:
    """What pytest would set up to run `test_files` (`--setup-plan`: nothing is run)."""
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "--setup-plan", "-p", "no:cacheprovider", *test_files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for test_file in test_files:
        assert f"{test_file}::" in p.stdout, (test_file, p.stdout)
    return p.stdout


def test_unit_tests_start_no_ioc() -> None:
    assert "epics_env" not in setup_plan("tests/test_vectors.py")


def unit_tests() -> list[str]:
    """The Makefile's UNIT_TESTS (its `:=` and each `+=`), the files `make unit` (and `make
    matrix`) runs."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    found = re.findall(
        r"^UNIT_TESTS (:=|\+=) \$\(patsubst %,tests/test_%\.py,([^)]*)\)", text, re.M
    )
    assert [op for op, _ in found][:1] == [":="], "UNIT_TESTS is no longer written as read here"
    return [f"tests/test_{name}.py" for _, names in found for name in names.split()]


# The fixtures of tests/conftest.py that start a process: the shared IOC, a server on it,
# Keycloak; and names by which a test starts one itself.
PROCESS_FIXTURES = {"epics_env", "server", "server_url", "client_url", "keycloak"}
PROCESS_NAMES = {"ServerProcess", "IocProcess", "Keycloak", "subprocess", "uvicorn", "Popen",
                 "create_subprocess_exec", "p4p_server", "chromium"}  # fmt: skip


def names_used(path: Path) -> set[str]:
    """The names `path` uses or imports (the modules it imports are checked as unit tests if
    they are, and their fixtures by the setup plan)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in [a.name for a in node.names] + modules:
                names.update(name.split("."))
    return names


def test_the_unit_set_starts_no_ioc_and_no_server() -> None:
    """What README.md says of `make unit`: no IOC, server, browser or container. No unit test
    asks for a fixture that starts one, nor names what starts one."""
    files = unit_tests()
    assert len(files) > 30 and {"tests/test_tick.py", "tests/test_pyclient_held.py"} <= set(files)
    plan = setup_plan(*files)
    fixtures = set(re.findall(r"^\s*SETUP\s+[SPMCF]\s+(\w+)", plan, re.M))
    assert fixtures and not fixtures & PROCESS_FIXTURES, fixtures & PROCESS_FIXTURES
    for f in files:
        assert not names_used(ROOT / f) & PROCESS_NAMES, f


def test_tests_that_need_the_ioc_request_it() -> None:
    assert "SETUP    S epics_env" in setup_plan("tests/test_backend_ca.py")


def test_every_process_gets_loopback_and_the_shared_iocs_ports() -> None:
    # Set when the suite starts, for this process and inherited by every child it starts.
    clients = {"EPICS_CA_ADDR_LIST", "EPICS_PVA_ADDR_LIST"}  # the shared IOC's own ports
    for key, value in loopback_env().items():
        if key in clients:
            assert os.environ[key].startswith(f"{value}:"), (key, os.environ[key])
        else:
            assert os.environ[key] == value, key
    assert os.environ["EPICS_PVA_BROADCAST_PORT"] == os.environ["EPICS_PVA_ADDR_LIST"].split(":")[1]


# The collector is off from the leak to the next module, so only the fixture's own collection
# can find the leak in its module. With it on, pytest's own allocations between two tests let
# the collector run in test_after_it_in_the_same_module once (a CI run on 2 cores): the right
# module still, but then this test could not tell the fixture from that chance.
LEAKING_MODULE = """
import gc
import socket


def test_leaks_a_socket_in_a_cycle():
    class Holder:
        pass

    gc.disable()  # gc.collect() still runs: the fixture's does
    h = Holder()
    h.itself = h  # freed only by the collector
    h.sock = socket.socket()


def test_after_it_in_the_same_module():
    pass
"""
NEXT_MODULE = """
import gc


def test_in_the_next_module():
    gc.enable()
    garbage = [[i] for i in range(100_000)]  # allocations enough for the collector to run
    assert garbage
"""


def test_a_leak_is_reported_in_the_module_that_made_it(tmp_path: Path) -> None:
    """Not in whichever later test the collector happens to run in (conftest.py says why)."""
    (tmp_path / "test_a_leak.py").write_text(LEAKING_MODULE)
    (tmp_path / "test_b_next.py").write_text(NEXT_MODULE)
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(ROOT), "-p", "no:cacheprovider", "-q", "-rEf", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    summary = [line for line in p.stdout.splitlines() if line.startswith(("ERROR ", "FAILED "))]
    assert len(summary) == 1, p.stdout + p.stderr
    assert summary[0].startswith("ERROR ") and "test_after_it_in_the_same_module" in summary[0]
    assert "unclosed <socket.socket" in p.stdout


class _Healthy(http.server.BaseHTTPRequestHandler):
    """Another process's server on the port: it answers /healthz with 200 too."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port held by a server that is not pvwire's, as another suite's server would hold it."""
    with http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Healthy) as other:
        thread = threading.Thread(target=other.serve_forever, daemon=True)
        thread.start()
        yield other.server_address[1]
        other.shutdown()
        thread.join(10)


def test_a_server_is_up_only_on_its_own_socket(taken_port: int) -> None:
    """Another server answering on the port does not count as this one being up: a given port
    that is taken fails the start, and a chosen one is chosen again."""
    given = ServerProcess(port=taken_port)
    with pytest.raises(RuntimeError, match="already in use"):
        given.start()
    picks = iter([taken_port])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server_process, "free_port", lambda: next(picks, None) or free_port())
        chosen = ServerProcess()
        chosen.start()
    try:
        assert chosen.port != taken_port
        assert "errors" not in chosen.graphql("{ __typename }")
    finally:
        chosen.stop()
