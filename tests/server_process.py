"""Run the real pvwire server as a child process, over real HTTP and WebSocket, for tests.

The child inherits os.environ, which conftest.py has loaded with the loopback settings and the
shared test IOC's ports, so the server's CA and PVA contexts find that IOC and nothing else.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from pvwire.loopback import apply_loopback_env
from pvwire_dev.ioc import free_port

__all__ = ["TEST_TOKEN_KEY", "ServerProcess", "listens", "refuse_bearer_tokens", "stream_token"]

TEST_TOKEN_KEY = "test-key-not-secret"
# SIGTERM ends a test's server at once (4012 to every stream), not after the 5 s + 20 s drain of
# a replica in production; a test of the drain sets its own (PVWIRE_DRAIN_DELAY_S, ..._WINDOW_S).
QUICK_DRAIN = {"PVWIRE_DRAIN_DELAY_S": "0", "PVWIRE_DRAIN_WINDOW_S": "0"}


class ServerProcess:
    def __init__(
        self,
        *args: str,
        port: int | None = None,
        env: dict[str, str] | None = None,
        token_key: str | None = TEST_TOKEN_KEY,
        module: str = "pvwire.cli",
        nofile: int | None = None,
        tls: tuple[Path, Path, Path] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.fixed_port = port is not None
        # (certificate chain, key, the CA that signed it): https and wss, verified with the CA.
        self.tls = tls
        self.ssl_context = ssl.create_default_context(cafile=str(tls[2])) if tls else None
        self.host = host  # what it listens on: 127.0.0.1, or "::1" for IPv6 loopback
        self._use_port(port or free_port())
        # What `python -m` runs with `serve --loopback --port N` and `args`: the command line,
        # or a bench's module that prepares the app before it calls the command line's `serve`.
        self.module = module
        # None: the server's default, a random key per process (tokens die with the process).
        self.token_key = token_key
        self.env = env or {}  # on top of os.environ, e.g. another IOC's client settings
        self.args = list(args)
        # The child's descriptor limit (util-linux's prlimit, which then runs the server).
        self.nofile = nofile
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: deque[str] = deque(maxlen=300)
        self.output_bytes = 0  # everything it wrote to stdout and stderr, its log included

    def _use_port(self, port: int) -> None:
        self.port = port
        secure = "s" if self.tls else ""
        where = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http{secure}://{where}:{port}"
        self.ws_url = f"ws{secure}://{where}:{port}/stream"

    def start(self, timeout: float = 30.0, keep_port: bool = False) -> None:
        """Start the server and wait until it answers on its port. A port it chose itself that
        another process took first (another suite's allocator: pvwire_dev.ioc.free_port) is
        replaced by a new pick, twice at most; a port given to it, or kept for clients to
        come back to, is not."""
        for attempt in range(3):
            try:
                self._start(timeout)
                return
            except _PortTaken:
                if self.fixed_port or keep_port or attempt == 2:
                    raise
                self._use_port(free_port())

    def _start(self, timeout: float) -> None:
        cmd = [
            sys.executable, "-m", self.module, "serve", "--loopback",
            "--host", self.host, "--port", str(self.port), *self.args,
        ]  # fmt: skip
        if self.token_key is not None:
            cmd += ["--token-key", self.token_key]
        if self.tls is not None:
            cmd += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        if self.nofile is not None:
            cmd = ["prlimit", f"--nofile={self.nofile}:{self.nofile}", *cmd]
        env = apply_loopback_env({**os.environ, **QUICK_DRAIN, **self.env, "PYTHONUNBUFFERED": "1"})
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._proc = proc

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                self.output_bytes += len(raw)
                self._log.append(raw.decode(errors="replace").rstrip())

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                reader.join(10)  # its last lines, then its pipe is closed
                log = self.log()
                self.stop()
                error = _PortTaken if "already in use" in log else RuntimeError
                raise error(f"server exited with {proc.returncode}:\n{log}")
            try:
                # An answer counts only from this process's own socket: with two suites side by
                # side, a server of the other one on the same port could answer first, and its
                # shutdown then close this suite's clients with 1012 (the likely cause of one
                # such failure, 2026-11-25; its server log was not kept).
                with urllib.request.urlopen(
                    f"{self.url}/healthz", timeout=1, context=self.ssl_context
                ) as r:
                    if r.status == 200 and listens(proc.pid, self.port):
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not up after {timeout} s:\n{self.log()}")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stdout:
            proc.stdout.close()

    def signal(self, sig: int) -> None:
        """Send `sig` to the server (SIGTERM: its drain), leaving it to exit by itself."""
        assert self._proc is not None
        self._proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit status of a server that was signalled (`signal`), once it has exited."""
        proc, self._proc = self._proc, None
        assert proc is not None
        code = proc.wait(timeout)
        if proc.stdout:
            proc.stdout.close()
        return code

    def kill(self) -> None:
        """SIGKILL: no close frames, no clean-up, as a crash or an OOM kill."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()

    def restart(self) -> None:
        self.stop()
        self.start(keep_port=True)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def log(self) -> str:
        return "\n".join(self._log)

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST a GraphQL request; returns the whole response document (data and errors)."""
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl_context) as r:
                result: dict[str, Any] = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            with exc:  # it holds the response, and with it the socket
                result = json.loads(exc.read())
        return result

    def metrics(self) -> str:
        """The server's /metrics, as text (`test_metrics.samples` reads a series from it)."""
        with urllib.request.urlopen(
            f"{self.url}/metrics", timeout=30, context=self.ssl_context
        ) as r:
            text: str = r.read().decode()
        return text

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stream_token(server: ServerProcess, ids: Sequence[str], **options: object) -> str:
    """A GraphQL `subscribe` token for `ids` with `options` (GraphQL literals)."""
    opts = ", ".join(f"{k}: {v}" for k, v in options.items())
    doc = server.graphql(
        "mutation($ids: [String!]!) { subscribe(ids: $ids"
        + (f", options: {{{opts}}}" if opts else "")
        + ") { token } }",
        {"ids": list(ids)},
    )
    assert "errors" not in doc, doc
    return str(doc["data"]["subscribe"]["token"])


def refuse_bearer_tokens(server: ServerProcess, count: int) -> None:
    """`count` GraphQL requests with a malformed bearer token: each one refused (401) and
    counted among the server's refused authentications."""
    for _ in range(count):
        request = urllib.request.Request(
            f"{server.url}/graphql",
            data=b'{"query": "{ search(pattern: \\"x\\") }"}',
            headers={"Content-Type": "application/json", "Authorization": "Bearer x.y.z"},
        )
        try:
            urllib.request.urlopen(request, timeout=30).close()
        except urllib.error.HTTPError as exc:
            exc.close()
            assert exc.code == 401, exc.code
        else:
            raise AssertionError("a malformed bearer token was accepted")


def server_args_for_tests(extra: Sequence[str] = ()) -> list[str]:
    """Settings that make failure paths quick to reach in tests."""
    return [
        "--write-rule", "ca://PVW:*", "--write-rule", "pva://PVW:*",
        "--write-rule", "sim://value*", "--write-rule", "sim://string*",
        "--write-rule", "ca://PVW:CHG.EGU",  # a field write: the glob names the field
        "--stall-timeout", "2", "--linger", "0.5", "--send-budget", "262144",
        "--catalogue", "ca://PVW:AO", "--catalogue", "ca://PVW:COUNTER",
        "--log-level", "warning", *extra,
    ]  # fmt: skip


class _PortTaken(RuntimeError):
    """The server could not bind its port: another process holds it."""


def listens(pid: int, port: int) -> bool:
    """Process `pid` holds the listening TCP socket of `port` on 127.0.0.1."""
    try:
        sockets = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in sockets)
