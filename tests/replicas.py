"""pvwire replicas behind a real HAProxy (Debian's package, `make haproxy`), for the failover test
and bench/failover.py, and a client that follows a 10 Hz counter and counts what it missed.

HAProxy runs in `mode http` with `balance roundrobin`; a WebSocket is an HTTP upgrade that HAProxy
then tunnels (`timeout tunnel`). It checks `/healthz` every 500 ms, and `option redispatch` with
`retries` sends a connection that meets a dead replica (refused) to another one at once, before
the health check has marked it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pvwire_client import Client
from pvwire_client.state import CONNECTED, DISCONNECTED
from pvwire_dev.ioc import free_port

from tests.server_process import ServerProcess, listens, server_args_for_tests

__all__ = ["CounterFollower", "Haproxy", "clients_per_replica", "haproxy_config", "start_replicas"]

COUNTER = "ca://PVW:COUNTER"  # tests/dbs/test.db: +1 every 0.1 s, so its value tells gaps


def haproxy_config(
    port: int,
    backends: Sequence[int],
    check_ms: int = 500,
    check: str = "/healthz",
    maxconn: int = 2000,
) -> str:
    servers = "\n".join(
        f"    server r{i} 127.0.0.1:{p} check" for i, p in enumerate(backends, start=1)
    )
    return f"""\
global
    maxconn {maxconn}

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    # A WebSocket is quiet between updates (heartbeat 15 s): the tunnel timeout, not the client
    # and server ones, applies once the upgrade went through.
    timeout tunnel 1h
    timeout client-fin 5s
    retries 3
    option redispatch 1

frontend pvwire
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET {check}
    http-check expect status 200
    default-server inter {check_ms} fall 2 rise 2
{servers}
"""


class Haproxy:
    """haproxy in the foreground (`-db`), on a private port, in front of `backends`."""

    def __init__(
        self,
        backends: Sequence[int],
        port: int | None = None,
        check: str = "/healthz",
        maxconn: int = 2000,
    ) -> None:
        """`check`: the path of the health check; `/readyz` follows a replica's drain (it
        answers 503 from SIGTERM on), as Kubernetes' readiness probe does."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="pvwire-haproxy-")
        self.config = Path(self._dir.name) / "haproxy.cfg"
        self.config.write_text(haproxy_config(self.port, backends, check=check, maxconn=maxconn))
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        program = shutil.which("haproxy") or "/usr/sbin/haproxy"
        check = subprocess.run([program, "-c", "-f", str(self.config)], capture_output=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused its configuration:\n{check.stderr.decode()}")
        self._proc = subprocess.Popen(
            [program, "-db", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while True:  # ready once it proxies a health check to some replica
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise RuntimeError(f"haproxy exited with {self._proc.returncode}: {err}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r,
            ):
                if r.status == 200 and listens(self._proc.pid, self.port):  # not another's
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"haproxy not forwarding after {timeout} s")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stderr:
                proc.stderr.close()
        self._dir.cleanup()


def start_replicas(
    n: int, extra: Sequence[str] = (), env: dict[str, str] | None = None
) -> list[ServerProcess]:
    """n servers sharing the test token key (ServerProcess's default), each its own instance;
    `env` on top (e.g. a drain's settings)."""
    args = server_args_for_tests(extra)
    replicas = [
        ServerProcess(*args, env={**(env or {}), "PVWIRE_INSTANCE": f"r{i}"})
        for i in range(1, n + 1)
    ]
    started: list[ServerProcess] = []
    try:
        for r in replicas:
            r.start()
            started.append(r)
    except BaseException:
        for r in started:
            r.stop()
        raise
    return replicas


def clients_per_replica(replicas: Sequence[ServerProcess]) -> dict[int, int]:
    """Stream clients on each live replica (port -> count), from its own /metrics."""
    counts: dict[int, int] = {}
    for r in replicas:
        if r.pid is None:
            continue
        req = urllib.request.Request(f"{r.url}/metrics", headers={"Connection": "close"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("pvwire_clients "):
                    counts[r.port] = int(float(line.split()[1]))
    return counts


@dataclass
class CounterFollower:
    """One Client following COUNTER (plus load channels) through the proxy.

    Records every counter value with its arrival time, when the channel showed DISCONNECTED (and
    why: the close code is in the reason), and the first value after that.
    """

    url: str
    load_ids: Sequence[str] = ()
    values: list[tuple[float, float]] = field(default_factory=list)
    lost_at: float | None = None
    lost_reason: str = ""
    resumed_at: float | None = None
    last_before: float | None = None  # the counter's value before the loss
    first_after: float | None = None  # and the first one after it (a full snapshot)
    updates: int = 0
    _task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with Client(self.url) as client:
            async for u in client.monitor([COUNTER, *self.load_ids]):
                self.updates += 1
                ch = u.channel
                if ch.id != COUNTER:
                    continue
                now = time.monotonic()
                if ch.state == DISCONNECTED and self.lost_at is None:
                    self.lost_at, self.lost_reason = now, ch.reason or ""
                    self.last_before = self.values[-1][1] if self.values else None
                elif ch.state == CONNECTED and ch.value is not None:
                    value = float(ch.value)
                    if self.lost_at is not None and self.resumed_at is None:
                        self.resumed_at, self.first_after = now, value
                    self.values.append((now, value))
                self._changed.set()

    @property
    def missed(self) -> int | None:
        """Counter steps that never reached this client across the failover. A failover faster
        than one counter step resumes on the value last seen: nothing missed."""
        if self.last_before is None or self.first_after is None:
            return None
        return max(0, int(self.first_after - self.last_before) - 1)

    async def until(self, predicate_name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not getattr(self, predicate_name):
            if self._task is not None and self._task.done():
                self._task.result()
                raise AssertionError("the monitor ended")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {predicate_name} after {timeout} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))

    @property
    def streaming(self) -> bool:
        return len(self.values) >= 3

    @property
    def resumed(self) -> bool:
        return self.resumed_at is not None

    def values_since(self, t: float) -> list[float]:
        return [v for when, v in self.values if when >= t]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def port_is_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0
