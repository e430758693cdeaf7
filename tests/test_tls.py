"""TLS in the real server (`--tls-cert`, `--tls-key`) with certificates the tests make
(tests/certs.py): the Python client (asyncio, sync facade, CLI) over https and wss verifying
against the test CA, a client without the CA refused, TLS 1.1 refused; a certificate rotated in
place under load, as cert-manager does, with many clients streaming: none of them reconnects,
and a new handshake gets the new serial; a rotation read between its two renames keeps the old
pair; the same under `--workers 2`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from pvwire.limits import number
from pvwire_client import Client, ServerUnavailable, SyncClient
from pvwire_client.state import CONNECTED

from tests.certs import ServerCert, TestCA
from tests.eventually import eventually, eventually_async
from tests.server_process import ServerProcess, server_args_for_tests

CLIENTS = 30  # streaming while the certificate is rotated
COUNTER = "sim://counter/tls?rate=20"
PVWIRE = str(Path(sys.executable).with_name("pvwire"))
HANDSHAKE_S = number("tls_handshake_timeout_s")
TIMER_SLACK_S = 0.01  # an event loop's timer may fire this early (uvloop counts milliseconds)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def served(ca: TestCA) -> ServerCert:
    return ca.issue()


@pytest.fixture(scope="module")
def server(ca: TestCA, served: ServerCert) -> Iterator[ServerProcess]:
    with ServerProcess(*server_args_for_tests(), tls=(served.cert, served.key, ca.path)) as s:
        yield s


def serial_served(port: int, ca: TestCA) -> int:
    """The serial of the certificate a new handshake with the server is shown."""
    import socket

    context = ssl.create_default_context(cafile=str(ca.path))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_python_client_over_https_and_wss(server: ServerProcess, ca: TestCA) -> None:
    assert server.url.startswith("https://")
    async with Client(server.url, ca_file=str(ca.path)) as c:
        ch = await c.get("sim://value/tls?initial=7")
        assert ch.value == 7
        seen = 0
        async for u in c.monitor(COUNTER):
            assert u.channel.state == CONNECTED
            seen += 1
            if seen == 3:
                break


def test_sync_facade_and_cli_verify_against_the_ca_file(server: ServerProcess, ca: TestCA) -> None:
    with SyncClient(server.url, ca_file=str(ca.path)) as c:
        assert c.get("sim://value/tls-sync?initial=3").value == 3
    p = subprocess.run(
        [PVWIRE, "get", "--ca-file", str(ca.path), "sim://value/tls-cli?initial=5"],
        env={**os.environ, "PVWIRE_URL": server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert float(p.stdout.split()[-1]) == 5
    # The same through PVWIRE_CA_FILE, for `pvwire monitor` too.
    p = subprocess.run(
        [PVWIRE, "monitor", "--duration", "1", COUNTER],
        env={**os.environ, "PVWIRE_URL": server.url, "PVWIRE_CA_FILE": str(ca.path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert COUNTER in p.stdout


async def test_a_client_without_the_ca_is_refused(server: ServerProcess) -> None:
    # The system's store does not hold the test CA: the certificate is not trusted.
    async with Client(server.url) as c:
        with pytest.raises(ServerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await c.get("sim://value/tls?initial=7")
    p = subprocess.run(
        [PVWIRE, "get", "sim://value/tls?initial=7"],
        env={**os.environ, "PVWIRE_URL": server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in p.stderr


def test_tls_1_1_is_refused(server: ServerProcess, ca: TestCA) -> None:
    import socket

    old = ssl.create_default_context(cafile=str(ca.path))
    old.set_ciphers("DEFAULT@SECLEVEL=0")  # OpenSSL's own policy would refuse 1.1 first
    with contextlib.suppress(ValueError):  # an OpenSSL built without TLS 1.1: refused anyway
        old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        pytest.raises(ssl.SSLError),
    ):
        old.wrap_socket(raw, server_hostname="127.0.0.1")
    assert serial_served(server.port, ca) > 0  # and 1.2 or later is served


# uvloop's own deadline, which the server's replaces: a socket closed well before it was
# closed by pvwire's.
LIBRARY_HANDSHAKE_S = 60.0


@pytest.mark.parametrize(
    "sent", [b"", b"\x16\x03\x01\x02\x00\x01"], ids=["nothing", "a-hello-begun"]
)
def test_a_handshake_not_done_in_its_deadline_is_closed(
    server: ServerProcess, ca: TestCA, sent: bytes
) -> None:
    """A socket that sends nothing, or the first bytes of a ClientHello, holds a descriptor for
    tls_handshake_timeout_s, not uvloop's 60 s; a handshake meanwhile is served."""
    import socket

    opened = time.monotonic()  # before the server's accept, which starts its deadline
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(sent)
        assert serial_served(server.port, ca) > 0
        raw.settimeout(LIBRARY_HANDSHAKE_S / 2)
        with contextlib.suppress(ConnectionResetError):  # closed with data unread: as closed
            assert raw.recv(1) == b""  # closed, unanswered
        held = time.monotonic() - opened
    assert held >= HANDSHAKE_S - TIMER_SLACK_S


@contextlib.asynccontextmanager
async def streaming(url: str, ca: TestCA, n: int) -> AsyncIterator[list[list[float]]]:
    """`n` clients, each its own connection, monitoring COUNTER; their values, and whether any
    saw the stream lost."""
    received: list[list[float]] = [[] for _ in range(n)]
    lost: list[str] = []

    async def follow(i: int) -> None:
        async with Client(url, ca_file=str(ca.path)) as c:
            async for u in c.monitor(COUNTER):
                if u.channel.state != CONNECTED:
                    lost.append(f"client {i}: {u.channel.reason}")
                elif u.channel.value is not None:
                    received[i].append(float(u.channel.value))

    tasks = [asyncio.create_task(follow(i)) for i in range(n)]
    try:
        await eventually_async(
            lambda: all(len(r) >= 3 for r in received), "every client streaming", timeout=120
        )
        yield received
        assert not lost, lost
        for t in tasks:
            assert not t.done(), t
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def rename_over(source: Path, target: Path) -> None:
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_bytes(source.read_bytes())
    tmp.replace(target)


async def test_rotation_under_load_drops_no_client_and_new_handshakes_get_it(
    ca: TestCA, served: ServerCert
) -> None:
    own = ca.issue("rotated")  # this test's own files, rotated in place
    with ServerProcess(*server_args_for_tests(), tls=(own.cert, own.key, ca.path)) as server:
        assert serial_served(server.port, ca) == own.serial
        async with streaming(server.url, ca, CLIENTS) as received:
            # Between the two renames: the new key with the old chain. The server says why it
            # cannot use them, and goes on serving the old pair.
            nxt = ca.issue("next")
            rename_over(nxt.key, own.key)
            await eventually_async(
                lambda: "cannot be used" in server.log(), "the mismatch noticed", timeout=60
            )
            assert serial_served(server.port, ca) == own.serial
            rename_over(nxt.cert, own.cert)
            await eventually_async(
                lambda: asyncio.to_thread(lambda: serial_served(server.port, ca) == nxt.serial),
                "the new certificate served",
                timeout=60,
            )
            # Every client goes on streaming on its first connection (no loss was seen).
            counts = [len(r) for r in received]
            await eventually_async(
                lambda: all(len(r) >= c + 5 for r, c in zip(received, counts, strict=True)),
                "every client receiving after the rotation",
                timeout=120,
            )
            # And one more rotation the way cert-manager writes it, both files at once.
            third = ca.issue("rotated")
            await eventually_async(
                lambda: asyncio.to_thread(lambda: serial_served(server.port, ca) == third.serial),
                "the third certificate served",
                timeout=60,
            )
            # Still the same connections, every one: none closed and came back.
            assert f"pvwire_clients {CLIENTS}" in server.metrics().splitlines()


def test_workers_each_read_the_rotated_certificate(ca: TestCA) -> None:
    own = ca.issue("workers")
    args = [*server_args_for_tests(), "--workers", "2"]
    with ServerProcess(*args, tls=(own.cert, own.key, ca.path)) as server:
        assert serial_served(server.port, ca) == own.serial
        nxt = ca.issue("workers")
        # Both workers answer on the port: ten handshakes in a row all see the new serial.
        eventually(
            lambda: all(serial_served(server.port, ca) == nxt.serial for _ in range(10)),
            "both workers serving the new certificate",
            timeout=60,
        )
        assert server.graphql("{ server { version } }")["data"]["server"]["version"]
