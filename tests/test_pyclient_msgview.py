"""pvwire_client.msgview against msgpack: the same values, the same rejections, and views.

decode_message reads large messages with msgview (ndarrays view the message) and small ones with
msgpack (ndarrays view a copy of their payload); both readers must mean the same thing for every
input, golden vectors and malformed bytes included.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pvwire_client import msgview, wire
from pvwire_client.wire import ProtocolError, decode_message

from tests.test_pyclient_wire import entries, pack, ref_entry, same

VECTORS = Path(__file__).resolve().parents[1] / "protocol" / "vectors"
SERVER_VECTORS = sorted(
    p.stem for p in VECTORS.glob("*.json") if json.loads(p.read_text())["direction"] == "server"
)


def canon(x: Any) -> Any:
    """A comparable form of a decoded message: types kept apart, ndarrays by dtype, shape, bytes
    and writeability, NaN equal to itself."""
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.shape, x.tobytes(), x.flags.writeable)
    if is_dataclass(x) and not isinstance(x, type):
        if isinstance(x, wire.Snapshot | wire.Group):
            return (type(x).__name__, canon(x.raw), canon([e for e in x.entries]))
        return (type(x).__name__, [canon(getattr(x, f.name)) for f in fields(x)])
    if isinstance(x, dict):
        return ("map", [(canon(k), canon(v)) for k, v in x.items()])
    if isinstance(x, list | tuple):
        return (type(x).__name__, [canon(v) for v in x])
    if isinstance(x, float) and math.isnan(x):
        return ("float", "nan")
    return (type(x).__name__, x)


def outcome(data: bytes, views: bool) -> Any:
    """What decode_message makes of `data` with one reader: the message, or that it refused."""
    try:
        return canon(decode_message(data, views=views))
    except ProtocolError as e:
        return ("rejected", "trailing" in str(e))


def assert_same_outcome(data: bytes) -> Any:
    got = outcome(data, views=True)
    assert got == outcome(data, views=False)
    return got


@pytest.mark.parametrize("name", SERVER_VECTORS)
def test_both_readers_agree_on_every_server_vector(name: str) -> None:
    doc = json.loads((VECTORS / f"{name}.json").read_text())
    got = assert_same_outcome((VECTORS / f"{name}.bin").read_bytes())
    assert (got[0] == "rejected") == (doc.get("expect") == "reject")


@pytest.mark.parametrize("name", SERVER_VECTORS)
def test_both_readers_reject_every_prefix_and_trailing_bytes(name: str) -> None:
    data = (VECTORS / f"{name}.bin").read_bytes()
    # A prefix of a malformed vector may be a whole message (reject_trailing_bytes).
    whole = json.loads((VECTORS / f"{name}.json").read_text()).get("expect") != "reject"
    for n in range(len(data)):
        got = assert_same_outcome(data[:n])
        assert got[0] == "rejected" or not whole
    for extra in (b"\x00", b"\xc1", data):
        assert assert_same_outcome(data + extra)[0] == "rejected"


@given(st.sampled_from(SERVER_VECTORS), st.data())
def test_both_readers_agree_on_mutated_vectors(name: str, data: st.DataObject) -> None:
    raw = bytearray((VECTORS / f"{name}.bin").read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    assert_same_outcome(bytes(raw))


def hello_with_extra(depth: int, inner: bytes) -> bytes:
    """HELLO with an extra element nested `depth` arrays deep (built by hand: msgpack's packer
    stops at 512 levels)."""
    return b"\x97" + pack([0, 1, "s", 20, 15000, 65536])[1:] + b"\x91" * depth + inner


def entry_msg(value: Any, metadata: Any = None) -> bytes:
    if metadata is None:
        return pack([3, 1, [[1, [[0, 1, value, 1]]]]])
    return pack([3, 1, [[1, [[0, 9, value, 1, metadata]]]]])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"\x93\x03\x01\x91\x92\x01\x91\x94\x00\x01\xa2\xff\xfe\x01",  # a str that is not UTF-8
        b"\x93\x03\x01\x91\x92\x01\x91\x93\x00\x08\x81\x01\x02",  # an int map key
        b"\x93\x03\x01\x91\x92\x01\x91\x93\x00\x08\x81\xc4\x01k\x02",  # a bin map key: accepted
        entry_msg(msgpack.Timestamp(1, 0)),
        entry_msg(1.5, {"t": msgpack.Timestamp(1, 5)}),  # metadata is not checked deeply
        b"\x93\x03\x01\x91\x92\x01\x91\x94\x00\x01\xd4\xff\x00\x01",  # a timestamp of 1 byte
        entry_msg(msgpack.ExtType(5, b"x")),
        entry_msg(b"raw"),
        entry_msg(1.5, {"b": b"raw"}),
        hello_with_extra(1023, b"\x01"),  # msgpack's deepest (1024 arrays with HELLO's)
        hello_with_extra(1024, b"\x01"),  # one deeper than msgpack reads
        hello_with_extra(1024, b"\x90"),  # an empty array does not count
        b"\x93\x03\x01\xdd\xff\xff\xff\xff",  # an array longer than the message
        b"\x93\x03\x01\xdf\x7f\xff\xff\xff",
        b"\x93\x03\x01\xc6\xff\xff\xff\xff",
    ],
)
def test_both_readers_agree_on_malformed_and_odd_input(data: bytes) -> None:
    assert_same_outcome(data)


# --- any MessagePack value: msgview.unpack against msgpack.unpackb -----------------------------

keys = st.one_of(st.text(max_size=5), st.binary(max_size=3))
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-40, 300),  # the fixint edges, one byte and two
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.floats(width=32).map(lambda f: ("f32", f)),
    st.text(max_size=40),
    st.binary(max_size=300),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=70_000)),
)
trees = st.recursive(
    leaves,
    lambda kids: st.one_of(st.lists(kids, max_size=20), st.dictionaries(keys, kids, max_size=20)),
    max_leaves=60,
)


def container_head(n: int, fix: int, wide: bytes) -> bytes:
    """The header of an array (fix 0x90, wide "\\xdc"/"\\xdd") or map (0x80, "\\xde"/"\\xdf")."""
    if n < 16:
        return bytes((fix | n,))
    return (wide[:1] + n.to_bytes(2, "big")) if n < 0x10000 else (wide[1:] + n.to_bytes(4, "big"))


def pack_any(x: Any, packer: msgpack.Packer) -> bytes:
    """Pack, with ("f32", f) as a float 32 (what the server may send)."""
    if isinstance(x, tuple) and x[:1] == ("f32",):
        return b"\xca" + struct.pack(">f", x[1])
    if isinstance(x, list):
        return container_head(len(x), 0x90, b"\xdc\xdd") + b"".join(pack_any(v, packer) for v in x)
    if isinstance(x, dict):
        body = b"".join(pack_any(k, packer) + pack_any(v, packer) for k, v in x.items())
        return container_head(len(x), 0x80, b"\xde\xdf") + body
    out = packer.pack(x)
    assert isinstance(out, bytes)
    return out


def ext_pair(code: int, payload: bytes | memoryview) -> tuple[int, bytes]:
    return (code, bytes(payload))


@given(trees)
def test_msgview_reads_any_value_as_msgpack_does(tree: Any) -> None:
    data = pack_any(tree, msgpack.Packer(use_bin_type=True))
    want = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=ext_pair)
    got = msgview.unpack(data, ext_pair)
    assert canon(got) == canon(want)


# --- round trip, and which arrays are views --------------------------------------------------

DTYPES = [np.dtype(x) for x in ("i1", "u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8")]
big_arrays = st.builds(
    lambda dt, n, seed: (
        np.random.default_rng(seed).integers(0, 255, size=n * dt.itemsize, dtype=np.uint8).view(dt)
    ),
    st.sampled_from(DTYPES),
    st.sampled_from([0, 1, 3, 9_000, 70_000, 140_000]),
    st.integers(0, 2**32),
)


@given(st.lists(entries(), max_size=3), st.lists(big_arrays, min_size=1, max_size=3))
def test_round_trip_of_large_messages_through_both_readers(
    es: list[wire.Entry], arrays: list[np.ndarray[Any, Any]]
) -> None:
    raw = [ref_entry(e) for e in es] + [[100 + i, 1, a, 1] for i, a in enumerate(arrays)]
    data = pack([2, 5, 9, raw])
    viewed = decode_message(data, views=True)
    assert canon(viewed) == canon(decode_message(data, views=False))
    assert isinstance(viewed, wire.Snapshot)
    for got, want in zip(viewed.entries, es, strict=False):
        for name in want.__slots__:
            assert same(getattr(got, name), getattr(want, name)), name
    message = np.frombuffer(data, np.uint8)
    for e, a in zip(viewed.entries[len(es) :], arrays, strict=True):
        v = e.value
        assert isinstance(v, np.ndarray) and same(v, a)
        assert not v.flags.writeable
        # Arrays of 64 KiB and more view the message; smaller ones their own bytes.
        assert np.shares_memory(v, message) == (a.nbytes >= wire.VIEW_ARRAYS_FROM)


def test_a_large_frame_array_views_the_message_and_a_small_one_does_not() -> None:
    image = np.arange(2048 * 2048, dtype="<u2").reshape(2048, 2048)
    small = np.arange(10, dtype="<f8")
    data = pack([3, 7, [[1, [[0, 1, image, 4], [1, 1, small, 2]]]]])
    assert len(data) >= wire.VIEWS_FROM
    msg = decode_message(data)
    assert isinstance(msg, wire.Data)
    got_image, got_small = (e.value for e in msg.groups[0].entries)
    assert np.array_equal(got_image, image) and np.array_equal(got_small, small)
    base = got_image.base
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview) and base.obj is data
    assert not np.shares_memory(got_small, np.frombuffer(data, np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        got_image[0, 0] = 1


def test_a_large_message_of_many_entries_is_read_by_msgpack() -> None:
    # 20,000 scalar entries: msgview gives up after its item budget; the result is the same.
    data = pack([3, 2, [[1, [[sid, 1, float(sid), 1] for sid in range(20_000)]]]])
    assert len(data) >= wire.VIEWS_FROM
    msg = decode_message(data)
    assert isinstance(msg, wire.Data)
    assert canon(msg) == canon(decode_message(data, views=False))
    with pytest.raises(msgview.TooManyItems):
        msgview.unpack(data, ext_pair, max_items=512)
