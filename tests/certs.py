"""Certificates the tests make for themselves: a test CA and server certificates it signs, for
127.0.0.1 and localhost, written as PEM files (what `--tls-cert` and `--tls-key`, haproxy's
`crt` and nginx's `ssl_certificate` read). Made with `cryptography` (in the lock already), so no
test depends on a certificate checked into the tree or on the machine's own trust store.

A client trusts the CA's file (`ca.pem`): Python's `ssl.create_default_context(cafile=...)`,
Node's `NODE_EXTRA_CA_CERTS`, Chromium's `--ignore-certificate-errors-spki-list` with
`spki_hash`.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["ServerCert", "TestCA"]

_ONE_DAY = datetime.timedelta(days=1)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class ServerCert:
    cert: Path  # the leaf, then the CA: the chain a server presents
    key: Path
    serial: int  # tells one issued certificate from another (a rotation test reads it)
    spki_hash: str  # base64 SHA-256 of the public key, as Chromium's SPKI allow-list takes it
    pem: bytes  # the leaf alone


class TestCA:
    """A CA of its own, in `folder` (`ca.pem`); `issue()` writes server certificates it signed."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, folder: Path, name: str = "pvwire test CA") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._name = subject
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _ONE_DAY)
            .not_valid_after(now + 30 * _ONE_DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self.path = folder / "ca.pem"
        self.path.write_bytes(self.pem)

    def issue(
        self,
        name: str = "server",
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
        days: int = 30,
    ) -> ServerCert:
        """`name.pem` (leaf + CA) and `name.key` in the CA's folder, for `hosts` (IP addresses
        and DNS names); issuing again under one name replaces the files, as cert-manager does."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - _ONE_DAY)
            .not_valid_after(now + days * _ONE_DAY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # Python 3.13 verifies strictly (VERIFY_X509_STRICT): a leaf names its issuer's key.
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        leaf = cert.public_bytes(serialization.Encoding.PEM)
        cert_path = self.folder / f"{name}.pem"
        key_path = self.folder / f"{name}.key"
        # Each file is replaced whole (a rename); between the two renames a reader finds a key
        # and chain that disagree, which a server that rereads them must survive (keep the old).
        tmp_key = key_path.with_suffix(".key.tmp")
        tmp_key.write_bytes(_key_pem(key))
        tmp_key.replace(key_path)
        tmp_cert = cert_path.with_suffix(".pem.tmp")
        tmp_cert.write_bytes(leaf + self.pem)
        tmp_cert.replace(cert_path)
        spki = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return ServerCert(
            cert=cert_path,
            key=key_path,
            serial=serial,
            spki_hash=base64.b64encode(hashlib.sha256(spki).digest()).decode(),
            pem=leaf,
        )

    def combined(self, cert: ServerCert) -> Path:
        """The chain and the key in one file, as haproxy's `crt` reads them."""
        path = cert.cert.with_suffix(".haproxy.pem")
        path.write_bytes(cert.cert.read_bytes() + cert.key.read_bytes())
        return path
