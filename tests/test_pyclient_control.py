"""pvwire_client.control and the answers it reads: an HTTP server that is not pvwire's, errors
that name their channel once. The happy paths run against the real server in test_cli.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pvwire_client import NotFound, PvwireError, ServerUnavailable, WriteDenied
from pvwire_client.control import Control
from pvwire_client.graphql import response_data

URL = "http://host:1"


def test_response_data_returns_data_or_raises_the_first_error() -> None:
    assert response_data(URL, 200, b'{"data": {"search": []}}') == {"search": []}
    body = b'{"errors": [{"message": "no", "extensions": {"code": "NOT_FOUND"}}], "data": null}'
    with pytest.raises(NotFound):
        response_data(URL, 200, body, "ca://X")


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (502, b"<html>Bad Gateway</html>", "HTTP 502 without JSON"),
        (200, b"[1]", "list, not JSON"),
        (500, b'{"data": null}', "HTTP 500 without data"),
    ],
)
def test_an_answer_not_from_pvwire_is_server_unavailable(
    status: int, body: bytes, says: str
) -> None:
    with pytest.raises(ServerUnavailable, match=says):
        response_data(URL, status, body)


def test_errors_name_their_channel_once() -> None:
    e = NotFound("ca://X:Y: no server answered within 3 s", id="X:Y")
    assert (e.detail, str(e)) == (
        "no server answered within 3 s",
        "X:Y: no server answered within 3 s",
    )
    w = WriteDenied("writes to ca://X are not allowed", id="X")
    assert str(w) == "writes to ca://X are not allowed"
    assert str(PvwireError("boom", id="ca://Z")) == "ca://Z: boom"
    assert str(PvwireError("boom")) == "boom"


class _Proxy(BaseHTTPRequestHandler):
    """Answers every POST as a misconfigured proxy would."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(502)
        self.end_headers()
        self.wfile.write(b"<html>Bad Gateway</html>")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def test_control_over_http(proxy_url: str) -> None:
    with pytest.raises(ServerUnavailable, match="HTTP 502 without JSON"):
        Control(proxy_url).search("*")


def test_control_refuses_a_url_it_cannot_speak_to() -> None:
    with pytest.raises(ServerUnavailable, match="not an http"):
        Control("ws://127.0.0.1:8080")
