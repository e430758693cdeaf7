"""Every HTTP request body is bounded (`max_request_bytes`), at the real server over real HTTP:
a declared length beyond the bound is refused before a byte of the body is read, a chunked body
is cut off once it crosses the bound, both before any authentication work, and a body within the
bound is served. The server's memory is read from /proc (VmRSS) around the oversize bodies."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from pvwire.api.body_limit import BodyLimit
from pvwire.limits import integer

from tests.eventually import eventually
from tests.server_process import ServerProcess

BOUND = integer("max_request_bytes")
SECRET = "body-limit-secret-not-for-production-0123456789"
PIECE = 64 * 1024
OVERSIZE = 64 * 1024 * 1024  # what the client tries to send: 16 times the bound
# RSS the server may gain for an oversize body: the bound held twice (Starlette joins the
# chunks) plus allocator noise; reading the oversize body whole takes at least OVERSIZE.
RSS_SLACK = 24 * 1024 * 1024


def forged() -> str:
    now = int(time.time())
    claims = {"sub": "mallory", "iat": now, "exp": now + 600}
    return jwt.encode(claims, "a-forged-secret-of-more-than-thirty-two", "HS256")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("body_limit")


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    (folder / "secret").write_text(SECRET)
    with ServerProcess(
        "--jwt-secret-file", str(folder / "secret"), "--audit-log", str(folder / "audit.jsonl"),
        "--log-level", "warning",
    ) as s:  # fmt: skip
        yield s


def rss(server: ServerProcess) -> int:
    """The server process's resident memory, in bytes."""
    for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def head(path: str, fields: dict[str, str], method: str = "POST") -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        *(f"{k}: {v}" for k, v in fields.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Exchange:
    """One raw HTTP connection whose answer is read by a thread while the test sends."""

    def __init__(self, server: ServerProcess) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        self.answer = b""
        self.closed = threading.Event()  # the server closed (or reset) the connection
        self.answered = threading.Event()  # the first bytes of an answer arrived
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while chunk := self.sock.recv(65536):
                self.answer += chunk
                self.answered.set()
        except OSError:
            pass
        self.closed.set()

    def send(self, data: bytes) -> bool:
        """False once the server no longer takes data (it closed the connection)."""
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        return not self.closed.is_set()

    def response(self) -> tuple[int, dict[str, Any]]:
        eventually(self.closed.is_set, "the server to answer and close the connection")
        header, _, body = self.answer.partition(b"\r\n\r\n")
        status = int(header.split(b" ")[1])
        return status, json.loads(body) if body else {}

    def close(self) -> None:
        self.sock.close()
        self._reader.join(30)


def assert_refused(status: int, body: dict[str, Any]) -> None:
    assert status == 413, body
    (error,) = body["errors"]
    assert error["extensions"]["code"] == "TOO_LARGE"
    assert "max_request_bytes" in error["message"] and f"{BOUND:,}" in error["message"]


def auth_refusals(server: ServerProcess, folder: Path) -> tuple[int, int]:
    """(refusals counted in /metrics, lines in the audit file)."""
    counted = sum(
        int(line.split(" ")[1])
        for line in server.metrics().splitlines()
        if line.startswith("pvwire_auth_refusals_total{")
    )
    audit = folder / "audit.jsonl"
    return counted, len(audit.read_text().splitlines()) if audit.exists() else 0


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/graphql"), ("POST", "/healthz"), ("DELETE", "/pvws/socket/1"), ("PUT", "/")],
)
def test_a_declared_length_beyond_the_bound_is_refused_before_the_body(
    server: ServerProcess, method: str, path: str
) -> None:
    """No byte of the body is ever sent: the answer comes from the headers alone."""
    exchange = Exchange(server)
    try:
        fields = {"Content-Type": "application/json", "Content-Length": str(BOUND + 1)}
        exchange.send(head(path, {**fields, "Authorization": f"Bearer {forged()}"}, method))
        assert_refused(*exchange.response())
    finally:
        exchange.close()


def test_a_declared_oversize_body_sent_anyway_costs_the_server_no_memory(
    server: ServerProcess,
) -> None:
    before = rss(server)
    exchange = Exchange(server)
    try:
        fields = {"Content-Type": "application/json", "Content-Length": str(OVERSIZE)}
        exchange.send(head("/graphql", fields))
        piece, sent = b" " * PIECE, 0
        while sent < OVERSIZE and exchange.send(piece):
            sent += PIECE
        assert sent < OVERSIZE, "the server read the whole oversize body"
        assert_refused(*exchange.response())
    finally:
        exchange.close()
    assert rss(server) - before < RSS_SLACK


def test_a_chunked_body_is_cut_off_at_the_bound(server: ServerProcess) -> None:
    """Sent a piece at a time with no length declared: the server counts and answers 413 once
    the bound is crossed, and the client's sending is cut off there."""
    before = rss(server)
    exchange = Exchange(server)
    try:
        fields = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        exchange.send(head("/graphql", fields))
        chunk, sent = b"%x\r\n%s\r\n" % (PIECE, b" " * PIECE), 0
        while sent < OVERSIZE and not exchange.answered.is_set() and exchange.send(chunk):
            sent += PIECE
        assert sent < OVERSIZE, "the server read the whole oversize body"
        assert sent > BOUND, "answered before the bound was crossed"
        assert_refused(*exchange.response())
    finally:
        exchange.close()
    assert rss(server) - before < RSS_SLACK


def test_refusal_comes_before_authentication(server: ServerProcess, folder: Path) -> None:
    """Oversize bodies with a forged token leave no refused authentication, counted or audited;
    the same token with a small body does (so the count is live)."""
    bearer = {"Authorization": f"Bearer {forged()}", "Content-Type": "application/json"}
    before = auth_refusals(server, folder)
    for fields in ({"Content-Length": str(BOUND + 1)}, {"Transfer-Encoding": "chunked"}):
        exchange = Exchange(server)
        try:
            exchange.send(head("/graphql", {**bearer, **fields}))
            chunk, sent = b"%x\r\n%s\r\n" % (PIECE, b" " * PIECE), 0
            while "Transfer-Encoding" in fields and sent < OVERSIZE and exchange.send(chunk):
                sent += PIECE
            assert_refused(*exchange.response())
        finally:
            exchange.close()
    assert auth_refusals(server, folder) == before
    request = urllib.request.Request(
        f"{server.url}/graphql", data=b'{"query": "{ __typename }"}', headers=bearer
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    refused.value.close()
    assert refused.value.code == 401
    eventually(lambda: auth_refusals(server, folder) == (before[0] + 1, before[1] + 1))


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_of_exactly_the_bound_is_served(server: ServerProcess, chunked: bool) -> None:
    query = b'{"query": "{ __typename }"}'
    body = query[:-1] + b" " * (BOUND - len(query)) + b"}"
    assert len(body) == BOUND
    data: Any = iter([body[i : i + PIECE] for i in range(0, BOUND, PIECE)]) if chunked else body
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{server.url}/graphql", data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as r:
        assert json.loads(r.read()) == {"data": {"__typename": "Query"}}


# --- the middleware alone, in memory ------------------------------------------------------------


async def echo_length(scope: Any, receive: Any, send: Any) -> None:
    """An application that reads the whole body and answers its length."""
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


async def call(length: bytes | None, chunks: list[bytes], bound: int = 10) -> list[Any]:
    headers = [] if length is None else [(b"content-length", length)]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    pending = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[Any] = []

    async def receive() -> Any:
        return pending.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    await BodyLimit(echo_length, bound)(scope, receive, send)
    return sent


@pytest.mark.parametrize(
    "length", [b"11", b"0011", b"9" * 5000, b" 12 "], ids=["11", "zeros", "5000-digits", "spaces"]
)
async def test_a_declared_length_beyond_the_bound_is_answered_unread(length: bytes) -> None:
    sent = await call(length, [b"never read"])
    assert sent[0]["status"] == 413
    assert [(k, v) for k, v in sent[0]["headers"] if k == b"connection"] == [
        (b"connection", b"close")
    ]


async def test_within_the_bound_the_application_answers() -> None:
    assert (await call(b"10", [b"12345", b"67890"]))[1]["body"] == b"10"
    assert (await call(None, [b"12345", b"67890"]))[1]["body"] == b"10"


@pytest.mark.parametrize("length", [None, b"\xb2", b"x"], ids=["none", "superscript", "x"])
async def test_a_body_with_no_usable_length_is_counted(length: bytes | None) -> None:
    sent = await call(length, [b"123456", b"789012", b"never read"])
    assert [m.get("status") for m in sent] == [413, None]
    assert b"max_request_bytes" in sent[1]["body"]
