"""The server's encoder produces every golden vector byte for byte, and decodes the client ones."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
from pvwire.wire import codec as wire

from tests.vector_cases import CASES, VECTORS, build

ON_DISK = sorted(p.stem for p in VECTORS.glob("*.json"))


def test_every_case_is_on_disk_and_nothing_else() -> None:
    assert sorted(name for name, *_ in CASES) == ON_DISK


def test_every_message_kind_is_covered() -> None:
    kinds = {json.loads((VECTORS / f"{n}.json").read_text())["message"]["kind"] for n in ON_DISK}
    assert kinds == {"HELLO", "ATTACHED", "SNAPSHOT", "DATA", "DETACHED", "ERROR", "HEARTBEAT",
                     "PONG", "ATTACH", "DETACH", "PING"}  # fmt: skip


@pytest.mark.parametrize("name", ON_DISK)
def test_encoder_reproduces_vector(name: str) -> None:
    doc = json.loads((VECTORS / f"{name}.json").read_text())
    assert build(doc["message"]) == (VECTORS / f"{name}.bin").read_bytes()


@pytest.mark.parametrize("name", ON_DISK)
def test_vector_is_one_complete_msgpack_value(name: str) -> None:
    data = (VECTORS / f"{name}.bin").read_bytes()
    value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    assert isinstance(value, list) and isinstance(value[0], int)


@pytest.mark.parametrize("name", ["attach", "detach", "ping"])
def test_server_decodes_client_vectors(name: str) -> None:
    doc = json.loads((VECTORS / f"{name}.json").read_text())["message"]
    msg = wire.decode_client_message((VECTORS / f"{name}.bin").read_bytes())
    expected = {
        "ATTACH": lambda: wire.Attach(doc["req"], doc["token"]),
        "DETACH": lambda: wire.Detach(doc["req"], doc["att"]),
        "PING": lambda: wire.Ping(doc["nonce"]),
    }[doc["kind"]]()
    assert msg == expected


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


def test_vectors_dir_exists() -> None:
    assert Path(VECTORS).is_dir() and len(ON_DISK) >= 40
