"""Start a demo IOC and a pvwire server on private ports for the TypeScript tests.

Prints one JSON line `{"url": ..., "prefix": ..., ...}` when both are ready, then reads commands
from stdin, one per line, and answers each with one JSON line:
  kill-ioc | start-ioc (with the demo's images) | restart-server | stop-server | start-server
  kill-server (SIGKILL, then a new server on the same port) | freeze-ioc (SIGSTOP) | resume-ioc
  dbpf NAME VALUE (the IOC's own dbpf: e.g. a record's .ASG changed at run time)
At EOF on stdin (the test process ended, even by a crash) everything is torn down.
PVWIRE_SERVER_CMD (default `-m pvwire.cli`) replaces the server's module/script, for debugging.
PVWIRE_STACK_DB, when set, names a .db file the IOC serves instead of the demo (prefix "");
PVWIRE_STACK_ACF an access security file that IOC enforces.
--with-archiver puts the facility's archive behind the server's history: tests/archiver.py
(an archiver of the published format, in this process) holding a sample of every PV every
100 ms for the last two hours, given to the server as its --archiver.

Other arguments go to `pvwire serve`, except three that set up identities or TLS for a test:
  --jwt-secret SECRET        written to a file passed as --jwt-secret-file (HS256 bearer JWTs)
  --access-rules-toml TOML   written to a file passed as --access-rules
  --tls                      a test CA and a certificate it signed for 127.0.0.1 (tests/certs.py)
                             passed as --tls-cert/--tls-key: the server serves https and wss,
                             the first line says `ca` (the CA's PEM file) and `spki` (the
                             certificate's key hash, as Chromium's SPKI allow-list takes it),
                             `cert` and `key` (its PEM files, for a page served over https)
With access rules (these or --access-rules FILE) the demo's write rules are left out: they would
grant writes to everyone after the file's rules.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pvwire_dev.demo_ioc import (
    DEMO_IMAGES,
    DEMO_PREFIX,
    demo_write_rules,
    serve_demo_images,
    start_demo_ioc,
)
from pvwire_dev.ioc import IocProcess, free_port

PREFIX = DEMO_PREFIX
NAMES = ("COUNTER", "COUNTER_1HZ", "SINE", "NOISE", "MODE", "MESSAGE", "SP", "RBV", "WAVEFORM")


def demo_server_args(with_write_rules: bool = True) -> list[str]:
    """Write rules for the demo setpoints and a search catalogue, as `run-demo` sets them."""
    args: list[str] = []
    for rule in demo_write_rules(PREFIX) if with_write_rules else []:
        args += ["--write-rule", rule]
    for name in NAMES:
        args += ["--catalogue", f"ca://{PREFIX}{name}"]
    for name in DEMO_IMAGES:
        args += ["--catalogue", f"pva://{PREFIX}{name}"]
    return args


def tls_args(folder: Path) -> tuple[list[str], dict[str, str]]:
    """`--tls`: the server's arguments, and what the first line tells the test."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository's tests/
    from tests.certs import TestCA

    ca = TestCA(folder / "tls")
    cert = ca.issue()
    args = ["--tls-cert", str(cert.cert), "--tls-key", str(cert.key)]
    paths = {"cert": str(cert.cert), "key": str(cert.key)}  # for a page served from elsewhere
    return args, {"ca": str(ca.path), "spki": cert.spki_hash, **paths}


def identity_args(argv: list[str]) -> tuple[list[str], bool, dict[str, str]]:
    """The server arguments for `argv` (the identity and TLS options written to files), whether
    access rules are given, and what the first line says of TLS."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--jwt-secret")
    p.add_argument("--access-rules-toml")
    p.add_argument("--tls", action="store_true")
    p.add_argument("--with-archiver", action="store_true")
    ours, rest = p.parse_known_args(argv)
    if ours.with_archiver:
        rest += ["--archiver", start_archiver()]
    folder = Path(tempfile.mkdtemp(prefix="pvwire-ts-identity-"))
    tls: dict[str, str] = {}
    if ours.tls:
        more, tls = tls_args(folder)
        rest += more
    if ours.jwt_secret is not None:
        (folder / "jwt-secret").write_text(ours.jwt_secret)
        rest += ["--jwt-secret-file", str(folder / "jwt-secret")]
    if ours.access_rules_toml is not None:
        (folder / "rules.toml").write_text(ours.access_rules_toml)
        rest += ["--access-rules", str(folder / "rules.toml")]
    rules = any(a == "--access-rules" or a.startswith("--access-rules=") for a in rest)
    return rest, rules, tls


class Server:
    def __init__(self, ioc: IocProcess, extra: list[str], ca: str | None = None) -> None:
        self.port = free_port()
        self.ioc = ioc
        self.extra = extra
        self.context = ssl.create_default_context(cafile=ca) if ca else None  # https
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkdtemp(prefix="pvwire-ts-")) / "server.log"

    @property
    def url(self) -> str:
        return f"http{'s' if self.context else ''}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> None:
        # SIGTERM ends the server at once (4012), not after a replica's drain (5 s + 20 s).
        quick = {"PVWIRE_DRAIN_DELAY_S": "0", "PVWIRE_DRAIN_WINDOW_S": "0"}
        env = {**quick, **os.environ, **self.ioc.ports.client_env()}
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
                with urllib.request.urlopen(req, timeout=1, context=self.context) as res:
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
        proc.terminate()  # graceful: the server closes streams with 4012 DRAINING
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill(self) -> None:
        """SIGKILL: no close frames, as a crash or an OOM kill."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait(10)

    def tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])
        except OSError:
            return ""


def start_archiver() -> str:
    """tests/archiver.py behind the server (--with-archiver); its URL. It lives as long as this
    process, in a thread of its own."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: `tests`
    from tests.archiver import NS, Every, PbArchiver

    archiver = PbArchiver(every=Every(time.time_ns() // NS * NS - 7200 * NS, NS // 10))
    archiver.__enter__()
    return archiver.url


def reply(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    ioc: IocProcess | None = None
    server: Server | None = None
    try:
        db = os.environ.get("PVWIRE_STACK_DB")
        extra, has_rules, tls = identity_args(sys.argv[1:])
        ca = tls.get("ca")
        if db:
            ioc = IocProcess([Path(db)], acf=os.environ.get("PVWIRE_STACK_ACF") or None)
            ioc.start()
            server = Server(ioc, extra, ca)
        else:
            ioc = start_demo_ioc(PREFIX)
            server = Server(ioc, [*demo_server_args(with_write_rules=not has_rules), *extra], ca)
        server.start()
        prefix = "" if db else PREFIX
        reply({"url": server.url, "prefix": prefix, "port": server.port, "log": str(server.log),
               **tls})  # fmt: skip
        for line in sys.stdin:
            cmd = line.strip()
            if not cmd:
                continue
            try:
                if cmd == "kill-ioc":
                    ioc.stop()
                elif cmd == "start-ioc":
                    ioc.start()
                    if not db:
                        serve_demo_images(ioc, PREFIX)
                elif cmd == "restart-server":
                    server.stop()
                    server.start()
                elif cmd == "stop-server":
                    server.stop()
                elif cmd == "start-server":
                    server.start()
                elif cmd == "kill-server":
                    server.kill()
                    server.start()
                elif cmd in ("freeze-ioc", "resume-ioc"):
                    pid = ioc.pid()
                    if pid is None:
                        raise RuntimeError("the IOC is not running")
                    os.kill(pid, signal.SIGSTOP if cmd == "freeze-ioc" else signal.SIGCONT)
                elif cmd.startswith("dbpf "):
                    ioc.execute(f"import epicscorelibs.ioc as _e; _e.iocshCmd({cmd!r}.encode())")
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
            ioc.stop()  # SIGKILL, which also ends a frozen IOC


if __name__ == "__main__":
    main()
