"""Several pvws messages in one socket write: `pvws/frames.py`'s frames read back by the
`websockets` library's own parser, and a session's `next_frames` carrying exactly what
`next_text` gives one by one."""

from __future__ import annotations

import json

from pvwire.pvws.encoder import PvwsEncoder
from pvwire.pvws.frames import binary_frame, text_frames
from pvwire.pvws.session import PvwsSession
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from tests.test_pvws_session import FakeChannel, drain, session


def parse(data: bytes) -> list[Frame]:
    """The frames in `data`, as a WebSocket client reads them from a server."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    frames: list[Frame] = []
    while True:
        at_eof = reader.at_eof()
        try:
            next(at_eof)
        except StopIteration as end:
            if end.value:
                return frames
        parser = Frame.parse(reader.read_exact, mask=False)
        try:
            next(parser)
        except StopIteration as done:
            frames.append(done.value)
        else:
            raise AssertionError("a frame is cut short")


def test_frames_of_every_length_form_read_back_as_sent() -> None:
    texts = ["", "a" * 125, "b" * 126, "c" * 65535, "d" * 65536, '{"text":"µs Ω 😀"}']
    frames = parse(text_frames(texts))
    assert [f.opcode for f in frames] == [Opcode.TEXT] * len(texts)
    assert all(f.fin and not (f.rsv1 or f.rsv2 or f.rsv3) for f in frames)
    assert [bytes(f.data).decode() for f in frames] == texts


def test_binary_frames_of_every_length_form_read_back_as_sent() -> None:
    """`/stream`'s messages, framed for the protocol's `write` (api/stream.py)."""
    messages = [b"", b"\x00" * 125, b"\x91" * 126, b"\xff" * 65535, bytes(range(256)) * 256]
    frames = parse(b"".join(binary_frame(m) for m in messages))
    assert [f.opcode for f in frames] == [Opcode.BINARY] * len(messages)
    assert all(f.fin and not (f.rsv1 or f.rsv2 or f.rsv3) for f in frames)
    assert [bytes(f.data) for f in frames] == messages


def drain_frames(s: PvwsSession, limit: int = 1 << 16) -> tuple[list[str], list[bytes]]:
    texts: list[str] = []
    writes: list[bytes] = []
    while (data := s.next_frames(limit)) is not None:
        writes.append(data)
        texts.extend(bytes(f.data).decode() for f in parse(data))
        s.frames_written(len(data))
    return texts, writes


def test_next_frames_carries_what_next_text_gives_in_one_write() -> None:
    ch = FakeChannel()
    encoder = PvwsEncoder()
    by_text, by_frames = session(ch, encoder), session(ch, encoder)
    for s in (by_text, by_frames):
        s.receive('{"type":"subscribe","pvs":["x","y","bad"]}')
        s.receive('{"type":"list"}')
        s.receive('{"type":"echo","n":1}')
    texts, writes = drain_frames(by_frames)
    assert texts == drain(by_text) and len(writes) == 1
    assert [json.loads(t)["type"] for t in texts] == [
        "update", "update", "error", "list", "echo",
    ]  # fmt: skip
    assert by_frames.queued_bytes == 0 and by_frames.frames_sent == by_text.frames_sent == 5
    assert by_frames.bytes_sent == by_text.bytes_sent


def test_clients_of_the_same_pvs_write_the_same_frames_encoded_once() -> None:
    ch = FakeChannel()
    encoder = PvwsEncoder()
    a, b = session(ch, encoder), session(ch, encoder)
    for s in (a, b):
        s.receive('{"type":"subscribe","pvs":["x","y"]}')
        drain_frames(s)
    ch.set(2.5, severity=2)
    encoded = encoder.encoded
    writes = []
    for s in (a, b):
        s.collect(1, object())
        s.collect(2, object())
        s.flush_tick()
        texts, data = drain_frames(s)
        assert [json.loads(t)["value"] for t in texts] == [2.5, 2.5]
        assert all(json.loads(t)["severity"] == "MAJOR" for t in texts)
        writes.extend(data)
    assert len(writes) == 2 and writes[0] == writes[1]
    assert encoder.encoded == encoded + 2  # one text per PV for both clients


def test_a_write_is_bounded_but_never_splits_a_message() -> None:
    ch = FakeChannel()
    s = session(ch, PvwsEncoder())
    s.receive('{"type":"subscribe","pvs":["x","y","z"]}')
    texts, writes = drain_frames(s, limit=1)  # each message past the limit alone
    assert len(texts) == len(writes) == 3
