"""TLS on the listener: `--tls-cert` and `--tls-key` (PEM), read again when they change and on
SIGHUP, so a certificate rotated in place (cert-manager renews a Secret's files) needs no restart
and drops no client.

The listening context uvicorn is given never changes: its `sni_callback`, which OpenSSL calls on
every ClientHello (with or without SNI), hands each new handshake the context of the current
pair, and connections already open keep the one they began with. A rotation builds a fresh
context from the files; one that does not load (a key and chain that disagree, read between the
two renames of a rotation; a file half written) leaves the current pair serving, and is tried
again at the next poll. Loading the new pair into the live context instead is not safe: with a
new chain and the old key, `load_cert_chain` fails AND leaves that context unable to complete a
handshake (measured with OpenSSL 3.0; the other order keeps the old pair).

uvicorn builds its context in `Config.load`, in the process that serves (each worker under
`--workers N`), before the application: `listener_context` is its `ssl_context_factory`, and the
application's lifespan polls what it made (`serving_certificates`).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ServerCertificate", "listener_context", "serving_certificates", "tls_context"]

log = logging.getLogger("pvwire.tls")

_serving: list[ServerCertificate] = []  # made by listener_context in this process


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for the pair: TLS 1.2 and later. Raises OSError or ssl.SSLError when
    the files cannot be read or do not belong together."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class ServerCertificate:
    """The pair a listener serves, read again when either file changes or on request."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self._signature = self._stat()
        self.current = tls_context(cert, key)  # raises: a server must not start without it
        self.listener = tls_context(cert, key)
        self.listener.sni_callback = self._choose
        self.loads = 1  # pairs put in service, the first included
        self._reload_requested = False
        self._failed: object = None  # what the last failure saw, so it is logged once

    def _choose(self, connection: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        connection.context = self.current

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        """What tells a file replaced or rewritten: inode, modification time, size of each
        (after symbolic links: a Kubernetes Secret's files are links swapped at rotation)."""
        out = []
        for path in (self.cert, self.key):
            st = path.stat()
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def request_reload(self) -> None:
        """Read the files at the next poll even if they look unchanged (SIGHUP). Signal-safe."""
        self._reload_requested = True
        self._failed = None  # an operator asking again hears again why it fails

    def poll(self) -> bool:
        """Put the files' pair in service if they changed; True if a new pair was."""
        try:
            signature = self._stat()
        except OSError as exc:
            self._fail(("stat", exc.errno), exc)
            return False
        if signature == self._signature and not self._reload_requested:
            return False
        try:
            fresh = tls_context(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            # Kept for the next poll: the second rename of a rotation changes the files again.
            self._fail(signature, exc)
            return False
        self._signature, self._reload_requested, self._failed = signature, False, None
        self.current = fresh
        self.loads += 1
        log.info("TLS certificate %s read again: new handshakes get it", self.cert)
        return True

    def _fail(self, seen: object, exc: Exception) -> None:
        if seen == self._failed:
            return
        self._failed = seen
        log.error(
            "TLS certificate %s with key %s cannot be used (%s); the pair read before serves on, "
            "tried again every second",
            self.cert,
            self.key,
            exc,
        )


def listener_context(config: Any, _default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """uvicorn's `ssl_context_factory`: the listening context of `config`'s certificate and key,
    kept for the application to poll (a module function, so `--workers` can pickle it)."""
    certificate = ServerCertificate(
        Path(os.fspath(config.ssl_certfile)), Path(os.fspath(config.ssl_keyfile))
    )
    _serving.append(certificate)
    return certificate.listener


def serving_certificates() -> tuple[ServerCertificate, ...]:
    """The certificates this process listens with (none without TLS)."""
    return tuple(_serving)
