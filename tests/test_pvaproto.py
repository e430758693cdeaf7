"""The sans-I/O PVA client machine (upstream/pvaproto.py) alone, in memory: a scripted server's
bytes fed whole, byte by byte and with trailing data, in both byte orders; type descriptions
and values through a round trip; what the protocol refuses. tests/test_pva_identity.py checks
the same bytes against real servers."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pvwire import limits
from pvwire.upstream.pvaproto import (
    ANY,
    ARRAY,
    BOUNDED_STRING,
    CMD_CONNECTION_VALIDATED,
    CMD_CONNECTION_VALIDATION,
    CMD_CREATE_CHANNEL,
    CMD_DESTROY_CHANNEL,
    CMD_ECHO,
    CMD_MESSAGE,
    CMD_PUT,
    CMD_SEARCH,
    CMD_SEARCH_RESPONSE,
    CREDENTIALS,
    FLAG_CONTROL,
    FLAG_SEGMENT_FIRST,
    FLAG_SEGMENT_LAST,
    FLAG_SERVER,
    STATUS_ERROR,
    STRING,
    STRUCT,
    UNION,
    ChannelCreated,
    ChannelDestroyed,
    ClientProtocol,
    Event,
    FieldDesc,
    LocalProtocolError,
    PutDone,
    PutInitialized,
    Reader,
    RemoteProtocolError,
    SearchFound,
    ServerMessage,
    Status,
    Validated,
    Writer,
    header,
    search_request,
    search_response,
    struct_of,
)

from tests.hostile_pva import chain_type, doubling_type

DOUBLE, INT, UBYTE, LONG = FieldDesc(0x43), FieldDesc(0x22), FieldDesc(0x24), FieldDesc(0x23)
ALARM = struct_of("alarm_t", severity=INT, status=INT, message=FieldDesc(STRING))
NT_SCALAR = struct_of("epics:nt/NTScalar:1.0", value=DOUBLE, alarm=ALARM)
NT_ENUM = struct_of(
    "epics:nt/NTEnum:1.0",
    value=struct_of("enum_t", index=INT, choices=FieldDesc(STRING | ARRAY)),
    alarm=ALARM,
)
NT_ARRAY = struct_of("epics:nt/NTScalarArray:1.0", value=FieldDesc(0x21 | ARRAY))
EVERYTHING = struct_of(
    "everything",
    b=FieldDesc(0x00),
    s=FieldDesc(STRING),
    bounded=FieldDesc(BOUNDED_STRING, bound=40),
    any=FieldDesc(ANY),
    u=FieldDesc(UNION, "", (("x", DOUBLE), ("y", FieldDesc(STRING)))),
    table=FieldDesc(STRUCT | ARRAY, element=struct_of("row", a=LONG)),
    unions=FieldDesc(UNION | ARRAY, element=FieldDesc(UNION, "", (("x", DOUBLE),))),
    anys=FieldDesc(ANY | ARRAY),
    nested=NT_ENUM,
)


def message(cmd: int, body: bytes | bytearray, big: bool = False, flags: int = 0) -> bytes:
    """A message as a server sends it."""
    return header(cmd, FLAG_SERVER | flags, len(body), big) + bytes(body)


def body(big: bool, *steps: Callable[[Writer], object]) -> bytes:
    w = Writer(big)
    for step in steps:
        step(w)
    return bytes(w.buf)


def opening(big: bool, methods: tuple[str, ...] = ("anonymous", "ca")) -> bytes:
    """SET_ENDIAN and CONNECTION_VALIDATION, as a server starts every connection."""

    def validation(w: Writer) -> None:
        w.pack("IH", 16384, 0x7FFF)
        w.size(len(methods))
        for m in methods:
            w.string(m)

    set_endian = header(2, FLAG_SERVER | FLAG_CONTROL, 0, big)
    return set_endian + message(CMD_CONNECTION_VALIDATION, body(big, validation), big)


OK = Status()


def validated(big: bool, status: Status = OK) -> bytes:
    return message(CMD_CONNECTION_VALIDATED, body(big, lambda w: w.status(status)), big)


def feed(proto: ClientProtocol, data: bytes, how: str) -> list[Event]:
    if how == "whole":
        return proto.receive(data)
    if how == "bytes":
        return [e for i in range(len(data)) for e in proto.receive(data[i : i + 1])]
    half = len(data) // 2
    return proto.receive(data[:half]) + proto.receive(data[half:])


def ready(big: bool) -> ClientProtocol:
    proto = ClientProtocol("olga", "console7", 1 << 20)
    proto.receive(opening(big) + validated(big))
    proto.take_outgoing()
    return proto


def decode_client(data: bytes) -> tuple[int, Reader]:
    """One message from the client: its command and a reader over its body."""
    assert data[0] == 0xCA and data[1] == 2 and not data[2] & FLAG_SERVER
    big = bool(data[2] & 0x80)
    (length,) = struct.unpack(">I" if big else "<I", data[4:8])
    assert len(data) == 8 + length
    return data[3], Reader(data[8:], big)


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("how", ["whole", "bytes", "halves"])
def test_validation_sends_the_users_name_in_the_servers_byte_order(big: bool, how: str) -> None:
    proto = ClientProtocol("olga", "console7", 1 << 20)
    assert feed(proto, opening(big), how) == []
    cmd, r = decode_client(proto.take_outgoing())
    assert (cmd, bool(proto.big_endian)) == (CMD_CONNECTION_VALIDATION, big)
    r.take(8)  # buffer size, registry size, QoS
    assert r.string() == "ca"
    assert r.type_desc() == CREDENTIALS
    assert (r.string(), r.string()) == ("olga", "console7")
    with pytest.raises(LocalProtocolError):  # nothing before the server says validated
        proto.create_channel(1, "ACF:SP")
    assert feed(proto, validated(big), how) == [Validated(Status())]
    assert proto.state == "ready"


def test_the_server_may_refuse_the_credentials() -> None:
    proto = ClientProtocol("olga", "h", 1 << 20)
    refusal = Status(STATUS_ERROR, "who?", "")
    assert proto.receive(opening(False) + validated(False, refusal)) == [Validated(refusal)]


def test_a_server_without_ca_authentication_is_left() -> None:
    """Going on anonymous would write as nobody: the connection is refused instead."""
    proto = ClientProtocol("olga", "h", 1 << 20)
    with pytest.raises(RemoteProtocolError, match="'ca'"):
        proto.receive(opening(False, ("anonymous", "x509")))
    with pytest.raises(LocalProtocolError):
        proto.receive(b"")


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("how", ["whole", "bytes", "halves"])
def test_a_put_from_channel_to_completion(big: bool, how: str) -> None:
    proto = ready(big)
    cmd, r = decode_client(proto.create_channel(7, "ACF:SP"))
    assert (cmd, r.unpack("H"), r.unpack("I"), r.string()) == (CMD_CREATE_CHANNEL, 1, 7, "ACF:SP")
    cmd, r = decode_client(proto.put_init(99, 8, wait=True))
    assert (cmd, r.unpack("I"), r.unpack("I"), r.u8()) == (CMD_PUT, 99, 8, 0x08)
    request = r.type_desc()
    assert request is not None and request.locate("record._options.block") is not None
    assert r.string() == "true"
    proto.put_init(99, 9, wait=False)
    # The server's answers: the type arrives through its introspection cache (0xFD), and a
    # second INIT names the cached type by its key alone (0xFE).
    init_body = body(big, lambda w: w.pack("IB", 8, 0x08), lambda w: w.status(Status()))
    cached = body(big, lambda w: w.buf.extend(b"\xfd"), lambda w: w.pack("H", 3),
                  lambda w: w.type_desc(NT_SCALAR))  # fmt: skip
    again = body(big, lambda w: w.pack("IB", 9, 0x08), lambda w: w.status(Status()),
                 lambda w: w.buf.extend(b"\xfe"), lambda w: w.pack("H", 3))  # fmt: skip
    created = body(big, lambda w: w.pack("II", 7, 99), lambda w: w.status(Status()))
    data = (
        message(CMD_CREATE_CHANNEL, created, big)
        + message(CMD_PUT, init_body + cached, big)
        + message(CMD_PUT, again, big)
    )  # fmt: skip
    assert feed(proto, data, how) == [
        ChannelCreated(7, 99, Status()),
        PutInitialized(8, Status(), NT_SCALAR),
        PutInitialized(9, Status(), NT_SCALAR),
    ]
    cmd, r = decode_client(proto.put(8, "value", 2.5))
    assert (cmd, r.unpack("I"), r.unpack("I"), r.u8()) == (CMD_PUT, 99, 8, 0)
    assert (r.size(), r.u8(), r.unpack("d")) == (1, 0b10, 2.5)  # bit 1: `value`
    with pytest.raises(LocalProtocolError, match="putting"):  # one put at a time
        proto.put(8, "value", 3.5)
    done = body(big, lambda w: w.pack("IB", 8, 0), lambda w: w.status(Status()))
    said = body(big, lambda w: w.pack("IB", 8, 1), lambda w: w.string("hm"))
    data = (
        message(CMD_PUT, done, big)
        + message(CMD_MESSAGE, said, big)
        + message(CMD_DESTROY_CHANNEL, body(big, lambda w: w.pack("II", 99, 7)), big)
        + message(CMD_ECHO, b"", big)
    )
    assert feed(proto, data, how) == [
        PutDone(8, Status()),
        ServerMessage(8, 1, "hm", 2),
        ChannelDestroyed(99, 7),
    ]
    with pytest.raises(LocalProtocolError, match="unknown"):  # gone with its channel
        proto.put(9, "value", 1.0)
    assert proto.dropped == 0


def initialised(proto: ClientProtocol, ioid: int, desc: FieldDesc, sid: int = 1) -> None:
    """Operation `ioid` initialised with the structure `desc`, as a server answers."""
    proto.put_init(sid, ioid, wait=True)
    reply = body(False, lambda w: w.pack("IB", ioid, 8), lambda w: w.status(Status()),
                 lambda w: w.type_desc(desc))  # fmt: skip
    assert proto.receive(message(CMD_PUT, reply)) == [PutInitialized(ioid, Status(), desc)]


def test_a_refused_put_carries_the_servers_words() -> None:
    proto = ready(False)
    refusal = Status(STATUS_ERROR, "Put not permitted", "")
    initialised(proto, 5, NT_SCALAR)
    proto.put(5, "value", 1.0)
    proto.put_init(1, 6, wait=True)
    done = message(CMD_PUT, body(False, lambda w: w.pack("IB", 5, 0), lambda w: w.status(refusal)))
    failed_init = message(
        CMD_PUT, body(False, lambda w: w.pack("IB", 6, 8), lambda w: w.status(refusal))
    )
    assert proto.receive(done + failed_init) == [
        PutDone(5, refusal),
        PutInitialized(6, refusal, None),  # no type follows a refusal
    ]


def test_segments_are_joined() -> None:
    proto = ready(False)
    whole = body(
        False, lambda w: w.pack("II", 7, 99), lambda w: w.status(Status(1, "careful", "t"))
    )
    parts = (whole[:3], whole[3:5], whole[5:])
    data = (
        message(CMD_CREATE_CHANNEL, parts[0], flags=FLAG_SEGMENT_FIRST)
        + message(CMD_CREATE_CHANNEL, parts[1], flags=FLAG_SEGMENT_FIRST | FLAG_SEGMENT_LAST)
        + message(CMD_CREATE_CHANNEL, parts[2], flags=FLAG_SEGMENT_LAST)
    )
    proto.create_channel(7, "X")
    assert proto.receive(data) == [ChannelCreated(7, 99, Status(1, "careful", "t"))]
    with pytest.raises(RemoteProtocolError, match="segments"):
        ready(False).receive(message(CMD_CREATE_CHANNEL, whole, flags=FLAG_SEGMENT_LAST))


def test_messages_beyond_the_bound_end_the_connection() -> None:
    proto = ClientProtocol("olga", "h", 64)
    proto.receive(opening(False) + validated(False))
    with pytest.raises(RemoteProtocolError, match="more than 64 bytes"):
        proto.receive(header(CMD_PUT, FLAG_SERVER, 65, False))  # refused before the body arrives
    assert proto.state == "closed"


@pytest.mark.parametrize(
    "data",
    [
        b"\xcb\x02\x40\x01\x00\x00\x00\x00",  # not the magic byte
        b"\xca\x02\x00\x01\x00\x00\x00\x00",  # a client's message
        message(CMD_CREATE_CHANNEL, b"\x01\x00\x00\x00\x02\x00\x00\x00"),  # before validation
        opening(False) + message(CMD_CONNECTION_VALIDATION, b""),  # validation twice
    ],
)
def test_what_a_server_may_not_send(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        ClientProtocol("olga", "h", 1 << 20).receive(data)


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("desc", [NT_SCALAR, NT_ENUM, NT_ARRAY, EVERYTHING, CREDENTIALS])
def test_type_descriptions_round_trip(big: bool, desc: FieldDesc) -> None:
    data = body(big, lambda w: w.type_desc(desc))
    r = Reader(data, big)
    assert r.type_desc() == desc
    with pytest.raises(RemoteProtocolError):  # every byte counts
        Reader(data[:-1], big).type_desc()


def test_bad_type_descriptions() -> None:
    with pytest.raises(RemoteProtocolError, match="never defined"):
        Reader(b"\xfe\x01\x00", False).type_desc()
    with pytest.raises(RemoteProtocolError, match="fixed or bounded"):
        Reader(b"\x1b\x02", False).type_desc()
    with pytest.raises(RemoteProtocolError, match="unknown"):
        Reader(b"\x44", False).type_desc()
    deep = b"\x80\x00\x01\x01a" * 30 + b"\x43"
    with pytest.raises(RemoteProtocolError, match="deeper"):
        Reader(deep, False).type_desc()


def test_bit_offsets_count_every_node_depth_first() -> None:
    assert NT_SCALAR.locate("value") == (1, DOUBLE)
    assert NT_SCALAR.locate("alarm.message") == (5, FieldDesc(STRING))
    assert NT_ENUM.locate("value.index") == (2, INT)
    assert EVERYTHING.locate("nested.value.index") == (11, INT)
    assert NT_SCALAR.locate("value.index") is None
    assert NT_SCALAR.locate("nothing") is None


@pytest.mark.parametrize("big", [False, True])
def test_bit_sets_as_pvxs_writes_them(big: bool) -> None:
    assert body(big, lambda w: w.bitset([1])) == b"\x01\x02"
    assert body(big, lambda w: w.bitset([])) == b"\x00"
    word = struct.pack(">Q" if big else "<Q", 1 << 3)
    assert body(big, lambda w: w.bitset([3, 65])) == b"\x09" + word + b"\x02"


@pytest.mark.parametrize("big", [False, True])
def test_values_of_every_kind_a_put_writes(big: bool) -> None:
    order = ">" if big else "<"

    def leaf(desc: FieldDesc, value: object) -> bytes:
        return body(big, lambda w: w.leaf(desc, value))

    assert leaf(DOUBLE, 2.5) == struct.pack(order + "d", 2.5)
    assert leaf(INT, -3) == struct.pack(order + "i", -3)
    assert leaf(FieldDesc(STRING), "Ольга") == bytes([10]) + "Ольга".encode()
    assert leaf(FieldDesc(0x21 | ARRAY), np.array([3, -4])) == b"\x02" + struct.pack(
        order + "hh", 3, -4
    )
    assert leaf(FieldDesc(0x42 | ARRAY), [1.5]) == b"\x01" + struct.pack(order + "f", 1.5)
    assert leaf(FieldDesc(STRING | ARRAY), ["a", "bc"]) == b"\x02\x01a\x02bc"
    long = "x" * 300
    assert Reader(leaf(FieldDesc(STRING), long), big).string() == long
    for desc, bad in (
        (INT, 2**31),
        (UBYTE, -1),
        (FieldDesc(0x24 | ARRAY), [1, 256]),
        (FieldDesc(BOUNDED_STRING, bound=2), "abc"),
        (FieldDesc(0x43 | ARRAY), [[1.0]]),
        (NT_SCALAR, 1.0),
        (DOUBLE, "one"),
    ):
        with pytest.raises(LocalProtocolError):
            leaf(desc, bad)


def test_a_put_to_a_field_the_structure_lacks() -> None:
    proto = ready(False)
    initialised(proto, 2, NT_ARRAY)
    with pytest.raises(LocalProtocolError, match="no field"):
        proto.put(2, "value.index", 1)


def test_search_round_trip() -> None:
    cmd, r = decode_client(search_request(5, 5, "ACF:SP", 40000, unicast=True))
    assert cmd == CMD_SEARCH
    assert (r.unpack("I"), r.u8()) == (5, 0x80)
    r.take(3 + 16)
    assert (r.unpack("H"), r.size(), r.string(), r.unpack("H")) == (40000, 1, "tcp", 1)
    assert (r.unpack("I"), r.string()) == (5, "ACF:SP")

    def reply(address: bytes, found: int = 1, protocol: str = "tcp") -> bytes:
        def build(w: Writer) -> None:
            w.buf += bytes(12)
            w.pack("I", 5)
            w.buf += address
            w.pack("H", 5075)
            w.string(protocol)
            w.buf.append(found)
            w.pack("HI", 1, 5)

        return message(CMD_SEARCH_RESPONSE, body(False, build))

    mapped = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 7])
    assert search_response(reply(mapped)) == SearchFound(5, "10.0.0.7", 5075, (5,))
    assert search_response(reply(bytes(16))) == SearchFound(5, "", 5075, (5,))
    assert search_response(reply(mapped, found=0)) is None
    assert search_response(reply(mapped, protocol="tls")) is None
    assert search_response(b"\xca\x02\x40\x00" + bytes(4)) is None  # a beacon
    with pytest.raises(RemoteProtocolError):
        search_response(reply(b"\x20\x01" + bytes(14)))  # IPv6
    with pytest.raises(RemoteProtocolError):
        search_response(reply(mapped)[:-3])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=1, max_value=16))
def test_any_bytes_give_events_or_a_protocol_error(noise: bytes, step: int) -> None:
    """Whatever a server sends, fed in any pieces: events, or RemoteProtocolError, nothing else."""
    proto = ready(False)
    data = message(CMD_PUT, noise) + noise
    try:
        for i in range(0, len(data), step):
            proto.receive(data[i : i + step])
    except RemoteProtocolError:
        assert proto.state == "closed"
    with contextlib.suppress(RemoteProtocolError):
        search_response(noise)


def test_echo_is_a_bare_header_in_the_servers_order() -> None:
    for big in (False, True):
        data = ready(big).echo()
        assert len(data) == 8 and bool(data[2] & 0x80) == big
        assert decode_client(data)[0] == CMD_ECHO


# --- a hostile server's types and replies (DESIGN.md section 7e) ------------------------------


def init_reply(ioid: int, type_data: bytes, big: bool = False) -> bytes:
    reply = body(big, lambda w: w.pack("IB", ioid, 0x08), lambda w: w.status(Status()))
    return message(CMD_PUT, reply + type_data, big)


def answer_init(proto: ClientProtocol, ioid: int, type_data: bytes) -> list[Event]:
    proto.put_init(1, ioid, wait=True)
    return proto.receive(init_reply(ioid, type_data))


def refused(proto: ClientProtocol, data: bytes, reason: str) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as caught:
        proto.receive(data)
    assert caught.value.reason == reason, caught.value
    assert proto.state == "closed"
    return caught.value


def test_shared_parts_are_sized_once_not_unfolded() -> None:
    """A structure of two references to the one below, 64 levels: 2**64 nodes unfolded, each
    node's figures made from its children's when it is made."""
    node = struct_of("", x=DOUBLE)
    for _ in range(64):
        node = struct_of("", a=node, b=node)
    assert (node.nodes, node.size, node.depth) == (3 * 2**64 - 1, 3 * 2**64 - 1, 66)
    top = struct_of("", levels=node, value=DOUBLE)
    assert top.locate("value") == (1 + node.size, DOUBLE)
    below = node.fields[1][1].fields[0][1]  # levels.b.a
    assert top.locate("levels.b.a") == (3 + node.size // 2, below)
    assert "nodes)" in repr(top) and len(repr(top)) < 200  # bounded too


def test_the_doubling_type_is_refused_by_its_node_count() -> None:
    """~830 bytes, 2**42 nodes unfolded: refused once past the bound, while it is read."""
    data = doubling_type(42)
    assert 800 < len(data) < 860
    error = refused_init(data)
    assert f"more than {limits.integer('pva_identity_type_nodes')} nodes" in str(error)


def refused_init(type_data: bytes, reason: str = "type_nodes") -> RemoteProtocolError:
    proto = ready(False)
    proto.put_init(1, 5, wait=True)
    return refused(proto, init_reply(5, type_data), reason)


def test_a_cached_type_counts_as_what_it_refers_to() -> None:
    """The node bound exactly: a cached structure named twice counts twice; as many members
    as fit are taken, one more is refused."""
    bound = limits.integer("pva_identity_type_nodes")

    def twice(members: int) -> bytes:
        wide = FieldDesc(STRUCT, "", tuple((f"m{i}", DOUBLE) for i in range(members)))
        w = Writer(False)
        w.buf.append(STRUCT)
        w.string("")
        w.size(2)
        w.string("a")
        w.buf += b"\xfd"
        w.pack("H", 1)
        w.type_desc(wide)
        w.string("b")
        w.buf += b"\xfe"
        w.pack("H", 1)
        return bytes(w.buf)

    members = (bound - 3) // 2  # the top, and twice a structure and its members
    (event,) = answer_init(ready(False), 5, twice(members))
    assert isinstance(event, PutInitialized) and event.desc is not None
    assert bound - 2 < event.desc.nodes <= bound
    refused_init(twice(members + 1))


def test_a_chain_of_cached_types_is_refused_by_its_depth_unfolded() -> None:
    """Read shallow (each level a member of the top), deep once unfolded: refused by the
    depth bound, not a RecursionError later."""
    depth = limits.integer("pva_identity_type_depth")
    (event,) = answer_init(ready(False), 5, chain_type(depth - 2))
    assert isinstance(event, PutInitialized) and event.desc is not None
    assert event.desc.depth == depth
    refused_init(chain_type(depth - 1), "type_depth")
    proto = ready(False)
    proto.put_init(1, 5, wait=True)
    refused(proto, init_reply(5, chain_type(2000)), "type_depth")


def test_replies_to_nothing_asked_are_dropped_unread() -> None:
    """An INIT nobody asked for stores nothing in the type cache (its type is never read), a
    PUT's answer with no put in flight and a channel nobody created are dropped, and counted."""
    proto = ready(False)
    stored = body(False, lambda w: w.buf.extend(b"\xfd\x01\x00"),
                  lambda w: w.type_desc(NT_SCALAR))  # fmt: skip
    done = body(False, lambda w: w.pack("IB", 5, 0), lambda w: w.status(Status()))
    created = body(False, lambda w: w.pack("II", 7, 99), lambda w: w.status(Status()))
    garbage = body(False, lambda w: w.pack("IB", 6, 0x08), lambda w: w.buf.extend(b"\x77" * 40))
    assert (
        proto.receive(
            init_reply(5, stored)
            + message(CMD_PUT, done)
            + message(CMD_CREATE_CHANNEL, created)
            + message(CMD_PUT, garbage)
        )
        == []
    )
    assert proto.take_dropped() == 4 and proto.take_dropped() == 0
    proto.put_init(1, 5, wait=True)  # now asked: the unsolicited one stored no key 1
    refused(proto, init_reply(5, b"\xfe\x01\x00"), "malformed")


def test_a_reply_given_up_is_dropped() -> None:
    proto = ready(False)
    proto.create_channel(7, "ACF:SP")
    proto.abandon_channel(7)
    initialised(proto, 5, NT_SCALAR)
    proto.put(5, "value", 1.0)
    cmd, r = decode_client(proto.destroy_request(5))
    assert (cmd, r.unpack("I"), r.unpack("I")) == (15, 1, 5)
    created = body(False, lambda w: w.pack("II", 7, 99), lambda w: w.status(Status()))
    done = body(False, lambda w: w.pack("IB", 5, 0), lambda w: w.status(Status()))
    assert proto.receive(message(CMD_CREATE_CHANNEL, created) + message(CMD_PUT, done)) == []
    assert proto.take_dropped() == 2


def stored_then_named(key: int, desc: FieldDesc) -> tuple[bytes, bytes]:
    """A type as a server with an introspection cache sends it (pvAccessCPP's
    `cachedSerialize`): in full under `key` the first time on a connection, by `key` after."""
    full = b"\xfd" + struct.pack("<H", key) + body(False, lambda w: w.type_desc(desc))
    return full, b"\xfe" + struct.pack("<H", key)


def test_a_late_init_reply_still_defines_the_types_it_caches() -> None:
    """An INIT given up (its put timed out) whose reply comes after all: the reply is dropped,
    but the server cached the type it sent as sent, and names it by its key from then on, so
    the next INIT of that structure (another PV of the same record type) is understood."""
    proto = ready(False)
    proto.put_init(1, 5, wait=True)
    proto.destroy_request(5)
    full, named = stored_then_named(3, NT_SCALAR)
    assert proto.receive(init_reply(5, full)) == []
    assert proto.take_dropped() == 1
    assert answer_init(proto, 6, named) == [PutInitialized(6, OK, NT_SCALAR)]


def test_init_replies_given_up_are_remembered_up_to_their_bound() -> None:
    """Past pva_identity_late_inits, the oldest INIT given up is forgotten: its late reply is
    then read no further than its id, as one nobody asked for."""
    bound = limits.integer("pva_identity_late_inits")
    proto = ready(False)
    for ioid in range(100, 101 + bound):
        proto.put_init(1, ioid, wait=True)
        proto.destroy_request(ioid)
    full, _ = stored_then_named(3, NT_SCALAR)
    assert proto.receive(init_reply(100, full)) == []  # forgotten: unread
    assert answer_init(proto, 7, full) == [PutInitialized(7, OK, NT_SCALAR)]
    other = struct_of("", x=DOUBLE)
    full_other, named_other = stored_then_named(4, other)
    assert proto.receive(init_reply(101, full_other)) == []  # remembered: its type read
    assert answer_init(proto, 8, named_other) == [PutInitialized(8, OK, other)]
    assert proto.take_dropped() == 2
    proto.put_init(1, 9, wait=True)
    refused(proto, init_reply(9, b"\xfe\x09\x00"), "malformed")  # what was never sent


def test_the_type_cache_is_bounded_in_bytes() -> None:
    """Types asked for, each stored under a key of its own: past the cache's bytes (each type
    counted unfolded) the connection is closed."""
    bound = limits.integer("pva_identity_type_cache_bytes")
    wide = FieldDesc(STRUCT, "", tuple((f"m{i:04}", DOUBLE) for i in range(4000)))
    assert bound // 5 < wide.cost < bound // 4
    proto = ready(False)

    def stored(key: int) -> bytes:
        return b"\xfd" + struct.pack("<H", key) + body(False, lambda w: w.type_desc(wide))

    for key in range(4):
        assert answer_init(proto, 10 + key, stored(key)) == [PutInitialized(10 + key, OK, wide)]
    assert answer_init(proto, 20, stored(2)) == [PutInitialized(20, OK, wide)]  # replaced
    proto.put_init(1, 21, wait=True)
    refused(proto, init_reply(21, stored(9)), "type_cache")


def test_a_servers_words_are_cut() -> None:
    """A status's message and a MESSAGE keep their first bytes, and say how many came."""
    keep = limits.integer("pva_identity_text_bytes")
    long = "é" * keep  # two bytes each
    proto = ready(False)
    proto.put_init(1, 5, wait=True)
    refusal = body(False, lambda w: w.pack("IB", 5, 0x08),
                   lambda w: w.status(Status(STATUS_ERROR, long, long)))  # fmt: skip
    said = body(False, lambda w: w.pack("IB", 5, 1), lambda w: w.string(long))
    (init, told) = proto.receive(message(CMD_PUT, refusal) + message(CMD_MESSAGE, said))
    assert isinstance(init, PutInitialized) and init.status.message == "é" * (keep // 2)
    assert told == ServerMessage(5, 1, "é" * (keep // 2), 2 * keep)


def test_a_shared_type_hashes_without_unfolding() -> None:
    node = struct_of("", x=DOUBLE)
    for _ in range(64):
        node = struct_of("", a=node, b=node)
    twin = struct_of("", x=DOUBLE)
    for _ in range(64):
        twin = struct_of("", a=twin, b=twin)
    assert hash(node) == hash(twin) and len({node, NT_SCALAR}) == 2
