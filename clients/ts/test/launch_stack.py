"""Start a demo IOC and a pvwire server on private ports for the TypeScript tests.

Prints one JSON line `{"url": ..., "prefix": ..., ...}` when both are ready, then reads commands
from stdin, one per line, and answers each with one JSON line:
  kill-ioc | start-ioc | restart-server | stop-server | start-server
At EOF on stdin (the test process ended, even by a crash) everything is torn down.
PVWIRE_SERVER_CMD (default `-m pvwire.cli`) replaces the server's module/script, for debugging.
PVWIRE_STACK_DB, when set, names a .db file the IOC serves instead of the demo (prefix "").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pvwire.cli import DEMO_IMAGES, DEMO_PREFIX, demo_write_rules, start_demo_ioc
from pvwire.ioc import IocProcess, free_port

PREFIX = DEMO_PREFIX
NAMES = ("COUNTER", "COUNTER_1HZ", "SINE", "NOISE", "MODE", "MESSAGE", "SP", "RBV", "WAVEFORM")


def demo_server_args() -> list[str]:
    """Write rules for the demo setpoints and a search catalogue, as `run-demo` sets them."""
    args: list[str] = []
    for rule in demo_write_rules(PREFIX):
        args += ["--write-rule", rule]
    for name in NAMES:
        args += ["--catalogue", f"ca://{PREFIX}{name}"]
    for name in DEMO_IMAGES:
        args += ["--catalogue", f"pva://{PREFIX}{name}"]
    return args


class Server:
    def __init__(self, ioc: IocProcess, extra: list[str]) -> None:
        self.port = free_port()
        self.ioc = ioc
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkdtemp(prefix="pvwire-ts-")) / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        env = {**os.environ, **self.ioc.ports.client_env()}
        args = [
            sys.executable,
            *(os.environ.get("PVWIRE_SERVER_CMD") or "-m pvwire.cli").split(),
            "serve",
            "--port",
            str(self.port),
            "--loopback",
            *self.extra,
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        body = json.dumps({"query": "{ server { version } }"}).encode()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                req = urllib.request.Request(
                    f"{self.url}/graphql", body, {"content-type": "application/json"}
                )
                with urllib.request.urlopen(req, timeout=1) as res:
                    if res.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready after {timeout} s:\n{self.tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # graceful: the server closes streams with 1001 GOING_AWAY
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])
        except OSError:
            return ""


def reply(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    ioc: IocProcess | None = None
    server: Server | None = None
    try:
        db = os.environ.get("PVWIRE_STACK_DB")
        if db:
            ioc = IocProcess([Path(db)])
            ioc.start()
            server = Server(ioc, sys.argv[1:])
        else:
            ioc = start_demo_ioc(PREFIX)
            server = Server(ioc, [*demo_server_args(), *sys.argv[1:]])
        server.start()
        prefix = "" if db else PREFIX
        reply({"url": server.url, "prefix": prefix, "port": server.port, "log": str(server.log)})
        for line in sys.stdin:
            cmd = line.strip()
            if not cmd:
                continue
            try:
                if cmd == "kill-ioc":
                    ioc.stop()
                elif cmd == "start-ioc":
                    ioc.start()
                elif cmd == "restart-server":
                    server.stop()
                    server.start()
                elif cmd == "stop-server":
                    server.stop()
                elif cmd == "start-server":
                    server.start()
                else:
                    raise ValueError(f"unknown command {cmd!r}")
                reply({"ok": True, "cmd": cmd})
            except Exception as exc:
                reply({"ok": False, "cmd": cmd, "error": str(exc)})
    except Exception as exc:
        reply({"error": str(exc), "log": server.tail() if server else ""})
    finally:
        if server:
            server.stop()
        if ioc:
            ioc.stop()


if __name__ == "__main__":
    main()
