"""Response bodies over TLS go to the server in pieces (api/paced_bodies.py), in memory: the same
bytes and the same end, whatever the application sent; plain HTTP and WebSockets untouched.
The write deadline they let the server keep: tests/test_slow_senders.py."""

from __future__ import annotations

from typing import Any

from pvwire.api.paced_bodies import PIECE_BYTES, Message, PacedBodies


async def sent_by(
    messages: list[Message], scope_type: str = "http", scheme: str = "https"
) -> list[Message]:
    """What reaches the server when the application sends `messages`."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        for m in messages:
            await send(m)

    out: list[Message] = []

    async def send(message: Message) -> None:
        out.append(message)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    await PacedBodies(app)({"type": scope_type, "scheme": scheme}, receive, send)
    return out


START = {"type": "http.response.start", "status": 200, "headers": []}


async def test_a_long_body_goes_in_pieces_with_its_bytes_and_its_end() -> None:
    body = bytes(range(256)) * (PIECE_BYTES // 256 * 3 + 10)
    out = await sent_by([START, {"type": "http.response.body", "body": body}])
    assert out[0] is START
    pieces = out[1:]
    assert [len(m["body"]) for m in pieces] == [PIECE_BYTES] * 3 + [2560]
    assert b"".join(m["body"] for m in pieces) == body
    assert [m["more_body"] for m in pieces] == [True, True, True, False]


async def test_a_streamed_body_stays_streamed_and_short_ones_pass_as_they_are() -> None:
    long = {"type": "http.response.body", "body": b"x" * (2 * PIECE_BYTES), "more_body": True}
    short = {"type": "http.response.body", "body": b"y" * PIECE_BYTES, "more_body": True}
    end = {"type": "http.response.body", "body": b"", "more_body": False}
    out = await sent_by([START, long, short, end])
    assert [(len(m.get("body", b"")), m.get("more_body")) for m in out[1:]] == [
        (PIECE_BYTES, True), (PIECE_BYTES, True), (PIECE_BYTES, True), (0, False)
    ]  # fmt: skip
    assert out[3] is short and out[4] is end


async def test_plain_http_and_websockets_pass_untouched() -> None:
    body = {"type": "http.response.body", "body": b"w" * (3 * PIECE_BYTES)}
    assert await sent_by([START, body], scheme="http") == [START, body]
    frame = {"type": "websocket.send", "bytes": b"z" * (3 * PIECE_BYTES)}
    assert await sent_by([frame], "websocket", "wss") == [frame]
