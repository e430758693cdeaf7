"""The client side of PVAccess that a put needs, as a pure machine: bytes in, events out.

No sockets here (pva_identity.py owns them): `ClientProtocol.receive(bytes)` returns the events
the server's messages make, and the methods that start something return the bytes to send. What
the protocol makes the client answer by itself (the server's CONNECTION_VALIDATION, its ECHO)
is queued in `outgoing`, taken with `take_outgoing()` after each `receive`.

What a put costs on the wire: after the TCP connect the server sends SET_ENDIAN and
CONNECTION_VALIDATION (its authentication methods); the client answers with the method "ca" and
the structure {string user; string host}, which is where the IOC learns who writes; the server
says CONNECTION_VALIDATED. Then CREATE_CHANNEL (cid -> sid), PUT INIT with a pvRequest (the
reply carries the structure's type description, possibly through the connection's introspection
cache), and PUT: a bit set naming the fields sent and their values. INIT is done once per
channel and request; later puts reuse it (one round trip each).

The facts come from the PVA protocol specification and pvxs's encoder and decoder (pvaproto.h,
dataencode.cpp, clientconn.cpp, clientget.cpp); every byte is checked against real servers in
tests/test_pva_identity.py.

A server is as untrusted as a client (any host may answer a search), so what it sends is parsed
under bounds and only as an answer to something asked:
- a message's size, a type's nesting, and a type's nodes in total, a cached type (0xFE) counted
  as what it refers to: a type whose cached parts are shared has exponentially many nodes when
  unfolded (~20 bytes per doubling), so nothing here walks the unfolded tree, each node knows
  its size, and a type past the bound is refused while it is read;
- the connection's type cache, in the bytes its types would hold unfolded;
- replies to no request made (an INIT or a PUT nobody asked for, a channel nobody created) are
  dropped from their ids, before their types are read, and counted (`dropped`); but the late
  reply of an INIT given up has its type read into the cache first (a server with a cache,
  pvAccessCPP's, names that type by its key from then on), for the last MAX_LATE_INITS given up;
- the words of a status or a MESSAGE, truncated.
Every violation is a RemoteProtocolError carrying its `reason`: the connection is then closed.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..limits import integer

__all__ = [
    "PROTOCOL_ERRORS",
    "ClientProtocol",
    "FieldDesc",
    "LocalProtocolError",
    "RemoteProtocolError",
    "Status",
    "TypeCache",
]

# Message header: magic, version, flags, command, then the body's length.
MAGIC = 0xCA
VERSION = 2
FLAG_CONTROL = 0x01
FLAG_SEGMENT_MASK = 0x30
FLAG_SEGMENT_FIRST = 0x10
FLAG_SEGMENT_LAST = 0x20
FLAG_SERVER = 0x40
FLAG_BIG_ENDIAN = 0x80
CONTROL_SET_ENDIAN = 2

CMD_CONNECTION_VALIDATION = 1
CMD_ECHO = 2
CMD_SEARCH = 3
CMD_SEARCH_RESPONSE = 4
CMD_CREATE_CHANNEL = 7
CMD_DESTROY_CHANNEL = 8
CMD_CONNECTION_VALIDATED = 9
CMD_PUT = 11
CMD_DESTROY_REQUEST = 15
CMD_MESSAGE = 18

SUBCMD_INIT = 0x08

# Type codes of the pvData introspection encoding.
BOOL, STRING, BOUNDED_STRING = 0x00, 0x60, 0x83
STRUCT, UNION, ANY = 0x80, 0x81, 0x82
ARRAY = 0x08  # or-ed into a scalar or compound code: a variable-length array of it
_NULL_TYPE, _CACHE_PUT, _CACHE_GET = 0xFF, 0xFD, 0xFE
_SCALAR_FORMATS = {  # code: struct format of one element
    BOOL: "?",
    0x20: "b",
    0x21: "h",
    0x22: "i",
    0x23: "q",
    0x24: "B",
    0x25: "H",
    0x26: "I",
    0x27: "Q",
    0x42: "f",
    0x43: "d",
}
# Nesting of a type description, as read and as unfolded: a deeper one is refused (pvxs: 20).
MAX_TYPE_DEPTH = integer("pva_identity_type_depth")
# Nodes of one type description unfolded, a cached type counted as what it refers to.
MAX_TYPE_NODES = integer("pva_identity_type_nodes")
# What one connection's type cache may hold, in the bytes of its types unfolded (NODE_BYTES each).
MAX_TYPE_CACHE_BYTES = integer("pva_identity_type_cache_bytes")
# The words of a status or a MESSAGE kept; the rest is dropped.
MAX_TEXT_BYTES = integer("pva_identity_text_bytes")
# INITs given up whose late reply still has its types read into the cache.
MAX_LATE_INITS = integer("pva_identity_late_inits")
# Memory of one parsed node beside its names: a FieldDesc, its (name, desc) pair and the name
# object, by sys.getsizeof (104 + 56 + 57 bytes).
NODE_BYTES = 224
STATUS_OK, STATUS_WARNING, STATUS_ERROR, STATUS_FATAL = 0, 1, 2, 3

# Why a server's connection was closed (RemoteProtocolError.reason), for the metrics.
PROTOCOL_ERRORS = ("message_bytes", "type_depth", "type_nodes", "type_cache", "malformed")


class RemoteProtocolError(Exception):
    """The server sent something the protocol does not allow: the connection is unusable.
    `reason` is one of PROTOCOL_ERRORS."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


class LocalProtocolError(Exception):
    """This side asked for something out of order (a put before validation) or not encodable."""


@dataclass(frozen=True, slots=True)
class FieldDesc:
    """One node of a pvData type description. Its children may be shared (a cached type named
    twice is one object): what would need the unfolded tree is computed once, from the
    children's own figures, when the node is made."""

    code: int
    type_id: str = ""
    fields: tuple[tuple[str, FieldDesc], ...] = ()  # structures and unions
    element: FieldDesc | None = None  # arrays of structures or unions
    bound: int = 0  # bounded strings
    # Bits this node takes in a bit set: itself and, for a structure, its descendants.
    size: int = field(init=False, repr=False, compare=False)
    nodes: int = field(init=False, repr=False, compare=False)  # itself and every descendant
    depth: int = field(init=False, repr=False, compare=False)  # levels, itself included
    cost: int = field(init=False, repr=False, compare=False)  # bytes it would hold unfolded

    def __post_init__(self) -> None:
        children = [d for _, d in self.fields]
        if self.element is not None:
            children.append(self.element)
        bits = 1 + sum(d.size for d in children) if self.code == STRUCT else 1
        names = len(self.type_id) + sum(len(n) for n, _ in self.fields)
        object.__setattr__(self, "size", bits)
        object.__setattr__(self, "nodes", 1 + sum(d.nodes for d in children))
        object.__setattr__(self, "depth", 1 + max((d.depth for d in children), default=0))
        object.__setattr__(self, "cost", NODE_BYTES + names + sum(d.cost for d in children))

    def __hash__(self) -> int:
        """From the figures: the dataclass's own would hash every shared part unfolded."""
        return hash((self.code, self.type_id, self.bound, self.size, self.nodes, self.depth))

    def __repr__(self) -> str:
        """Bounded: the dataclass's own would unfold every shared part."""
        names = ", ".join(n[:40] for n, _ in self.fields[:8])
        more = ", ..." if len(self.fields) > 8 else ""
        kids = f", [{names}{more}]" if self.fields else ""
        element = f", of {self.element.code:#04x}" if self.element is not None else ""
        return (
            f"FieldDesc({self.code:#04x}, {self.type_id[:60]!r}{kids}{element}, {self.nodes} nodes)"
        )

    def child(self, name: str) -> FieldDesc | None:
        for n, d in self.fields:
            if n == name:
                return d
        return None

    def locate(self, path: str) -> tuple[int, FieldDesc] | None:
        """The bit offset and type of the field at `path` ("value.index"), or None."""
        offset, node = 0, self
        for part in path.split("."):
            if node.code != STRUCT:
                return None
            offset += 1
            for n, d in node.fields:
                if n == part:
                    node = d
                    break
                offset += d.size
            else:
                return None
        return offset, node


def struct_of(type_id: str, **members: FieldDesc) -> FieldDesc:
    return FieldDesc(STRUCT, type_id, tuple(members.items()))


class TypeCache:
    """The server's introspection cache on one connection (0xFD stores a type under a key, 0xFE
    names it), bounded in bytes: a type counts its `cost`, what it refers to included."""

    __slots__ = ("_types", "bytes", "max_bytes")

    def __init__(self, max_bytes: int = MAX_TYPE_CACHE_BYTES) -> None:
        self._types: dict[int, FieldDesc] = {}
        self.bytes = 0
        self.max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self._types)

    def put(self, key: int, desc: FieldDesc) -> None:
        old = self._types.get(key)
        total = self.bytes - (old.cost if old is not None else 0) + desc.cost
        if total > self.max_bytes:
            raise RemoteProtocolError(
                f"the server's cached types would hold more than {self.max_bytes} bytes",
                "type_cache",
            )
        self._types[key] = desc
        self.bytes = total

    def get(self, key: int) -> FieldDesc:
        desc = self._types.get(key)
        if desc is None:
            raise RemoteProtocolError(f"introspection cache key {key} was never defined")
        return desc


@dataclass(frozen=True, slots=True)
class Status:
    code: int = STATUS_OK
    message: str = ""
    trace: str = ""

    @property
    def ok(self) -> bool:
        return self.code in (STATUS_OK, STATUS_WARNING)


# -- primitive encoding ---------------------------------------------------------------------------


class Reader:
    """Reads one message body in its byte order; running past the end is the peer's fault."""

    __slots__ = ("_data", "_nodes", "_order", "_pos")

    def __init__(self, data: bytes, big_endian: bool) -> None:
        self._data = data
        self._pos = 0
        self._order = ">" if big_endian else "<"
        self._nodes = 0  # of the type description being read

    def take(self, n: int) -> bytes:
        end = self._pos + n
        if n < 0 or end > len(self._data):
            raise RemoteProtocolError("a message ends in the middle of a field")
        out = self._data[self._pos : end]
        self._pos = end
        return out

    def unpack(self, fmt: str) -> Any:
        s = struct.Struct(self._order + fmt)
        return s.unpack(self.take(s.size))[0]

    def u8(self) -> int:
        return int(self.take(1)[0])

    def size(self, allow_null: bool = False) -> int:
        first = self.u8()
        if first < 254:
            return first
        if first == 254:
            return int(self.unpack("I"))
        if allow_null:  # 255: a null string, as pvAccessJava sends an empty one
            return 0
        raise RemoteProtocolError("a size of 255 where no null is allowed")

    def string(self) -> str:
        return self.take(self.size(allow_null=True)).decode("utf-8", "replace")

    def text(self) -> str:
        """A string meant for people, of which the first MAX_TEXT_BYTES are kept."""
        data = self.take(self.size(allow_null=True))
        return data[:MAX_TEXT_BYTES].decode("utf-8", "replace")

    def status(self) -> Status:
        code = self.u8()
        if code == 255:
            return Status()
        if code > STATUS_FATAL:
            raise RemoteProtocolError(f"a status of type {code}")
        return Status(code, self.text(), self.text())

    def type_desc(self, cache: TypeCache | None = None) -> FieldDesc | None:
        """One type description, its cached parts stored in and taken from `cache`; refused
        past MAX_TYPE_DEPTH levels or MAX_TYPE_NODES nodes (a cached type counted as what it
        refers to), as soon as the bound is passed."""
        self._nodes = 0
        return self._type(cache if cache is not None else TypeCache(), 0)

    def _counted(self, desc: FieldDesc, nodes: int) -> FieldDesc:
        self._nodes += nodes
        if self._nodes > MAX_TYPE_NODES:
            raise RemoteProtocolError(
                f"a type description of more than {MAX_TYPE_NODES} nodes "
                "(cached types counted as what they refer to)",
                "type_nodes",
            )
        if desc.depth > MAX_TYPE_DEPTH:
            raise RemoteProtocolError(
                f"a type description nested deeper than {MAX_TYPE_DEPTH} unfolded", "type_depth"
            )
        return desc

    def _type(self, cache: TypeCache, depth: int) -> FieldDesc | None:
        if depth > MAX_TYPE_DEPTH:
            raise RemoteProtocolError(
                f"a type description nested deeper than {MAX_TYPE_DEPTH}", "type_depth"
            )
        code = self.u8()
        if code == _NULL_TYPE:
            return None
        if code == _CACHE_PUT:
            key = int(self.unpack("H"))
            desc = self._type(cache, depth + 1)
            if desc is None:
                raise RemoteProtocolError("a null type stored in the introspection cache")
            cache.put(key, desc)
            return desc
        if code == _CACHE_GET:
            desc = cache.get(int(self.unpack("H")))
            return self._counted(desc, desc.nodes)
        base, kind = code & ~0x18, code & 0x18
        if kind not in (0, ARRAY):
            raise RemoteProtocolError(f"type code {code:#04x}: fixed or bounded arrays")
        if base in (STRUCT, UNION):
            if kind == ARRAY:
                element = self._type(cache, depth + 1)
                if element is None or element.code != base:
                    raise RemoteProtocolError(f"type code {code:#04x} without its element")
                return self._counted(FieldDesc(code, element=element), 1)
            type_id = self.string()
            members = []
            for _ in range(self.size()):
                name = self.string()
                member = self._type(cache, depth + 1)
                if member is None:
                    raise RemoteProtocolError(f"member {name!r} has no type")
                members.append((name, member))
            return self._counted(FieldDesc(code, type_id, tuple(members)), 1)
        if base == BOUNDED_STRING and kind == 0:
            return self._counted(FieldDesc(code, bound=self.size()), 1)
        if base in _SCALAR_FORMATS or base in (STRING, ANY):
            return self._counted(FieldDesc(code), 1)
        raise RemoteProtocolError(f"unknown type code {code:#04x}")


class Writer:
    __slots__ = ("_order", "buf")

    def __init__(self, big_endian: bool) -> None:
        self.buf = bytearray()
        self._order = ">" if big_endian else "<"

    def pack(self, fmt: str, *values: Any) -> None:
        self.buf += struct.pack(self._order + fmt, *values)

    def size(self, n: int) -> None:
        if n < 254:
            self.buf.append(n)
        elif n <= 0xFFFFFFFF:
            self.buf.append(254)
            self.pack("I", n)
        else:
            raise LocalProtocolError(f"a size of {n} does not fit in a PVA message")

    def string(self, text: str) -> None:
        data = text.encode()
        self.size(len(data))
        self.buf += data

    def status(self, status: Status) -> None:
        if status == Status():
            self.buf.append(255)
        else:
            self.buf.append(status.code)
            self.string(status.message)
            self.string(status.trace)

    def type_desc(self, desc: FieldDesc | None) -> None:
        """Written in full: this side never uses the introspection cache."""
        if desc is None:
            self.buf.append(_NULL_TYPE)
            return
        self.buf.append(desc.code)
        if desc.element is not None:
            self.type_desc(desc.element)
        elif desc.code in (STRUCT, UNION):
            self.string(desc.type_id)
            self.size(len(desc.fields))
            for name, member in desc.fields:
                self.string(name)
                self.type_desc(member)
        elif desc.code == BOUNDED_STRING:
            self.size(desc.bound)

    def bitset(self, bits: Sequence[int]) -> None:
        """pvxs's encoding: whole 64-bit words in the message's order, then the last bytes."""
        mask = 0
        for bit in bits:
            mask |= 1 << bit
        data = mask.to_bytes((mask.bit_length() + 7) // 8, "little")
        self.size(len(data))
        whole = len(data) // 8 * 8
        for i in range(0, whole, 8):
            self.pack("Q", int.from_bytes(data[i : i + 8], "little"))
        self.buf += data[whole:]

    def leaf(self, desc: FieldDesc, value: Any) -> None:
        """One scalar, string or array value of type `desc`. Raises LocalProtocolError (with
        what would not fit) for a value the type cannot hold."""
        code = desc.code
        try:
            if code in _SCALAR_FORMATS:
                self.pack(_SCALAR_FORMATS[code], value)
            elif code in (STRING, BOUNDED_STRING):
                if desc.bound and len(str(value).encode()) > desc.bound:
                    raise LocalProtocolError(f"a string longer than {desc.bound} bytes")
                self.string(str(value))
            elif code & ~ARRAY in _SCALAR_FORMATS and code & ARRAY:
                fmt = _SCALAR_FORMATS[code & ~ARRAY]
                array = np.asarray(value)
                if array.ndim != 1:
                    raise LocalProtocolError("an array of more than one dimension")
                dtype = np.dtype(self._order + fmt)
                out = array.astype(dtype, casting="same_kind" if fmt in "fd" else "unsafe")
                if fmt not in "fd?" and not np.array_equal(out, array):
                    raise LocalProtocolError(f"values out of the range of {dtype.name}")
                self.size(len(out))
                self.buf += out.tobytes()
            elif code == STRING | ARRAY:
                items = list(value)
                self.size(len(items))
                for item in items:
                    self.string(str(item))
            else:
                raise LocalProtocolError(f"type code {code:#04x} is not written here")
        except (struct.error, TypeError, ValueError, OverflowError) as exc:
            raise LocalProtocolError(str(exc)) from None


def header(cmd: int, flags: int, length: int, big_endian: bool) -> bytes:
    if big_endian:
        flags |= FLAG_BIG_ENDIAN
    return struct.pack(">BBBB", MAGIC, VERSION, flags, cmd) + struct.pack(
        ">I" if big_endian else "<I", length
    )


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Validated:
    """The server accepted (or refused: `status`) the credentials sent."""

    status: Status


@dataclass(frozen=True, slots=True)
class ChannelCreated:
    cid: int
    sid: int
    status: Status


@dataclass(frozen=True, slots=True)
class ChannelDestroyed:
    """The server dropped a channel (its record went away)."""

    sid: int
    cid: int


@dataclass(frozen=True, slots=True)
class PutInitialized:
    ioid: int
    status: Status
    desc: FieldDesc | None


@dataclass(frozen=True, slots=True)
class PutDone:
    ioid: int
    status: Status


@dataclass(frozen=True, slots=True)
class ServerMessage:
    ioid: int
    level: int
    text: str  # its first MAX_TEXT_BYTES
    length: int  # bytes the server sent


Event = Validated | ChannelCreated | ChannelDestroyed | PutInitialized | PutDone | ServerMessage

# What the "ca" authentication carries, and the pvRequest of a put (record._options.block says
# whether the server answers once the record has processed).
CREDENTIALS = struct_of("", user=FieldDesc(STRING), host=FieldDesc(STRING))
_PUT_REQUEST = struct_of(
    "",
    field=struct_of(""),
    record=struct_of("", _options=struct_of("", block=FieldDesc(STRING))),
)

# Connection states, in order.
AWAIT_VALIDATION, VALIDATING, READY, CLOSED = "await validation", "validating", "ready", "closed"
# What an operation (a PUT request id) waits for: the INIT's reply, then a PUT's, one at a time.
_INITIALIZING, _IDLE, _PUTTING = "initializing", "idle", "putting"


@dataclass(slots=True)
class _Operation:
    sid: int
    state: str = _INITIALIZING
    desc: FieldDesc | None = None  # the structure a PUT writes into, once initialised


@dataclass(slots=True)
class ClientProtocol:
    """One client connection's protocol state, for one user's name.

    The machine knows what it asked: a channel being created (its cid), an operation being
    initialised or running a put (its ioid). A reply to anything else is dropped unread and
    counted in `dropped`; so is a late reply to what was given up (`abandon_channel`,
    `destroy_request`). One request at a time per operation: pvxs's server ignores a PUT on an
    operation still executing one, and the answer would complete the wrong put."""

    user: str
    host: str
    max_message_bytes: int
    state: str = AWAIT_VALIDATION
    big_endian: bool = False  # how this side sends: as the server's SET_ENDIAN asks
    outgoing: bytearray = field(default_factory=bytearray)
    dropped: int = 0  # replies to nothing asked, read no further than their ids
    _buffer: bytearray = field(default_factory=bytearray)
    _segments: bytearray = field(default_factory=bytearray)
    _segment_cmd: int | None = None
    _cache: TypeCache = field(default_factory=TypeCache)  # the server's type cache
    _creating: set[int] = field(default_factory=set)  # cids of CREATE_CHANNELs unanswered
    _operations: dict[int, _Operation] = field(default_factory=dict)  # by ioid
    _late_inits: OrderedDict[int, None] = field(default_factory=OrderedDict)  # ioids given up
    _next_id: int = 1

    # -- sending -----------------------------------------------------------------------------

    def _message(self, cmd: int, body: Writer | None = None) -> bytes:
        data = bytes(body.buf) if body is not None else b""
        return header(cmd, 0, len(data), self.big_endian) + data

    def _writer(self) -> Writer:
        if self.state != READY:
            raise LocalProtocolError(f"nothing can be sent on a connection that is {self.state}")
        return Writer(self.big_endian)

    def new_id(self) -> int:
        """A fresh channel or request id (ids are unique on this connection)."""
        self._next_id = self._next_id % 0xFFFFFFFF + 1
        return self._next_id

    def create_channel(self, cid: int, name: str) -> bytes:
        w = self._writer()
        w.pack("H", 1)
        w.pack("I", cid)
        w.string(name)
        self._creating.add(cid)
        return self._message(CMD_CREATE_CHANNEL, w)

    def abandon_channel(self, cid: int) -> None:
        """Waiting for the CREATE_CHANNEL of `cid` was given up: a late reply is dropped."""
        self._creating.discard(cid)

    def destroy_channel(self, sid: int, cid: int) -> bytes:
        w = self._writer()
        w.pack("II", sid, cid)
        self._forget_channel(sid)
        return self._message(CMD_DESTROY_CHANNEL, w)

    def _forget_channel(self, sid: int) -> None:
        for ioid in [i for i, op in self._operations.items() if op.sid == sid]:
            del self._operations[ioid]

    def put_init(self, sid: int, ioid: int, wait: bool) -> bytes:
        if ioid in self._operations:
            raise LocalProtocolError(f"request id {ioid} is in use")
        w = self._writer()
        w.pack("II", sid, ioid)
        w.buf.append(SUBCMD_INIT)
        w.type_desc(_PUT_REQUEST)
        w.string("true" if wait else "false")  # the request's one leaf: record._options.block
        self._operations[ioid] = _Operation(sid)
        self._late_inits.pop(ioid, None)  # an id used again: its reply is this one's
        return self._message(CMD_PUT, w)

    def put(self, ioid: int, path: str, value: Any) -> bytes:
        """PUT of the one field at `path` of the structure operation `ioid` was initialised
        with (PutInitialized), once its previous PUT (if any) was answered."""
        op = self._operations.get(ioid)
        if op is None or op.state != _IDLE or op.desc is None:
            why = "unknown" if op is None else op.state
            raise LocalProtocolError(f"operation {ioid} cannot put now: it is {why}")
        found = op.desc.locate(path)
        if found is None:
            raise LocalProtocolError(f"the structure has no field {path!r}")
        offset, leaf = found
        w = self._writer()
        w.pack("II", op.sid, ioid)
        w.buf.append(0)
        w.bitset([offset])
        w.leaf(leaf, value)
        message = self._message(CMD_PUT, w)
        op.state = _PUTTING  # only once the value was written: a refused one changes nothing
        return message

    def destroy_request(self, ioid: int) -> bytes:
        """Ends operation `ioid` (given up, or done with): a reply still to come is dropped."""
        op = self._operations.pop(ioid, None)
        if op is None:
            return b""
        if op.state == _INITIALIZING:  # its reply may still come, with types the server caches
            self._late_inits[ioid] = None
            if len(self._late_inits) > MAX_LATE_INITS:
                self._late_inits.popitem(last=False)
        w = self._writer()
        w.pack("II", op.sid, ioid)
        return self._message(CMD_DESTROY_REQUEST, w)

    def echo(self) -> bytes:
        """A keep-alive the server answers (it closes connections that stay silent)."""
        return self._message(CMD_ECHO)

    # -- receiving ---------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Event]:
        """Every event the complete messages in `data` (and before it) make. Raises
        RemoteProtocolError: the connection must then be closed."""
        if self.state == CLOSED:
            raise LocalProtocolError("the connection is closed")
        self._buffer += data
        events: list[Event] = []
        try:
            while len(self._buffer) >= 8:
                more = self._next()
                if more is None:  # the rest of a message is still to come
                    break
                events.extend(more)
        except RemoteProtocolError:
            self.state = CLOSED
            raise
        return events

    def _next(self) -> list[Event] | None:
        head = bytes(self._buffer[:8])
        magic, version, flags, cmd = head[:4]
        if magic != MAGIC or version == 0 or not flags & FLAG_SERVER:
            raise RemoteProtocolError(f"not a PVA server's message header: {head.hex()}")
        big = bool(flags & FLAG_BIG_ENDIAN)
        if flags & FLAG_CONTROL:
            del self._buffer[:8]
            if cmd == CONTROL_SET_ENDIAN:
                self.big_endian = big
            return []
        (length,) = struct.unpack(">I" if big else "<I", head[4:])
        if length + len(self._segments) > self.max_message_bytes:
            raise RemoteProtocolError(
                f"a message of more than {self.max_message_bytes} bytes (command {cmd})",
                "message_bytes",
            )
        if len(self._buffer) < 8 + length:
            return None
        body = bytes(self._buffer[8 : 8 + length])
        del self._buffer[: 8 + length]
        segment = flags & FLAG_SEGMENT_MASK
        continuation = bool(segment & FLAG_SEGMENT_LAST)  # a middle or last segment
        if continuation != (self._segment_cmd is not None) or (
            continuation and cmd != self._segment_cmd
        ):
            raise RemoteProtocolError("segments out of order")
        if segment and segment != FLAG_SEGMENT_LAST:  # first or middle: more to come
            self._segment_cmd = cmd
            self._segments += body
            return []
        if continuation:
            body = bytes(self._segments) + body
            self._segments.clear()
            self._segment_cmd = None
        return self._handle(cmd, Reader(body, big))

    def _handle(self, cmd: int, r: Reader) -> list[Event]:
        if cmd == CMD_CONNECTION_VALIDATION:
            self._validate(r)
            return []
        if cmd == CMD_CONNECTION_VALIDATED:
            if self.state != VALIDATING:
                raise RemoteProtocolError(f"CONNECTION_VALIDATED while {self.state}")
            self.state = READY
            return [Validated(r.status())]
        if cmd == CMD_ECHO:
            return []  # the answer to ours
        if self.state != READY:
            raise RemoteProtocolError(f"command {cmd} before the connection is validated")
        if cmd == CMD_CREATE_CHANNEL:
            cid = int(r.unpack("I"))
            if cid not in self._creating:
                return self._drop()
            self._creating.discard(cid)
            sid = int(r.unpack("I"))
            return [ChannelCreated(cid, sid, r.status())]
        if cmd == CMD_DESTROY_CHANNEL:
            sid, cid = int(r.unpack("I")), int(r.unpack("I"))
            self._forget_channel(sid)
            return [ChannelDestroyed(sid, cid)]
        if cmd == CMD_PUT:
            return self._put_reply(r)
        if cmd == CMD_MESSAGE:
            ioid, level = int(r.unpack("I")), r.u8()
            size = r.size(allow_null=True)
            text = r.take(size)[:MAX_TEXT_BYTES].decode("utf-8", "replace")
            return [ServerMessage(ioid, level, text, size)]
        return []  # anything else (beacons, an ACL change...) says nothing to a put

    def _put_reply(self, r: Reader) -> list[Event]:
        ioid, subcmd = int(r.unpack("I")), r.u8()
        op = self._operations.get(ioid)
        init = bool(subcmd & SUBCMD_INIT)
        if init and op is None and ioid in self._late_inits:
            del self._late_inits[ioid]
            if r.status().ok:  # the server cached its type as sent: so does this side
                r.type_desc(self._cache)
            return self._drop()
        if op is None or op.state != (_INITIALIZING if init else _PUTTING):
            return self._drop()  # its type, if any, is never read
        status = r.status()
        if not init:
            op.state = _IDLE
            return [PutDone(ioid, status)]
        desc = r.type_desc(self._cache) if status.ok else None
        if desc is not None and desc.code == STRUCT:
            op.state, op.desc = _IDLE, desc
        else:  # refused, or nothing a PUT can write into: the operation is over
            del self._operations[ioid]
        return [PutInitialized(ioid, status, desc)]

    def _drop(self) -> list[Event]:
        self.dropped += 1
        return []

    def _validate(self, r: Reader) -> None:
        if self.state != AWAIT_VALIDATION:
            raise RemoteProtocolError(f"CONNECTION_VALIDATION while {self.state}")
        r.take(6)  # the server's receive buffer and introspection registry sizes: unused
        methods = [r.string() for _ in range(r.size())]
        if "ca" not in methods:
            # Going on anonymous would write as nobody, or as a name the IOC did not hear.
            shown = ", ".join(m[:40] for m in methods[:10]) or "none"
            raise RemoteProtocolError(f"the server offers no 'ca' authentication (only {shown})")
        w = Writer(self.big_endian)
        w.pack("IHH", 0x10000, 0x7FFF, 0)  # receive buffer, registry size, QoS: as pvxs sends
        w.string("ca")
        w.type_desc(CREDENTIALS)
        w.string(self.user)
        w.string(self.host)
        self.outgoing += self._message(CMD_CONNECTION_VALIDATION, w)
        self.state = VALIDATING

    def take_outgoing(self) -> bytes:
        out = bytes(self.outgoing)
        self.outgoing.clear()
        return out

    def take_dropped(self) -> int:
        """Replies dropped since the last call."""
        n, self.dropped = self.dropped, 0
        return n


# -- name search (UDP) ---------------------------------------------------------------------------

SEARCH_UNICAST = 0x80


def search_request(seq: int, cid: int, name: str, reply_port: int, unicast: bool) -> bytes:
    """A SEARCH for one name; the answer goes to the sender's address at `reply_port`."""
    w = Writer(False)
    w.pack("I", seq)
    w.buf += bytes((SEARCH_UNICAST if unicast else 0, 0, 0, 0))
    w.buf += bytes(16)  # the reply address: none given, so the sender's
    w.pack("H", reply_port)
    w.size(1)
    w.string("tcp")
    w.pack("H", 1)
    w.pack("I", cid)
    w.string(name)
    return header(CMD_SEARCH, 0, len(w.buf), False) + bytes(w.buf)


@dataclass(frozen=True, slots=True)
class SearchFound:
    seq: int
    host: str  # "" when the server gave none: the address the datagram came from
    port: int
    cids: tuple[int, ...]


def search_response(data: bytes) -> SearchFound | None:
    """A positive tcp SEARCH_RESPONSE in one datagram, or None for anything else (beacons,
    negative answers, other protocols). Raises RemoteProtocolError for a malformed one."""
    if len(data) < 8 or data[0] != MAGIC or data[3] != CMD_SEARCH_RESPONSE:
        return None
    big = bool(data[2] & FLAG_BIG_ENDIAN)
    (length,) = struct.unpack(">I" if big else "<I", data[4:8])
    r = Reader(data[8 : 8 + length], big)
    r.take(12)  # the server's GUID
    seq = int(r.unpack("I"))
    raw = r.take(16)
    port = int(r.unpack("H"))
    protocol, found = r.string(), r.u8()
    if protocol != "tcp" or not found:
        return None
    cids = tuple(int(r.unpack("I")) for _ in range(int(r.unpack("H"))))
    if raw[:12] == bytes(10) + b"\xff\xff" and raw[12:] != bytes(4):  # IPv4 in IPv6
        host = ".".join(str(b) for b in raw[12:])
    elif raw == bytes(16) or raw[:12] == bytes(10) + b"\xff\xff":
        host = ""
    else:
        raise RemoteProtocolError("an IPv6 server address (only IPv4 is searched here)")
    return SearchFound(seq, host, port, cids)
