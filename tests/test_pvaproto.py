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
    assert r.type_desc({}) == CREDENTIALS
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
    request = r.type_desc({})
    assert request is not None and request.locate("record._options.block") is not None
    assert r.string() == "true"
    # The server's answers: the type arrives through its introspection cache (0xFD), and a
    # second INIT names the cached type by its key alone (0xFE).
    init_body = body(big, lambda w: w.pack("IB", 8, 0x08), lambda w: w.status(Status()))
    cached = body(big, lambda w: w.buf.extend(b"\xfd"), lambda w: w.pack("H", 3),
                  lambda w: w.type_desc(NT_SCALAR))  # fmt: skip
    again = body(big, lambda w: w.pack("IB", 9, 0x08), lambda w: w.status(Status()),
                 lambda w: w.buf.extend(b"\xfe"), lambda w: w.pack("H", 3))  # fmt: skip
    created = body(big, lambda w: w.pack("II", 7, 99), lambda w: w.status(Status()))
    done = body(big, lambda w: w.pack("IB", 8, 0), lambda w: w.status(Status()))
    said = body(big, lambda w: w.pack("IB", 8, 1), lambda w: w.string("hm"))
    data = (
        message(CMD_CREATE_CHANNEL, created, big)
        + message(CMD_PUT, init_body + cached, big)
        + message(CMD_PUT, again, big)
        + message(CMD_PUT, done, big)
        + message(CMD_MESSAGE, said, big)
        + message(CMD_DESTROY_CHANNEL, body(big, lambda w: w.pack("II", 99, 7)), big)
        + message(CMD_ECHO, b"", big)
    )  # fmt: skip
    assert feed(proto, data, how) == [
        ChannelCreated(7, 99, Status()),
        PutInitialized(8, Status(), NT_SCALAR),
        PutInitialized(9, Status(), NT_SCALAR),
        PutDone(8, Status()),
        ServerMessage(8, 1, "hm"),
        ChannelDestroyed(99, 7),
    ]
    cmd, r = decode_client(proto.put(99, 8, NT_SCALAR, "value", 2.5))
    assert (cmd, r.unpack("I"), r.unpack("I"), r.u8()) == (CMD_PUT, 99, 8, 0)
    assert (r.size(), r.u8(), r.unpack("d")) == (1, 0b10, 2.5)  # bit 1: `value`


def test_a_refused_put_carries_the_servers_words() -> None:
    proto = ready(False)
    refusal = Status(STATUS_ERROR, "Put not permitted", "")
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
    assert r.type_desc({}) == desc
    with pytest.raises(RemoteProtocolError):  # every byte counts
        Reader(data[:-1], big).type_desc({})


def test_bad_type_descriptions() -> None:
    with pytest.raises(RemoteProtocolError, match="never defined"):
        Reader(b"\xfe\x01\x00", False).type_desc({})
    with pytest.raises(RemoteProtocolError, match="fixed or bounded"):
        Reader(b"\x1b\x02", False).type_desc({})
    with pytest.raises(RemoteProtocolError, match="unknown"):
        Reader(b"\x44", False).type_desc({})
    deep = b"\x80\x00\x01\x01a" * 30 + b"\x43"
    with pytest.raises(RemoteProtocolError, match="deeper"):
        Reader(deep, False).type_desc({})


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
    with pytest.raises(LocalProtocolError, match="no field"):
        ready(False).put(1, 2, NT_ARRAY, "value.index", 1)


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
