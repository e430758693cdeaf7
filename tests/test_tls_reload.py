"""tls.py's ServerCertificate without a socket: handshakes over memory BIOs through its listening
context, whose `sni_callback` hands each new one the current pair; the files rotated as
cert-manager does (tests/certs.py: two renames), a pair that disagrees kept out of service and
tried again, SIGHUP's forced read, a file gone; TLS 1.2 as the least."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from pvwire.tls import ServerCertificate, tls_context

from tests.certs import ServerCert, TestCA


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> int:
    """A whole handshake in memory; the serial of the certificate the client was shown."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        done = 0
        for side in (c, s):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done == 2:
            break
    der = c.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path)


def client_of(ca: TestCA) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca.path))


def test_a_new_pair_serves_new_handshakes_after_a_poll(ca: TestCA) -> None:
    first = ca.issue()
    certificate = ServerCertificate(first.cert, first.key)
    assert handshake(certificate.listener, client_of(ca)) == first.serial
    assert not certificate.poll()  # nothing changed, nothing read
    second = ca.issue()  # the same files, replaced
    assert handshake(certificate.listener, client_of(ca)) == first.serial  # until the poll
    assert certificate.poll()
    assert handshake(certificate.listener, client_of(ca)) == second.serial
    assert certificate.loads == 2


def rename_over(source: Path, target: Path) -> None:
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_bytes(source.read_bytes())
    tmp.replace(target)


@pytest.mark.parametrize("first_half", ["key", "cert"])
def test_a_key_and_chain_that_disagree_keep_the_old_pair_and_are_tried_again(
    ca: TestCA, caplog: pytest.LogCaptureFixture, first_half: str
) -> None:
    serving = ca.issue()
    certificate = ServerCertificate(serving.cert, serving.key)
    nxt: ServerCert = ca.issue("next")
    # A rotation between its two renames: one file of the new pair, one of the old.
    rename_over(getattr(nxt, first_half), getattr(serving, first_half))
    with caplog.at_level(logging.ERROR, "pvwire.tls"):
        assert not certificate.poll()
        assert not certificate.poll()  # tried again; said once
    assert len(caplog.records) == 1 and "cannot be used" in caplog.text
    assert handshake(certificate.listener, client_of(ca)) == serving.serial
    # The second rename: the pair agrees again and serves.
    other = "cert" if first_half == "key" else "key"
    rename_over(getattr(nxt, other), getattr(serving, other))
    assert certificate.poll()
    assert handshake(certificate.listener, client_of(ca)) == nxt.serial


def test_sighup_reads_unchanged_files_and_a_missing_file_keeps_the_pair(ca: TestCA) -> None:
    first = ca.issue()
    certificate = ServerCertificate(first.cert, first.key)
    certificate.request_reload()
    assert certificate.poll() and certificate.loads == 2  # read again, though unchanged
    assert not certificate.poll()
    first.key.unlink()
    assert not certificate.poll()
    assert handshake(certificate.listener, client_of(ca)) == first.serial


def test_a_pair_that_does_not_load_stops_the_server_at_start(ca: TestCA) -> None:
    a, b = ca.issue("a"), ca.issue("b")
    with pytest.raises(ssl.SSLError):
        ServerCertificate(a.cert, b.key)


def test_tls_1_2_is_the_least_version(ca: TestCA) -> None:
    # A client of TLS 1.1 at most is refused in the handshake (tests/test_tls.py tries one).
    pair = ca.issue()
    assert tls_context(pair.cert, pair.key).minimum_version == ssl.TLSVersion.TLSv1_2
    certificate = ServerCertificate(pair.cert, pair.key)
    assert certificate.listener.minimum_version == ssl.TLSVersion.TLSv1_2
    assert certificate.current.minimum_version == ssl.TLSVersion.TLSv1_2
