"""The PVA client machine (upstream/pvaproto.py) fuzzed by structure: type descriptions a server
could send, with cached parts (0xFD stores, 0xFE names) shared and nested, some past the bounds
(depth, nodes unfolded, the cache's bytes), whole, truncated or oversized, fed whole, byte by
byte and in random pieces. Every case ends in the type described or a RemoteProtocolError of a
reason the case explains; every type taken is then used as a put uses it (`locate`, `put`), and
every offset and bit set agrees with an oracle of its own here (memoised by node, so that shared
parts cost once here too). The doubling type of ~830 bytes is one of the cases: refused by the
node bound (a case that needed the unfolded tree would never end)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import event as note_case
from hypothesis import strategies as st
from pvwire import limits
from pvwire.upstream.pvaproto import (
    ANY,
    ARRAY,
    BOUNDED_STRING,
    CMD_PUT,
    FLAG_SERVER,
    PROTOCOL_ERRORS,
    STRING,
    STRUCT,
    UNION,
    ClientProtocol,
    FieldDesc,
    LocalProtocolError,
    PutDone,
    PutInitialized,
    RemoteProtocolError,
    Status,
    Writer,
    header,
    struct_of,
)

from tests.hostile_pva import doubling_type

MAX_DEPTH = limits.integer("pva_identity_type_depth")
MAX_NODES = limits.integer("pva_identity_type_nodes")
MAX_CACHE = limits.integer("pva_identity_type_cache_bytes")
SCALARS = (0x00, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x42, 0x43)
IOID = 7

# --- types a server could send ------------------------------------------------------------------

leaves = st.one_of(
    st.sampled_from([FieldDesc(c) for c in (*SCALARS, STRING, ANY)]),
    st.sampled_from([FieldDesc(c | ARRAY) for c in (*SCALARS, STRING, ANY)]),
    st.integers(0, 300).map(lambda n: FieldDesc(BOUNDED_STRING, bound=n)),
)
names = st.text("abcxyz_", min_size=0, max_size=6)


@st.composite
def member(draw: st.DrawFn, defined: list[FieldDesc]) -> FieldDesc:
    """A leaf, a union of leaves, or one of the structures defined before (shared), alone or as
    the element of an array."""
    kinds = ["leaf", "union"] + (["shared", "shared", "array"] if defined else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
        return draw(leaves)
    if kind == "union":
        fields = draw(st.lists(st.tuples(names, leaves), max_size=3))
        return FieldDesc(UNION, draw(names), tuple(fields))
    shared = draw(st.sampled_from(defined))
    if kind == "array":
        return FieldDesc(shared.code | ARRAY, element=shared)
    return shared


class Case(tuple[FieldDesc, frozenset[int]]):
    """A type and the ids of its parts sent through the cache, shown in a bounded line:
    hypothesis prints a dataclass by its fields, which would unfold every shared part."""

    def __repr__(self) -> str:
        return f"Case({self[0]!r}, {len(self[1])} cached)"


@st.composite
def shared_types(draw: st.DrawFn) -> Case:
    """A top structure over a list of structures, each made of leaves and of those before it,
    so that parts are shared, nested and (two references to the one before) doubling; and the
    ids of the structures the server sends through its cache."""
    defined: list[FieldDesc] = []
    doubling: list[FieldDesc] = []  # sent through the cache, always: written out they unfold
    for _ in range(draw(st.integers(0, 6))):
        fields = draw(st.lists(st.tuples(names, member(defined)), max_size=4))
        defined.append(FieldDesc(STRUCT, draw(names), tuple(fields)))
        for _ in range(draw(st.sampled_from([0, 0, 1, 3, 8, 13, 16, 24]))):
            defined.append(struct_of("", a=defined[-1], b=defined[-1]))
            doubling.append(defined[-1])
    top_fields = draw(st.lists(st.tuples(names, member(defined)), max_size=5))
    deepest = draw(st.booleans())
    if defined and deepest:
        top_fields.append(("deepest", defined[-1]))
    top = FieldDesc(STRUCT, "top", tuple(top_fields))
    chosen = draw(st.sets(st.integers(0, len(defined)))) if defined else set()
    cached = frozenset(id(([*defined, top])[i]) for i in chosen) | {id(d) for d in doubling}
    return Case((top, cached))


# --- the oracle: what the client must make of them ----------------------------------------------


@dataclass
class Encoded:
    """A type's bytes as a caching server sends them, with what reading them must hit."""

    data: bytes = b""
    read_depth: int = 0  # the deepest level the reader reaches (wrappers count, as in pvxs)
    cache_bytes: int = 0  # what the cache holds once every store is read
    over_cache: bool = False
    keys: dict[int, int] = field(default_factory=dict)  # id(desc) -> its key, once stored


def encode(top: FieldDesc, cached: frozenset[int], unfolded: Unfolded) -> Encoded:
    out = Encoded()
    w = Writer(False)

    def write(desc: FieldDesc, depth: int) -> None:
        out.read_depth = max(out.read_depth, depth)
        if id(desc) in cached:
            if id(desc) in out.keys:
                w.buf += b"\xfe" + struct.pack("<H", out.keys[id(desc)])
                return
            key = out.keys[id(desc)] = len(out.keys)
            w.buf += b"\xfd" + struct.pack("<H", key)
            inline(desc, depth + 1)
            out.cache_bytes += unfolded.cost(desc)
            out.over_cache |= out.cache_bytes > MAX_CACHE
            return
        inline(desc, depth)

    def inline(desc: FieldDesc, depth: int) -> None:
        out.read_depth = max(out.read_depth, depth)
        w.buf.append(desc.code)
        if desc.element is not None:
            write(desc.element, depth + 1)
        elif desc.code in (STRUCT, UNION):
            w.string(desc.type_id)
            w.size(len(desc.fields))
            for name, child in desc.fields:
                w.string(name)
                write(child, depth + 1)
        elif desc.code == BOUNDED_STRING:
            w.size(desc.bound)

    write(top, 0)
    out.data = bytes(w.buf)
    return out


def _children(desc: FieldDesc) -> list[FieldDesc]:
    return [d for _, d in desc.fields] + ([desc.element] if desc.element is not None else [])


class Unfolded:
    """A type's figures unfolded, each node's computed once (by identity: its parts shared)."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, int], int] = {}
        self._keep: list[FieldDesc] = []  # alive while their ids are keys

    def _figure(self, what: str, desc: FieldDesc) -> int:
        key = (what, id(desc))
        if key not in self._memo:
            self._keep.append(desc)
            kids = _children(desc)
            if what == "nodes":
                value = 1 + sum(self.nodes(c) for c in kids)
            elif what == "depth":
                value = 1 + max((self.depth(c) for c in kids), default=0)
            elif what == "bits":
                value = 1 + sum(self.bits(c) for _, c in desc.fields) if desc.code == STRUCT else 1
            else:
                own = 224 + len(desc.type_id) + sum(len(n) for n, _ in desc.fields)
                value = own + sum(self.cost(c) for c in kids)
            self._memo[key] = value
        return self._memo[key]

    def nodes(self, desc: FieldDesc) -> int:
        return self._figure("nodes", desc)

    def depth(self, desc: FieldDesc) -> int:
        return self._figure("depth", desc)

    def bits(self, desc: FieldDesc) -> int:
        return self._figure("bits", desc)

    def cost(self, desc: FieldDesc) -> int:
        return self._figure("cost", desc)


def reasons(top: FieldDesc, encoded: Encoded, unfolded: Unfolded) -> set[str]:
    """The bounds reading `encoded` must hit (any of them may be met first)."""
    out = set()
    if encoded.read_depth > MAX_DEPTH or unfolded.depth(top) > MAX_DEPTH:
        out.add("type_depth")
    if unfolded.nodes(top) > MAX_NODES:
        out.add("type_nodes")
    if encoded.over_cache:
        out.add("type_cache")
    return out


def offset_of(top: FieldDesc, path: list[str], unfolded: Unfolded) -> int:
    """The bit of `path`, counted depth first over the structure unfolded."""
    offset, node = 0, top
    for part in path:
        offset += 1
        for name, child in node.fields:
            if name == part:
                node = child
                break
            offset += unfolded.bits(child)
    return offset


def paths(
    top: FieldDesc, draw: Callable[[st.SearchStrategy[Any]], Any], count: int
) -> Iterator[tuple[list[str], FieldDesc]]:
    """`count` random descents from the top through structures to a field that is not one (or
    an empty structure), following the first member of each name as `locate` does."""
    for _ in range(count):
        node, path = top, []
        while node.code == STRUCT and node.fields:
            name, _ = draw(st.sampled_from(node.fields))
            path.append(name)
            node = next(c for n, c in node.fields if n == name)
        if path:
            yield path, node


def value_for(leaf: FieldDesc) -> object:
    code = leaf.code
    if code in SCALARS:
        return 1.5 if code in (0x42, 0x43) else 1
    if code in (STRING, BOUNDED_STRING):
        return "x" * min(leaf.bound, 3) if code == BOUNDED_STRING else "text"
    if code & ARRAY and code & ~ARRAY in SCALARS:
        return [1, 0]
    if code == STRING | ARRAY:
        return ["a", "b"]
    return object()  # nothing a put writes (any, union, arrays of those, structures)


# --- feeding the client -------------------------------------------------------------------------


def server_message(cmd: int, body: bytes, declared: int | None = None) -> bytes:
    return header(cmd, FLAG_SERVER, len(body) if declared is None else declared, False) + body


def ready(max_message_bytes: int) -> ClientProtocol:
    proto = ClientProtocol("olga", "console7", max_message_bytes)
    w = Writer(False)
    w.pack("IH", 16384, 0x7FFF)
    w.size(1)
    w.string("ca")
    proto.receive(server_message(1, bytes(w.buf)) + server_message(9, b"\xff"))
    proto.take_outgoing()
    proto.put_init(1, IOID, wait=True)
    return proto


def init_body(type_data: bytes) -> bytes:
    return struct.pack("<IB", IOID, 0x08) + b"\xff" + type_data


def feed(proto: ClientProtocol, data: bytes, pieces: list[int]) -> list[object]:
    """`data` in pieces of the sizes given (repeated), 1 meaning byte by byte."""
    events: list[object] = []
    at, i = 0, 0
    while at < len(data):
        n = pieces[i % len(pieces)] if pieces else len(data)
        events += proto.receive(data[at : at + n])
        at, i = at + n, i + 1
    return events


how: st.SearchStrategy[list[int]] = st.one_of(
    st.just([]), st.just([1]), st.lists(st.integers(1, 64), min_size=1, max_size=8)
)


def expect_refusal(
    proto: ClientProtocol, data: bytes, pieces: list[int], allowed: set[str]
) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        feed(proto, data, pieces)
    assert caught.value.reason in allowed, (caught.value.reason, allowed, caught.value)
    assert caught.value.reason in PROTOCOL_ERRORS
    assert proto.state == "closed"


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(shared_types(), how, st.data())
def test_a_type_is_taken_and_used_or_refused_by_its_bound(
    case: Case, pieces: list[int], data: st.DataObject
) -> None:
    top, cached = case
    unfolded = Unfolded()
    encoded = encode(top, cached, unfolded)
    proto = ready(1 << 20)
    message = server_message(CMD_PUT, init_body(encoded.data))
    expected = reasons(top, encoded, unfolded)
    note_case(f"refused for {', '.join(sorted(expected))}" if expected else "taken")
    stored = len(encoded.keys)
    note_case("no type cached" if not stored else f"{'one' if stored == 1 else 'several'} cached")
    if expected:
        expect_refusal(proto, message, pieces, expected)
        return
    (event,) = feed(proto, message, pieces)
    assert event == PutInitialized(IOID, Status(), top)
    assert isinstance(event, PutInitialized) and event.desc is not None
    parsed = event.desc
    assert (parsed.nodes, parsed.depth) == (unfolded.nodes(top), unfolded.depth(top))
    for path, leaf in paths(top, data.draw, 6):
        found = parsed.locate(".".join(path))
        assert found == (offset_of(top, path, unfolded), leaf)
        assert found is not None
        value = value_for(leaf)
        if not writable(leaf):
            with pytest.raises(LocalProtocolError):
                proto.put(IOID, ".".join(path), value)
            continue
        sent = proto.put(IOID, ".".join(path), value)
        assert bit_set(sent) == 1 << found[0]
        done = struct.pack("<IB", IOID, 0) + b"\xff"
        assert proto.receive(server_message(CMD_PUT, done)) == [PutDone(IOID, Status())]


def writable(leaf: FieldDesc) -> bool:
    code = leaf.code
    return (
        code in SCALARS
        or code in (STRING, BOUNDED_STRING)
        or (bool(code & ARRAY) and (code & ~ARRAY in SCALARS or code & ~ARRAY == STRING))
    )


def bit_set(sent: bytes) -> int:
    """The bit set of a PUT the client sent (little-endian: whole words, then bytes)."""
    body = sent[8 + 9 :]  # header, sid, ioid, subcmd
    if body[0] < 254:
        return int.from_bytes(body[1 : 1 + body[0]], "little")
    (n,) = struct.unpack("<I", body[1:5])
    return int.from_bytes(body[5 : 5 + n], "little")


@FUZZ
@given(shared_types(), how, st.data())
def test_a_truncated_type_is_malformed(case: Case, pieces: list[int], data: st.DataObject) -> None:
    top, cached = case
    unfolded = Unfolded()
    encoded = encode(top, cached, unfolded)
    cut = data.draw(st.integers(0, len(encoded.data) - 1))
    proto = ready(1 << 20)
    message = server_message(CMD_PUT, init_body(encoded.data[:cut]))
    expect_refusal(proto, message, pieces, {"malformed"} | reasons(top, encoded, unfolded))


@FUZZ
@given(shared_types(), how, st.data())
def test_a_message_cut_short_makes_nothing_yet(
    case: Case, pieces: list[int], data: st.DataObject
) -> None:
    """The header says more than came: nothing happens until the rest comes."""
    top, cached = case
    message = server_message(CMD_PUT, init_body(encode(top, cached, Unfolded()).data))
    cut = data.draw(st.integers(0, len(message) - 1))
    proto = ready(1 << 20)
    assert feed(proto, message[:cut], pieces) == []
    assert proto.state == "ready"


@FUZZ
@given(shared_types(), how, st.integers(16, 4096))
def test_an_oversized_message_is_refused_from_its_header(
    case: Case, pieces: list[int], bound: int
) -> None:
    top, cached = case
    unfolded = Unfolded()
    encoded = encode(top, cached, unfolded)
    body = init_body(encoded.data)
    proto = ready(bound)
    message = server_message(CMD_PUT, body)
    if len(body) > bound:
        expect_refusal(proto, message[:8], pieces, {"message_bytes"})  # before the body came
    elif expected := reasons(top, encoded, unfolded):
        expect_refusal(proto, message, pieces, expected)
    else:
        assert feed(proto, message, pieces) == [PutInitialized(IOID, Status(), top)]


@settings(max_examples=20, deadline=None)
@given(st.integers(20, 60), how)
@example(42, []).via("~830 bytes, whole")
@example(42, [1]).via("~830 bytes, byte by byte")
def test_the_doubling_type_is_refused_by_the_node_bound(levels: int, pieces: list[int]) -> None:
    """2**levels nodes unfolded in ~20 bytes a level: refused once past the bound, however it
    comes, never unfolded."""
    proto = ready(1 << 20)
    message = server_message(CMD_PUT, init_body(doubling_type(levels)))
    expect_refusal(proto, message, pieces, {"type_nodes"})
