"""``pvwire`` with a token: where it comes from, and the exit status and message when the server
refuses it (not authenticated 4, forbidden 5, write denied 6).

Against a scripted GraphQL endpoint on 127.0.0.1 that answers as the contract says a server
checking identities does; the same commands against the real server are in
test_identity_e2e.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pvwire_client.cli import (
    EXIT_ERROR,
    EXIT_FORBIDDEN,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAUTHENTICATED,
    EXIT_USAGE,
    EXIT_WRITE_DENIED,
    exit_status,
    main,
)
from pvwire_client.errors import PvwireError, error_for


def _error(code: str, message: str) -> dict[str, Any]:
    return {"data": None, "errors": [{"message": message, "extensions": {"code": code}}]}


class Identities(BaseHTTPRequestHandler):
    """``operator`` may write, ``viewer`` may read all but ca://SECRET; other tokens are 401."""

    seen: list[str | None] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        auth = self.headers.get("Authorization")
        self.seen.append(auth)
        status, doc = 200, self.answer(auth, body["query"], body["variables"])
        if doc.get("errors") and doc["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED":
            status = 401
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def answer(self, auth: str | None, query: str, v: dict[str, Any]) -> dict[str, Any]:
        user = {"Bearer operator": "operator", "Bearer viewer": "viewer"}.get(auth or "")
        if user is None:
            return _error("UNAUTHENTICATED", "invalid token: signature verification failed")
        if "search(" in query:
            return {"data": {"search": ["ca://SP"]}}
        if "put(" in query:
            if user != "operator":
                return _error("WRITE_DENIED", f"{v['id']}: viewer may not write")
            return {"data": {"put": {"id": v["id"], "ok": True, "error": None, "errorCode": None}}}
        if "channels(" in query:
            if "ca://SECRET" in v["ids"] and user != "operator":
                return _error("FORBIDDEN", "viewer may not read ca://SECRET")
            return {"data": {"channels": [_channel(i) for i in v["ids"]]}}
        raise AssertionError(f"unexpected query {query}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _channel(id: str) -> dict[str, Any]:
    return {
        "id": id,
        "value": 1.5,
        "time": None,
        "alarm": None,
        "connection": "CONNECTED",
        "metadata": {"type": "float64"},
        "error": None,
        "errorCode": None,
    }


@pytest.fixture
def url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delenv("PVWIRE_TOKEN", raising=False)
    Identities.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Identities)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_token_from_the_option_the_file_and_the_environment(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["search", "--server", url, "--token", "viewer", "*"]) == EXIT_OK
    token_file = tmp_path / "token"
    token_file.write_text("operator\n")
    assert main(["search", "--server", url, "--token-file", str(token_file), "*"]) == EXIT_OK
    monkeypatch.setenv("PVWIRE_TOKEN", "viewer")
    assert main(["search", "--server", url, "*"]) == EXIT_OK
    assert Identities.seen == ["Bearer viewer", "Bearer operator", "Bearer viewer"]


def test_no_token_is_not_authenticated(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["get", "--server", url, "ca://SP"]) == EXIT_UNAUTHENTICATED
    err = capsys.readouterr().err
    assert err.startswith("pvwire: not authenticated: invalid token") and err.count("\n") == 1
    assert "PVWIRE_TOKEN" in err and Identities.seen == [None]


def test_a_refused_token_is_not_authenticated(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["put", "--server", url, "--token", "forged", "ca://SP", "3"])
    assert rc == EXIT_UNAUTHENTICATED
    assert "not authenticated" in capsys.readouterr().err


def test_forbidden_read(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["get", "--server", url, "--token", "viewer", "ca://SP", "ca://SECRET"])
    assert rc == EXIT_FORBIDDEN
    out = capsys.readouterr()
    assert out.out == "" and out.err == "pvwire: viewer may not read ca://SECRET\n"


def test_write_denied_and_allowed(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["put", "--server", url, "--token", "viewer", "ca://SP", "3"]) == EXIT_WRITE_DENIED
    assert capsys.readouterr().err == "pvwire: ca://SP: viewer may not write\n"
    assert main(["put", "--server", url, "--token", "operator", "ca://SP", "3"]) == EXIT_OK


def test_token_options_are_checked(url: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        main(["search", "--server", url, "--token-file", str(tmp_path / "missing"), "*"])
    assert e.value.code == EXIT_USAGE
    with pytest.raises(SystemExit) as e:
        main(["search", "--server", url, "--token", "a", "--token-file", "b", "*"])
    assert e.value.code == EXIT_USAGE
    assert Identities.seen == []


@pytest.mark.parametrize(
    ("codes", "status"),
    [
        ((), EXIT_OK),
        (("NOT_FOUND",), EXIT_NOT_FOUND),
        (("WRITE_DENIED", "NOT_FOUND"), EXIT_WRITE_DENIED),
        (("FORBIDDEN", "WRITE_DENIED"), EXIT_FORBIDDEN),
        (("TIMEOUT", "FORBIDDEN"), EXIT_ERROR),
        (("NOT_FOUND", "TIMEOUT", "UNAUTHENTICATED"), EXIT_UNAUTHENTICATED),
        (("TOKEN_EXPIRED",), EXIT_UNAUTHENTICATED),  # the stream's names for a refused token
        (("BAD_TOKEN",), EXIT_UNAUTHENTICATED),
    ],
)
def test_exit_status_precedence(codes: tuple[str, ...], status: int) -> None:
    errors: list[PvwireError] = [error_for(c, "x") for c in codes]
    assert exit_status(errors) == status
