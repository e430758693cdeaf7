"""The server's encoder produces every golden vector byte for byte, and decodes the client ones."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from pvwire.wire import codec as wire
from pvwire_client import msgview

from tests.alignment import ndarray_data_offsets
from tests.vector_cases import CASES, HAND_BUILT, VECTORS, build

ON_DISK = sorted(p.stem for p in VECTORS.glob("*.json"))
DOCS = {n: json.loads((VECTORS / f"{n}.json").read_text()) for n in ON_DISK}
ENCODED = [n for n in ON_DISK if DOCS[n].get("expect", "decode") == "decode"]
CLIENT_REJECT = [
    n for n in ON_DISK if DOCS[n]["direction"] == "client" and DOCS[n].get("expect") == "reject"
]


def test_every_case_is_on_disk_and_nothing_else() -> None:
    assert sorted([c[0] for c in CASES] + [h[0] for h in HAND_BUILT]) == ON_DISK


def test_hand_built_vectors_say_what_to_expect() -> None:
    for n in ON_DISK:
        doc = DOCS[n]
        expect = doc.get("expect", "decode")
        assert expect in ("decode", "accept", "ignore", "reject"), n
        assert ("message" in doc) == (expect in ("decode", "accept")), n
        assert ("reason" in doc) == (expect == "reject"), n
        assert ("error" in doc) == (expect == "reject" and doc["direction"] == "client"), n
        assert expect != "ignore" or doc["direction"] == "server", n


def test_every_message_kind_is_covered() -> None:
    kinds = {DOCS[n]["message"]["kind"] for n in ENCODED}
    assert kinds == {"HELLO", "ATTACHED", "SNAPSHOT", "DATA", "DETACHED", "ERROR", "HEARTBEAT",
                     "PONG", "HISTORY", "ATTACH", "DETACH", "PING"}  # fmt: skip


@pytest.mark.parametrize("name", ENCODED)
def test_encoder_reproduces_vector(name: str) -> None:
    doc = json.loads((VECTORS / f"{name}.json").read_text())
    assert build(doc["message"]) == (VECTORS / f"{name}.bin").read_bytes()


@pytest.mark.parametrize("name", [n for n in ON_DISK if DOCS[n].get("expect") != "reject"])
def test_vector_is_one_complete_msgpack_value(name: str) -> None:
    data = (VECTORS / f"{name}.bin").read_bytes()
    value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    assert isinstance(value, list) and isinstance(value[0], int)


@pytest.mark.parametrize(
    "name", [n for n in ON_DISK if DOCS[n]["direction"] == "client" and n not in CLIENT_REJECT]
)
def test_server_decodes_client_vectors(name: str) -> None:
    doc = DOCS[name]["message"]
    msg = wire.decode_client_message((VECTORS / f"{name}.bin").read_bytes())
    expected: dict[str, Callable[[], wire.ClientMessage]] = {
        "ATTACH": lambda: wire.Attach(
            doc["req"], doc["token"], tuple(doc["since"]) if "since" in doc else None
        ),
        "DETACH": lambda: wire.Detach(doc["req"], doc["att"]),
        "PING": lambda: wire.Ping(doc["nonce"]),
    }
    assert msg == expected[doc["kind"]]()


@pytest.mark.parametrize("name", CLIENT_REJECT)
def test_server_rejects_client_vectors_echoing_the_readable_req(name: str) -> None:
    error = DOCS[name]["error"]
    with pytest.raises(wire.BadMessage) as bad:
        wire.decode_client_message((VECTORS / f"{name}.bin").read_bytes())
    assert error["code"] == 4400
    assert bad.value.req == error["req"]


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"\xc1", "not a MessagePack value"),
        (msgpack.packb({"kind": 16}), "must be an array"),
        (msgpack.packb([]), "must be an array"),
        (msgpack.packb([99, 1]), "unknown message kind 99"),
        (msgpack.packb([16, -1, "t"]), "unsigned integer req"),
        (msgpack.packb([16, 1, 5]), "string token"),
        (msgpack.packb([17, 1, "x"]), "unsigned integer att"),
        (msgpack.packb([18]), "PING is"),
        (msgpack.packb([18, 1]) + b"\x00", "trailing bytes"),
        (msgpack.packb([16, 1]), "needs an unsigned integer req"),
        (msgpack.packb([18, {"a": 2}]), "nonce must be an integer or a string, got dict"),
        (msgpack.packb([18, 1.5]), "nonce must be an integer or a string, got float"),
        (msgpack.packb([16, 3, {"a": 2}]), "string token"),
        (msgpack.packb([16, 3, {1: 2}]), "map with a key that is not a str"),
        (b"\x93\x10\x03\xa2\xc3\x28", "str is not valid UTF-8"),
    ],
)
def test_bad_client_messages_are_named(data: bytes, complaint: str) -> None:
    with pytest.raises(wire.BadMessage, match=complaint):
        wire.decode_client_message(data)


def test_truncated_client_messages_raise_bad_message() -> None:
    for name in ("attach", "detach", "ping"):
        data = (VECTORS / f"{name}.bin").read_bytes()
        for cut in range(len(data)):
            with pytest.raises(wire.BadMessage):
                wire.decode_client_message(data[:cut])


def test_ndarray_body_holds_the_raw_little_endian_bytes() -> None:
    import numpy as np

    arr = np.arange(1_000_000, dtype="<f8")
    body = wire.encode_entry_body(1, value=arr, serial=1)
    # mask 1, ext32 header, dtype 9, ndim 1, dim, raw data, then serial 1.
    head = b"\x01\xc9" + (6 + arr.nbytes).to_bytes(4, "big") + b"\x01\x09\x01"
    head += (10**6).to_bytes(4, "little")
    assert body.data == head + arr.tobytes() + b"\x01"
    assert body.length == 4


def test_big_endian_and_strided_arrays_are_sent_little_endian_contiguous() -> None:
    import numpy as np

    be = np.arange(6, dtype=">i4").reshape(2, 3)[:, ::2]
    packed = wire.pack_value(be)
    expected = wire.pack_value(np.ascontiguousarray(be, dtype="<i4"))
    assert packed == expected
    assert packed.endswith(np.array([[0, 2], [3, 5]], dtype="<i4").tobytes())


def test_encoder_refuses_a_value_deeper_than_clients_read() -> None:
    """PROTOCOL.md section 4: 64 levels of arrays and maps, the value's own outermost one level 1
    (vectors accept_value_depth_64, reject_value_depth_65); deeper fails the channel, not the
    clients."""

    def nested(levels: int) -> Any:
        value: Any = 1
        for _ in range(levels):
            value = [value]
        return value

    assert msgpack.unpackb(wire.pack_value(nested(64))) == nested(64)
    assert msgpack.unpackb(wire.pack_value({"a": nested(63)})) == {"a": nested(63)}
    with pytest.raises(ValueError, match="deeper than 64"):
        wire.pack_value(nested(65))
    with pytest.raises(ValueError, match="deeper than 64"):
        wire.encode_entry_body(1, value={"a": nested(64)}, serial=1)


def test_vectors_dir_exists() -> None:
    assert Path(VECTORS).is_dir() and len(ON_DISK) >= 40


class _NoHost:
    """A malformed message never reaches the hub."""

    def verify_token(self, token: str, address: str) -> Any:
        raise AssertionError("verify_token called for a malformed message")

    def prepare_view(self, claims: Any, session: Any) -> Any:
        raise AssertionError("prepare_view called for a malformed message")

    def open_prepared(self, prepared: Any, limit: int) -> int:
        raise AssertionError("open_prepared called for a malformed message")

    def finish_view(self, prepared: Any, session: Any, att: int) -> Any:
        raise AssertionError("finish_view called for a malformed message")

    def cancel_view(self, prepared: Any) -> None:
        raise AssertionError("cancel_view called for a malformed message")

    def close_view(self, view: Any, session: Any, att: int) -> None:
        raise AssertionError("close_view called for a malformed message")


@pytest.mark.parametrize("name", CLIENT_REJECT)
def test_session_answers_client_reject_vectors_with_error_and_stays_open(name: str) -> None:
    from pvwire.wire.session import Session, SessionLimits

    session = Session(1, "test", _NoHost(), wire.HEARTBEAT, SessionLimits(), lambda: None)
    assert session.next_frame() == wire.HEARTBEAT  # the stand-in for HELLO
    session.receive((VECTORS / f"{name}.bin").read_bytes())
    frame = session.next_frame()
    assert frame is not None and session.next_frame() is None
    kind, req, code, message = msgpack.unpackb(frame)
    assert (kind, req, code) == (5, DOCS[name]["error"]["req"], DOCS[name]["error"]["code"])
    assert message and session.close_request is None


SERVER_ENCODED = [n for n in ENCODED if DOCS[n]["direction"] == "server"]


@pytest.mark.parametrize("name", SERVER_ENCODED)
def test_encoder_vectors_align_ndarray_data(name: str) -> None:
    """PROTOCOL.md section 3, Padding: each ndarray's data starts on a multiple of 8."""
    offsets = ndarray_data_offsets((VECTORS / f"{name}.bin").read_bytes())
    if name == "data_struct":
        # Its one entry holds two ndarrays of 8 bytes: the padding aligns the largest, the first
        # of equals; the other lands where the structure puts it.
        assert offsets[0] % 8 == 0 and offsets[1] % 8 != 0
        return
    assert [o % 8 for o in offsets] == [0] * len(offsets)


def test_aligned_vectors_hold_arrays_of_every_dtype() -> None:
    """The alignment check above is not vacuous: the vectors carry arrays of all ten dtypes."""
    codes: set[int] = set()
    for name in SERVER_ENCODED:
        data = (VECTORS / f"{name}.bin").read_bytes()

        def hook(code: int, payload: memoryview) -> None:
            codes.add(payload[0])

        msgview.unpack(data, hook)
    assert codes == set(range(10))
