"""The TLS-terminating proxies of docs/OPERATIONS.md section 17 in front of the real server:
Debian's haproxy (`make haproxy`) and nginx (`make nginx`), on private loopback ports, with
certificates from tests/certs.py.

Each configuration is read from the guide, and only its ports and certificate files are changed
(each change must apply exactly once, so what runs is what the guide says). The proxies connect
to the server from 127.0.0.2, as the guide has them, so the test's clients (127.0.0.1, or an
address of 127.0.0.0/8 they bind to) are never taken for the proxy.

Each proxy process also gets an edge: a plain-HTTP listener in front of its own TLS one,
standing in for a client on another network. It adds `X-Forwarded-For: 192.0.2.10` (TEST-NET-1,
only ever a string in a header) as a load balancer in front would add a remote client's
address, and connects from 127.0.0.3; a server that also trusts 127.0.0.3 sees a request through
the edge as coming from 192.0.2.10, which no loopback check takes for this machine.

haproxy also gets a frontend in TCP mode (`tcp_url`): it passes the client's bytes on as they
are, from the proxy's address, adding no header, as a frontend for another protocol (or one
configured so by mistake) does; a request through it names nobody behind the proxy.
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from pvwire_dev.ioc import free_port

from tests.certs import TestCA
from tests.server_process import listens

__all__ = [
    "EDGE_SOURCE",
    "KINDS",
    "PROXY_SOURCE",
    "REMOTE_CLIENT",
    "TRUSTED",
    "Proxy",
    "guide_config",
]

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "OPERATIONS.md"
KINDS = ("haproxy", "nginx")
PROXY_SOURCE = "127.0.0.2"  # the guide's: where the proxy connects to pvwire from
EDGE_SOURCE = "127.0.0.3"
REMOTE_CLIENT = "192.0.2.10"
TRUSTED = [f"{PROXY_SOURCE}/32", f"{EDGE_SOURCE}/32"]  # the server's --trusted-proxy


def guide_config(kind: str) -> str:
    """The configuration the guide gives for `kind` (its one ```haproxy or ```nginx block)."""
    (block,) = re.findall(rf"^```{kind}\n(.*?)^```$", GUIDE.read_text(), re.S | re.M)
    return str(block)


def _changed(text: str, changes: Mapping[str, str]) -> str:
    for old, new in changes.items():
        if text.count(old) != 1:
            raise AssertionError(f"the guide's configuration holds {old!r} {text.count(old)} times")
        text = text.replace(old, new)
    return text


def _haproxy(server_port: int, port: int, edge_port: int, tcp_port: int, pem: Path) -> str:
    doc = _changed(guide_config("haproxy"), {
        "bind :443 ssl crt /etc/haproxy/certs/pvwire.pem": f"bind 127.0.0.1:{port} ssl crt {pem}",
        "127.0.0.1:8080": f"127.0.0.1:{server_port}",
    })  # fmt: skip
    return (
        doc
        + f"""
frontend edge
    bind 127.0.0.1:{edge_port}
    http-request add-header X-Forwarded-For {REMOTE_CLIENT}
    default_backend through_tls

backend through_tls
    server tls 127.0.0.1:{port} ssl verify none source {EDGE_SOURCE}

frontend tcp_in
    mode tcp
    bind 127.0.0.1:{tcp_port}
    default_backend pvwire_tcp

backend pvwire_tcp
    mode tcp
    server pvwire 127.0.0.1:{server_port} source {PROXY_SOURCE}
"""
    )


def _nginx(server_port: int, port: int, edge_port: int, cert: Path, key: Path, run: Path) -> str:
    site = _changed(guide_config("nginx"), {
        "listen 443 ssl;": f"listen 127.0.0.1:{port} ssl;",
        "/etc/nginx/certs/pvwire.pem": str(cert),
        "/etc/nginx/certs/pvwire.key": str(key),
        "server 127.0.0.1:8080;": f"server 127.0.0.1:{server_port};",
    })  # fmt: skip
    edge = f"""
map $http_x_forwarded_for $edge_forwarded_for {{
    ""      {REMOTE_CLIENT};
    default "$http_x_forwarded_for, {REMOTE_CLIENT}";
}}

server {{
    listen 127.0.0.1:{edge_port};
    location / {{
        proxy_pass https://127.0.0.1:{port};
        proxy_bind {EDGE_SOURCE};
        proxy_http_version 1.1;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection $connection_upgrade;
        proxy_set_header X-Forwarded-For $edge_forwarded_for;
        proxy_read_timeout 1h;
        proxy_buffering off;
    }}
}}
"""
    # The main file around the guide's site (Debian's nginx.conf includes conf.d/ in `http`),
    # everything it writes under `run`.
    temp = "\n".join(f"    {name}_temp_path {run}/{name};"
                     for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))  # fmt: skip
    return f"""worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{
    worker_connections 1024;
}}
http {{
    access_log off;
{temp}
{site}
{edge}
}}
"""


class Proxy:
    """One proxy process in front of the server on `server_port`: https on `port` (`url`),
    the edge's plain http on `edge_port` (`edge_url`); haproxy's TCP-mode frontend on
    `tcp_port` (`tcp_url`)."""

    def __init__(self, kind: str, server_port: int, ca: TestCA) -> None:
        self.kind = kind
        self.port, self.edge_port = free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.edge_url = f"http://127.0.0.1:{self.edge_port}"
        self.tcp_port = free_port() if kind == "haproxy" else None
        self.tcp_url = f"http://127.0.0.1:{self.tcp_port}" if self.tcp_port else None
        self.ca = ca
        self._dir = tempfile.TemporaryDirectory(prefix=f"pvwire-{kind}-")
        run = Path(self._dir.name)
        cert = ca.issue(kind)
        if kind == "haproxy":
            self.config = run / "haproxy.cfg"
            assert self.tcp_port is not None
            self.config.write_text(_haproxy(server_port, self.port, self.edge_port,
                                            self.tcp_port, ca.combined(cert)))  # fmt: skip
        else:
            os.chmod(run, 0o755)  # nginx's workers (nobody) make their temporary files there
            self.config = run / "nginx.conf"
            self.config.write_text(
                _nginx(server_port, self.port, self.edge_port, cert.cert, cert.key, run)
            )
        self._proc: subprocess.Popen[bytes] | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """What a client trusts to verify the proxy: the test CA alone."""
        return ssl.create_default_context(cafile=str(self.ca.path))

    def _command(self) -> tuple[list[str], list[str]]:
        """The command that checks the configuration, and the one that runs it in the
        foreground."""
        program = shutil.which(self.kind) or f"/usr/sbin/{self.kind}"
        if self.kind == "haproxy":
            return [program, "-c", "-f", str(self.config)], [program, "-db", "-f", str(self.config)]
        run = str(self.config.parent)
        base = [program, "-p", run, "-e", f"{run}/error.log", "-c", str(self.config)]
        return [*base, "-t"], [*base, "-g", "daemon off;"]

    def start(self, timeout: float = 30.0) -> None:
        check, run = self._command()
        checked = subprocess.run(check, capture_output=True)
        if checked.returncode != 0:
            raise RuntimeError(f"{self.kind} refused its configuration:\n{checked.stderr.decode()}")
        self._proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        context = self.ssl_context()
        deadline = time.monotonic() + timeout
        while True:  # ready once both listeners are its own and the server answers through it
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise RuntimeError(f"{self.kind} exited with {self._proc.returncode}: {err}")
            if self._answers(context):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.kind} not forwarding after {timeout} s")
            time.sleep(0.1)

    def _answers(self, context: ssl.SSLContext) -> bool:
        assert self._proc is not None
        return (
            listens(self._proc.pid, self.port)
            and listens(self._proc.pid, self.edge_port)
            and (self.tcp_port is None or listens(self._proc.pid, self.tcp_port))
            and _healthy(self.url, context)
            and _healthy(self.edge_url, None)
            and (self.tcp_url is None or _healthy(self.tcp_url, None))
        )

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

    def __enter__(self) -> Proxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _healthy(url: str, context: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2, context=context) as r:
            return bool(r.status == 200)
    except OSError:
        return False
