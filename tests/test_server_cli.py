"""`pvwire-server` start-up checks, run as a subprocess: a busy port, a bad catalogue file; and
the options `serve` hands the HTTP server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pvwire.loopback import apply_loopback_env

ROOT = Path(__file__).resolve().parent.parent


def server_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = apply_loopback_env(dict(os.environ))
    return subprocess.run(
        [sys.executable, "-m", "pvwire.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("command", ["run-demo", "serve"])
def test_busy_port_is_reported_before_anything_starts(busy_port: int, command: str) -> None:
    p = server_cli(command, "--port", str(busy_port))
    assert p.returncode == 1
    assert p.stdout == ""  # no URLs of a server that is not ours
    lines = p.stderr.splitlines()
    assert lines[0] == (
        f"pvwire-server: port {busy_port} on 127.0.0.1 is already in use by another program."
    )
    other = busy_port + 12
    assert lines[1] == (
        f"Pick another port: `make run PORT={other}`, `--port {other}`, or PVWIRE_PORT={other}."
    )
    assert len(lines) == 2  # neither a traceback nor an IOC's start-up chatter


def test_make_run_passes_port() -> None:
    # Under `make test` this runs inside make: a fresh make of its own, no directory chatter.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    p = subprocess.run(
        ["make", "--no-print-directory", "-n", "run", "PORT=8092"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1].endswith("-m pvwire.cli run-demo --port 8092")


def test_unreadable_catalogue_file_stops_the_server(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    p = server_cli("serve", "--port", "0", "--catalogue-file", str(missing))
    assert p.returncode == 1
    reason = f"[Errno 2] No such file or directory: '{missing}'"
    assert p.stderr.strip() == f"pvwire-server: catalogue file {missing}: {reason}"


def test_an_oidc_issuer_without_an_audience_stops_the_server() -> None:
    """Else any token the provider issued, to any of its clients, would be accepted."""
    p = server_cli("serve", "--port", "0", "--oidc-issuer", "https://sso.example.org/realms/c")
    assert p.returncode == 1
    assert p.stderr.startswith("pvwire-server: --oidc-issuer https://sso.example.org/realms/c ")
    assert "--jwt-audience" in p.stderr and "--jwt-authorized-party" in p.stderr


def test_a_plain_http_issuer_off_loopback_stops_the_server() -> None:
    issuer = "http://sso.example.org/realms/c"
    p = server_cli("serve", "--port", "0", "--oidc-issuer", issuer, "--jwt-audience", "pvwire")
    assert p.returncode == 1
    assert p.stderr.startswith(f"pvwire-server: --oidc-issuer {issuer} is plain http")
    assert "--oidc-allow-http" in p.stderr


def test_a_jwks_file_without_an_audience_stops_the_server(tmp_path: Path) -> None:
    """As an issuer does: the realm's keys verify the tokens of all its clients."""
    jwks = tmp_path / "jwks.json"
    p = server_cli("serve", "--port", "0", "--jwks-file", str(jwks))
    assert p.returncode == 1
    assert p.stderr.startswith(f"pvwire-server: --jwks-file {jwks} needs --jwt-audience")
    assert "--jwt-authorized-party" in p.stderr and "--jwt-any-audience" in p.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_the_http_server_s_own_proxy_headers_are_off(
    monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """uvicorn would rewrite the client's address from X-Forwarded-For (trusting 127.0.0.1)
    before pvwire looks: one mechanism only, in one process or in workers.
    tests/test_proxies.py shows it against the real server."""
    import uvicorn
    from pvwire import app, cli
    from pvwire.config import Settings

    started: list[dict[str, object]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: started.append(kw))
    monkeypatch.setattr(app, "create_app", lambda settings: object())
    monkeypatch.setattr(cli, "_ignore_sighup_until_served", lambda: None)
    for name in (app.SETTINGS_ENV, app.WORKERS_ENV):
        monkeypatch.setenv(name, "")  # what serve sets, put back after the test
    cli.serve(Settings(token_keys={"k": "key-for-workers"}), workers)
    (options,) = started
    assert options["proxy_headers"] is False
