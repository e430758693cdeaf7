"""pvwire_client.wire: the golden vectors, malformed input, and a round-trip property."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pvwire_client import wire
from pvwire_client.wire import ProtocolError, decode_message

VECTORS = Path(__file__).resolve().parents[1] / "protocol" / "vectors"
NAMES = sorted(p.stem for p in VECTORS.glob("*.json"))
DOCS = {n: json.loads((VECTORS / f"{n}.json").read_text()) for n in NAMES}


def _vectors(direction: str, *expect: str) -> list[str]:
    return [
        n
        for n in NAMES
        if DOCS[n]["direction"] == direction and DOCS[n].get("expect", "decode") in expect
    ]


SERVER = _vectors("server", "decode", "accept")  # decoders read them as their "message"
IGNORED = _vectors("server", "ignore")
REJECTED = _vectors("server", "reject")
CLIENT = _vectors("client", "decode")  # the client's encoder produces them
KIND_NAMES = {
    wire.Hello: "HELLO",
    wire.Attached: "ATTACHED",
    wire.Snapshot: "SNAPSHOT",
    wire.Data: "DATA",
    wire.Detached: "DETACHED",
    wire.Error: "ERROR",
    wire.Heartbeat: "HEARTBEAT",
    wire.Pong: "PONG",
    wire.History: "HISTORY",
}
ENTRY_FIELDS = (
    (wire.VALUE, ("value", "serial")),
    (wire.TIME, ("seconds", "nanoseconds")),
    (wire.ALARM, ("severity", "status", "message")),
    (wire.META, ("metadata",)),
    (wire.CONN, ("state", "reason")),
)


def _default(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return wire.encode_ndarray(x)
    raise TypeError(type(x).__name__)


def pack(obj: Any) -> bytes:
    out = msgpack.packb(obj, use_bin_type=True, default=_default)
    assert isinstance(out, bytes)
    return out


# --- meaning: decoded messages in the vectors' JSON form, numbers tagged with their type -------


def tagged(x: Any) -> Any:
    """JSON-form value with int/float kept apart (the README: "checks int vs float")."""
    if isinstance(x, dict):
        if set(x) == {"$float"}:
            return ("float", x["$float"])
        if set(x) == {"$ndarray"}:
            nd = x["$ndarray"]
            return ("ndarray", nd["dtype"], tuple(nd["dims"]), tagged(nd["data"]))
        return {k: tagged(v) for k, v in x.items()}
    if isinstance(x, list):
        return [tagged(v) for v in x]
    if isinstance(x, float):
        if math.isnan(x):
            return ("float", "NaN")
        if math.isinf(x):
            return ("float", "Infinity" if x > 0 else "-Infinity")
        return ("f", x)
    if isinstance(x, bool):
        return ("b", x)
    if isinstance(x, int):
        return ("i", x)
    return x


def meaning(v: Any) -> Any:
    """A decoded value in the JSON form of the vectors (before tagging)."""
    if isinstance(v, np.ndarray):
        return {
            "$ndarray": {"dtype": v.dtype.name, "dims": list(v.shape), "data": v.ravel().tolist()}
        }
    if isinstance(v, dict):
        return {k: meaning(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [meaning(x) for x in v]
    return v


def entry_meaning(e: wire.Entry) -> dict[str, Any]:
    out: dict[str, Any] = {"sid": e.sid, "mask": e.mask}
    for bit, names in ENTRY_FIELDS:
        for n in names:
            if e.mask & bit:
                out[n] = meaning(getattr(e, n))
            else:
                assert getattr(e, n) is None, f"{n} set without its mask bit"
    return out


def message_meaning(m: wire.Message) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": KIND_NAMES[type(m)]}
    for name in m.__slots__:
        if name.startswith("_"):  # the Entry objects built from `raw` on first use
            continue
        v = getattr(m, name)
        if name == "raw":  # a SNAPSHOT's entries, as received; `entries` holds them as Entry
            assert isinstance(m, wire.Snapshot)
            name, v = "entries", [entry_meaning(e) for e in m.entries]
        elif name == "groups":
            v = [{"att": g.att, "entries": [entry_meaning(e) for e in g.entries]} for g in v]
        elif name == "reason" and isinstance(m, wire.History) and v is None:
            continue  # an optional element, absent
        out[name] = meaning(v)
    return out


def test_vectors_exist() -> None:
    assert len(SERVER) >= 8 and set(CLIENT) >= {"attach", "detach", "ping"}
    assert len(REJECTED) >= 10 and IGNORED


@pytest.mark.parametrize("name", REJECTED)
def test_rejects_vector(name: str) -> None:
    with pytest.raises(ProtocolError):
        decode_message((VECTORS / f"{name}.bin").read_bytes())


@pytest.mark.parametrize("name", IGNORED)
def test_ignores_vector(name: str) -> None:
    assert isinstance(decode_message((VECTORS / f"{name}.bin").read_bytes()), wire.Unknown)


@pytest.mark.parametrize("name", SERVER)
def test_decodes_vector(name: str) -> None:
    doc = json.loads((VECTORS / f"{name}.json").read_text())
    msg = decode_message((VECTORS / f"{name}.bin").read_bytes())
    assert tagged(message_meaning(msg)) == tagged(doc["message"])


@pytest.mark.parametrize("name", CLIENT)
def test_encodes_client_vector(name: str) -> None:
    m = json.loads((VECTORS / f"{name}.json").read_text())["message"]
    data = {
        "ATTACH": lambda: wire.encode_attach(m["req"], m["token"], m.get("since")),
        "DETACH": lambda: wire.encode_detach(m["req"], m["att"]),
        "PING": lambda: wire.encode_ping(m["nonce"]),
    }[m["kind"]]()
    assert data == (VECTORS / f"{name}.bin").read_bytes()


@pytest.mark.parametrize("name", SERVER)
def test_every_prefix_is_rejected(name: str) -> None:
    data = (VECTORS / f"{name}.bin").read_bytes()
    for n in range(len(data)):
        with pytest.raises(ProtocolError):
            decode_message(data[:n])


@pytest.mark.parametrize("name", SERVER)
def test_trailing_bytes_are_rejected(name: str) -> None:
    data = (VECTORS / f"{name}.bin").read_bytes()
    for extra in (b"\x00", b"\x90", data):
        with pytest.raises(ProtocolError, match="trailing"):
            decode_message(data + extra)


def test_ndarray_is_a_view_not_a_copy() -> None:
    msg = decode_message((VECTORS / "data_ndarray_image.bin").read_bytes())
    assert isinstance(msg, wire.Data)
    a = msg.groups[0].entries[0].value
    assert isinstance(a, np.ndarray)
    assert a.shape == (2, 3) and a.dtype == np.dtype("<u2")
    assert not a.flags.owndata and not a.flags.writeable


# --- malformed input, built by hand ----------------------------------------------------------


def data_msg(*entries: Any) -> bytes:
    return pack([3, 1, [[1, list(entries)]]])


def nested(depth: int) -> Any:
    """A value nested `depth` levels deep: [[...[1]...]]."""
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "MessagePack"),
        (b"\xc1", "MessagePack"),
        (pack({"kind": 0}), "array"),
        (pack([]), "array"),
        (pack(["HELLO"]), "kind"),
        (pack([-1]), "kind"),
        (pack([True]), "kind"),
        (pack([0, 1, "s", 20, 15000]), "HELLO needs 6"),
        (pack([0, 1, 7, 20, 15000, 65536]), "server must be a string"),
        (pack([0, -1, "s", 20, 15000, 65536]), "version"),
        (pack([1, 1, 1, "ids"]), "ids must be an array"),
        (pack([1, 1, 1, [1]]), "ATTACHED id"),
        (pack([2, 1, 1, [[0]]]), "at least"),
        (pack([3, 1, [[1]]]), r"\[att, entries\]"),
        (pack([3, 1, [[1, [], 3]]]), r"\[att, entries\]"),
        (pack([3, 1.0, []]), "seq"),
        (pack([5, 1, 4404]), "ERROR needs 4"),
        (pack([4, "x", 1]), "DETACHED req"),
        (data_msg([0, 32]), "unknown bits"),
        (data_msg([0, 1 << 40, 1]), "unknown bits"),
        (data_msg([0, 1, 2.5]), "element count mismatch"),
        (data_msg([0, 1, 2.5, 1, 0]), "element count mismatch"),
        (data_msg([0, 3, 2.5, 1, 0]), "element count mismatch"),
        (data_msg([0, 0, 1]), "element count mismatch"),
        (data_msg([0, 16, 1]), "element count mismatch"),
        (data_msg([0, 1, 2.5, -1]), "serial"),
        (data_msg([0, 2, 1, 1_000_000_000]), "nanoseconds"),
        (data_msg([0, 4, 4, 0, ""]), "severity"),
        (data_msg([0, 4, 0, 0, None]), "alarm message"),
        (data_msg([0, 8, []]), "metadata must be a map"),
        (data_msg([0, 16, -1, ""]), "entry state"),
        (data_msg([0, 1, True, 1]), "booleans"),
        (data_msg([0, 1, ["a", True], 1]), "booleans"),
        (data_msg([0, 1, [{"x": [b"raw"]}], 1]), r"value\[0\]\.x\[0\]: unsupported value type"),
        (data_msg([0, 1, nested(65), 1]), "nested deeper than 64"),
        (data_msg([0, 1, b"raw", 1]), "unsupported value type"),
        (data_msg([0, 1, msgpack.ExtType(2, b""), 1]), "unknown MessagePack ext type 2"),
        (data_msg([0, 1, msgpack.Timestamp(1, 0), 1]), "unsupported value type"),
        (data_msg([-1, 0]), "sid"),
    ],
)
def test_malformed(data: bytes, match: str) -> None:
    """Each malformed message is rejected with a sentence naming what was wrong."""
    with pytest.raises(ProtocolError, match=match):
        decode_message(data)


def test_arrays_of_values_and_nesting_up_to_the_bound_are_accepted() -> None:
    msg = decode_message(data_msg([0, 1, [1, "x", {"a": [2.5]}, nested(63)], 1]))
    assert isinstance(msg, wire.Data)
    assert msg.groups[0].entries[0].value[:3] == [1, "x", {"a": [2.5]}]


def ext(payload: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(1, payload)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"", "shorter than its 2-byte header"),
        (b"\x09", "shorter than its 2-byte header"),
        (b"\x0a\x01\x00\x00\x00\x00", "bad dtype code 10"),
        (b"\xff\x00", "bad dtype code 255"),
        (b"\x09\x01\x02\x00", "header bytes"),
        (b"\x09\x01\x02\x00\x00\x00" + b"\x00" * 15, "length mismatch"),
        (b"\x09\x01\x02\x00\x00\x00" + b"\x00" * 17, "length mismatch"),
        (b"\x03\x02\x02\x00\x00\x00\x02\x00\x00\x00" + b"\x00" * 6, "length mismatch"),
    ],
)
def test_bad_ndarray(payload: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_message(data_msg([0, 1, ext(payload), 1]))


def test_unknown_kind_is_ignored_and_extra_elements_too() -> None:
    assert decode_message(pack([15, "future"])) == wire.Unknown(15)
    assert decode_message(pack([6, "appended in 1.1"])) == wire.Heartbeat()
    hello = decode_message(pack([0, 1, "s", 20, 15000, 65536, {"new": 1}]))
    assert hello == wire.Hello(1, "s", 20, 15000, 65536)


def test_optional_req() -> None:
    assert decode_message(pack([4, None, 3])) == wire.Detached(None, 3)
    assert decode_message(pack([5, None, 4400, "bad"])) == wire.Error(None, 4400, "bad")


def test_float32_on_the_wire_is_accepted() -> None:
    data = b"\x93\x03\x01\x91\x92\x01\x91\x94\x00\x01\xca\x3f\xc0\x00\x00\x05"
    msg = decode_message(data)
    assert isinstance(msg, wire.Data)
    assert msg.groups[0].entries[0].value == 1.5


def test_encoders_reject_bad_req() -> None:
    with pytest.raises(ValueError):
        wire.encode_attach(-1, "t")
    with pytest.raises(ValueError):
        wire.encode_detach(1, -2)


# --- round trip through a small reference encoder --------------------------------------------

DTYPES = [np.dtype(x) for x in ("i1", "u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8")]


def ref_entry(e: wire.Entry) -> list[Any]:
    out: list[Any] = [e.sid, e.mask]
    for bit, names in ENTRY_FIELDS:
        if e.mask & bit:
            for n in names:
                out.append(getattr(e, n))
    return out


ints = st.integers(0, 2**64 - 1)
arrays = st.builds(
    lambda dt, shape, seed: (
        np.random.default_rng(seed)
        .integers(0, 255, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        .view(dt)
        .reshape(shape)
    ),
    st.sampled_from(DTYPES),
    st.lists(st.integers(0, 4), max_size=3).map(tuple),
    st.integers(0, 2**32),
)
values = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(),
    st.lists(st.text(), max_size=4),
    arrays,
    st.dictionaries(st.text(), st.one_of(st.integers(-5, 5), st.text(), arrays), max_size=3),
)
metadata = st.dictionaries(
    st.text(),
    st.one_of(st.integers(-(2**63), 2**63), st.text(), st.booleans(), st.lists(st.floats())),
    max_size=4,
)


@st.composite
def entries(draw: st.DrawFn) -> wire.Entry:
    mask = draw(st.integers(0, wire.KNOWN_MASK))
    f: dict[str, Any] = {}
    if mask & wire.VALUE:
        f["value"], f["serial"] = draw(values), draw(ints)
    if mask & wire.TIME:
        f["seconds"], f["nanoseconds"] = draw(ints), draw(st.integers(0, 999_999_999))
    if mask & wire.ALARM:
        f["severity"], f["status"] = draw(st.integers(0, 3)), draw(st.integers(0, 21))
        f["message"] = draw(st.text())
    if mask & wire.META:
        f["metadata"] = draw(metadata)
    if mask & wire.CONN:
        f["state"], f["reason"] = draw(st.integers(0, 4)), draw(st.text())
    return wire.Entry(draw(st.integers(0, 2**32)), mask, **f)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


@given(st.lists(entries(), max_size=5), st.integers(1, 2**32), st.integers(0, 2**32))
def test_round_trip(es: list[wire.Entry], seq: int, att: int) -> None:
    msg = decode_message(pack([2, seq, att, [ref_entry(e) for e in es]]))
    assert isinstance(msg, wire.Snapshot)
    assert (msg.seq, msg.att, len(msg.entries)) == (seq, att, len(es))
    for got, want in zip(msg.entries, es, strict=True):
        for name in want.__slots__:
            assert same(getattr(got, name), getattr(want, name)), name


def test_property_tests_do_not_depend_on_machine_speed() -> None:
    # conftest.py's profile: a loaded machine must not fail a property test (no deadline, no
    # too_slow health check), and every such test, this module's included, runs under it.
    profile = settings.default
    assert profile is not None and profile.deadline is None
    assert HealthCheck.too_slow in profile.suppress_health_check
    assert profile.max_examples <= 100


def test_not_found_is_a_connection_state() -> None:
    # Section 3: state 4 NOT_FOUND, no IOC answered the search for the server's configured time.
    msg = decode_message(pack([3, 1, [[0, [[0, 16, 4, "not found (no IOC answered for 5 s)"]]]]]))
    assert isinstance(msg, wire.Data)
    (entry,) = msg.groups[0].entries
    assert (entry.state, entry.reason) == (4, "not found (no IOC answered for 5 s)")
