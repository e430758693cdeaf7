"""The stream protocol's bytes (protocol/PROTOCOL.md), with no I/O.

Server to client: every message is built here. Entries are built in two halves so that a changed
channel is encoded once per tick however many clients receive it: `encode_entry_body` produces the
part after the sid (mask and fields), shared by every client; `entry` prepends the per-attachment
array header and sid, a few bytes. Frames are spliced from already-encoded entries; splicing costs
about 0.01 µs per entry against ~0.1 µs to pack one (DESIGN.md section 8).

Client to server: `decode_client_message` validates at the boundary and raises `BadMessage` with a
sentence saying what was wrong; the caller answers it with ERROR 4400.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple

import msgpack
import numpy as np

from ..limits import integer
from ..model import ALARM, CONN, META, TIME, VALUE, Value

__all__ = [
    "HEARTBEAT",
    "HISTORY_COLUMNS",
    "PROTOCOL_VERSION",
    "Attach",
    "BadMessage",
    "ClientMessage",
    "Detach",
    "Entries",
    "EntryBody",
    "GapKind",
    "Kind",
    "Ping",
    "decode_client_message",
    "encode_attached",
    "encode_data",
    "encode_detached",
    "encode_entries",
    "encode_entry_body",
    "encode_error",
    "encode_hello",
    "encode_history",
    "encode_pong",
    "encode_snapshot",
    "encode_update_body",
    "entry",
    "pack_value",
]

PROTOCOL_VERSION = 1
NDARRAY_EXT = 1

# dtype code table of PROTOCOL.md section 4.1; index = code.
DTYPES = tuple(
    np.dtype(t).newbyteorder("<")
    for t in ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8")
)
_DTYPE_CODE = {dt: code for code, dt in enumerate(DTYPES)}


class Kind:
    HELLO = 0
    ATTACHED = 1
    SNAPSHOT = 2
    DATA = 3
    DETACHED = 4
    ERROR = 5
    HEARTBEAT = 6
    PONG = 7
    HISTORY = 8
    ATTACH = 16
    DETACH = 17
    PING = 18


_pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_u32 = struct.Struct("<I")


def array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _ext_header(ext_type: int, length: int) -> bytes:
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}.get(length)
    if fixed is not None:
        return bytes((fixed, ext_type))
    if length < 0x100:
        return bytes((0xC7, length, ext_type))
    if length < 0x10000:
        return b"\xc8" + length.to_bytes(2, "big") + bytes((ext_type,))
    return b"\xc9" + length.to_bytes(4, "big") + bytes((ext_type,))


def _ndarray_parts(arr: np.ndarray[Any, Any]) -> list[bytes | memoryview]:
    """ext type 1: dtype, ndim, dims, raw little-endian data; the data is not copied here."""
    dt = arr.dtype
    if dt == np.bool_:
        arr, dt = arr.view(np.uint8), np.dtype(np.uint8)
    le = dt.newbyteorder("<")
    code = _DTYPE_CODE.get(le)
    if code is None:
        raise TypeError(f"no wire dtype for {dt}")
    if dt != le or not arr.flags.c_contiguous:
        # A byte-swapped or strided array needs one conversion; IOC data is normally neither.
        arr = np.ascontiguousarray(arr, dtype=le)
    head = bytes((code, arr.ndim)) + b"".join(_u32.pack(d) for d in arr.shape)
    # A memoryview of the array, not a copy; a view with a zero in its shape cannot be cast.
    data = arr.data.cast("B") if arr.size else memoryview(b"")
    return [_ext_header(NDARRAY_EXT, len(head) + data.nbytes), head, data]


# Values msgpack packs exactly as PROTOCOL.md section 4 says, with no conversion (bool excluded:
# type(True) is bool, not int).
PLAIN_TYPES = frozenset((float, int, str, type(None)))


# PROTOCOL.md section 4: a value holds at most this many levels of arrays and maps; clients
# refuse a deeper one (and would reconnect to meet it again), so the channel fails instead.
MAX_VALUE_DEPTH = integer("max_value_depth")


def _value_parts(value: Value, parts: list[bytes | memoryview], level: int = 0) -> None:
    if type(value) in PLAIN_TYPES:
        parts.append(_pack(value))  # the common case first: one type test
    elif isinstance(value, bool | np.bool_):
        parts.append(_pack(int(value)))  # PROTOCOL.md section 4: booleans travel as 0/1
    elif isinstance(value, np.ndarray):
        parts.extend(_ndarray_parts(value))
    elif isinstance(value, dict | list) and level >= MAX_VALUE_DEPTH:
        raise ValueError(f"value nested deeper than {MAX_VALUE_DEPTH} arrays and maps")
    elif isinstance(value, dict):
        parts.append(_map_header(len(value)))
        for k, v in value.items():
            parts.append(_pack(k))
            _value_parts(v, parts, level + 1)
    elif isinstance(value, list):
        # An array of str (one pack call), or of values (structure and union arrays).
        if all(type(x) is str for x in value):
            parts.append(_pack(value))
        else:
            parts.append(array_header(len(value)))
            for x in value:
                _value_parts(x, parts, level + 1)
    elif isinstance(value, np.generic):
        parts.append(_pack(value.item()))
    else:
        parts.append(_pack(value))


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x80 | n,))
    if n < 0x10000:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


def pack_value(value: Value) -> bytes:
    """One value alone, as it appears in an entry (PROTOCOL.md section 4)."""
    parts: list[bytes | memoryview] = []
    _value_parts(value, parts)
    return b"".join(parts)


class EntryBody(NamedTuple):
    """An entry without its sid: `length` array elements (sid included) and the bytes after sid.
    `array_at` is where the data of its ndarray (the largest, if several) starts in `data`, 0 for
    none: frames pad before the entry so that this data lands on a multiple of 8 (`Entries`).

    A NamedTuple rather than a frozen dataclass: one is built per changed channel per tick, and a
    frozen dataclass's __init__ cost more than the encoding itself."""

    length: int
    data: bytes
    array_at: int = 0


def encode_entry_body(
    mask: int,
    *,
    value: Value = None,
    serial: int = 0,
    seconds: int = 0,
    nanoseconds: int = 0,
    severity: int = 0,
    status: int = 0,
    message: str = "",
    metadata: dict[str, Any] | None = None,
    state: int = 0,
    reason: str = "",
) -> EntryBody:
    """The shared part of an entry: mask, then the fields its bits select, in bit order."""
    if type(value) in PLAIN_TYPES or not mask & VALUE:
        # Fast path (every scalar update): pack the fields as one array and drop its one-byte
        # fixarray header; MessagePack arrays are their elements' encodings back to back, so the
        # bytes are exactly those of packing each field in turn (at most 11 fields < 16).
        items: list[Any] = [mask]
        if mask & VALUE:
            items += (value, serial)
        if mask & TIME:
            items += (seconds, nanoseconds)
        if mask & ALARM:
            items += (severity, status, message)
        if mask & META:
            items.append(metadata or {})
        if mask & CONN:
            items += (state, reason)
        return EntryBody(len(items) + 1, _pack(items)[1:])
    parts: list[bytes | memoryview] = [_pack(mask)]
    length = 2
    if mask & VALUE:
        _value_parts(value, parts)
        parts.append(_pack(serial))
        length += 2
    if mask & TIME:
        parts.append(_pack(seconds))
        parts.append(_pack(nanoseconds))
        length += 2
    if mask & ALARM:
        parts.append(_pack(severity))
        parts.append(_pack(status))
        parts.append(_pack(message))
        length += 3
    if mask & META:
        parts.append(_pack(metadata or {}))
        length += 1
    if mask & CONN:
        parts.append(_pack(state))
        parts.append(_pack(reason))
        length += 2
    return EntryBody(length, b"".join(parts), _largest_array_at(parts))


def _largest_array_at(parts: list[bytes | memoryview]) -> int:
    """Where the largest ndarray's data starts in the joined `parts` (only ndarray data is a
    memoryview there), or 0 when there is none with data."""
    at = pos = size = 0
    for p in parts:
        n = len(p)
        if n > size and type(p) is memoryview:
            at, size = pos, n
        pos += n
    return at


_VALUE_TIME = VALUE | TIME


# The tuple constructor itself: a NamedTuple's own __new__ is a Python function, one more frame
# for the body of every update.
_new_body = tuple.__new__


def encode_update_body(value: Value, serial: int, seconds: int, nanoseconds: int) -> EntryBody:
    """`encode_entry_body(VALUE | TIME, ...)` for a plain scalar value (float, int, str, None):
    the body of almost every update, packed in one call."""
    data = _pack((_VALUE_TIME, value, serial, seconds, nanoseconds))[1:]
    return _new_body(EntryBody, (6, data, 0))  # every field: __new__'s defaults are skipped


_SID_CACHE = [_pack(i) for i in range(4096)]
# An entry has at most 12 elements: a fixarray header, looked up rather than built.
_FIXARRAY = [bytes((0x90 | n,)) for n in range(16)]


def entry(sid: int, body: EntryBody) -> bytes:
    """A complete entry `[sid, mask, field...]` from a shared body."""
    sid_bytes = _SID_CACHE[sid] if sid < 4096 else _pack(sid)
    n = body.length
    return (_FIXARRAY[n] if n < 16 else array_header(n)) + sid_bytes + body.data


class Entries(NamedTuple):
    """The elements of an `entries` array (SNAPSHOT, DATA groups): `length` entries spliced
    once and shared by every frame that carries them; the frame adds the array header.

    `arrays` holds, for each entry with ndarray data, (where the entry starts, where its array's
    data starts) in `data`. A frame inserts 0-7 nil items before such an entry so that the data
    starts at a multiple of 8 bytes from the start of the message (PROTOCOL.md sections 3, 4.1): a
    client can then view it in place, where misaligned float64 data cost a copy of the array
    (bench/README.md). The offset depends on each client's frame prefix (`seq`, `att`, groups
    before it), so it is done per frame, never in the shared bytes."""

    length: int  # entries
    head: bytes  # the array header for `length` items: the frame's header when nothing is padded
    data: bytes
    arrays: tuple[tuple[int, int], ...] = ()


_array_at = attrgetter("array_at")


def encode_entries(sids: Sequence[int], bodies: Sequence[EntryBody]) -> Entries:
    """The entries `[sid, body]` for each pair, with where their arrays' data lies."""
    encoded = list(map(entry, sids, bodies))
    data = b"".join(encoded)
    # One C-level pass over the bodies; the walk below only runs when an entry holds an array.
    n = len(encoded)
    if not any(map(_array_at, bodies)):
        return Entries(n, array_header(n), data)
    arrays = []
    pos = 0
    for e, body in zip(encoded, bodies, strict=True):
        if body.array_at:
            arrays.append((pos, pos + len(e) - len(body.data) + body.array_at))
        pos += len(e)
    return Entries(n, array_header(n), data, tuple(arrays))


_NILS = tuple(b"\xc0" * n for n in range(8))


def _entries_parts(at: int, entries: Entries, parts: list[bytes | memoryview]) -> int:
    """Append `entries` as a MessagePack array starting at byte `at` of the message, with the
    nil padding that aligns its arrays' data; return the offset after it."""
    arrays = entries.arrays
    if not arrays:
        parts.append(entries.head)
        parts.append(entries.data)
        return at + len(entries.head) + len(entries.data)
    # The header's width must be known before the padding; take the width of the largest count
    # the padding could make (a wider header than needed is valid MessagePack).
    most = entries.length + 7 * len(arrays)
    width = 1 if most < 16 else 3 if most < 0x10000 else 5
    pos = at + width
    pads = []
    for _, data_at in arrays:
        pad = -(pos + data_at) & 7
        pads.append(pad)
        pos += pad
    count = entries.length + sum(pads)
    if width == 1:
        parts.append(bytes((0x90 | count,)))
    elif width == 3:
        parts.append(b"\xdc" + count.to_bytes(2, "big"))
    else:
        parts.append(b"\xdd" + count.to_bytes(4, "big"))
    data = memoryview(entries.data)
    prev = 0
    for (start, _), pad in zip(arrays, pads, strict=True):
        if pad:
            parts.append(data[prev:start])
            parts.append(_NILS[pad])
            prev = start
    parts.append(data[prev:])
    return pos + len(data)


def encode_hello(server: str, tick_ms: int, heartbeat_ms: int, max_in_bytes: int) -> bytes:
    return _pack([Kind.HELLO, PROTOCOL_VERSION, server, tick_ms, heartbeat_ms, max_in_bytes])


def encode_attached(req: int, att: int, ids: Sequence[str]) -> bytes:
    return _pack([Kind.ATTACHED, req, att, list(ids)])


def encode_snapshot(seq: int, att: int, entries: Entries, aligned: bool = True) -> bytes:
    """SNAPSHOT; `aligned`: with the nil padding (for clients that offered it, PROTOCOL.md 1)."""
    head = b"\x94" + _pack(Kind.SNAPSHOT) + _pack(seq) + _pack(att)
    if not aligned:
        return head + entries.head + entries.data
    parts: list[bytes | memoryview] = [head]
    _entries_parts(len(head), entries, parts)
    return b"".join(parts)


def encode_data(seq: int, groups: Sequence[tuple[int, Entries]], aligned: bool = True) -> bytes:
    """DATA from (att, entries) pairs. The caller never passes an empty list. `aligned`: with the
    nil padding (for clients that offered it, PROTOCOL.md section 1)."""
    head = b"\x93\x03" + _pack(seq) + array_header(len(groups))
    parts: list[bytes | memoryview] = [head]
    for att, entries in groups:
        if aligned and entries.arrays:
            return _aligned_data(head, groups)
        # No arrays (the common case): no offsets to follow.
        parts.append(b"\x92")
        parts.append(_SID_CACHE[att] if att < 4096 else _pack(att))
        parts.append(entries.head)
        parts.append(entries.data)
    return b"".join(parts)


def _aligned_data(head: bytes, groups: Sequence[tuple[int, Entries]]) -> bytes:
    parts: list[bytes | memoryview] = [head]
    at = len(head)
    for att, entries in groups:
        group = b"\x92" + (_SID_CACHE[att] if att < 4096 else _pack(att))
        parts.append(group)
        at = _entries_parts(at + len(group), entries, parts)
    return b"".join(parts)


# HISTORY's columns: (name, wire dtype), in message order (PROTOCOL.md section 2.8).
HISTORY_COLUMNS = (
    ("t", "<i8"), ("value", "<f8"), ("min", "<f8"), ("max", "<f8"),
    ("severity", "u1"), ("status", "<u2"), ("gap", "u1"),
)  # fmt: skip


class GapKind:
    """The `status` of a HISTORY row whose `gap` is 1: why no update is there (section 2.8)."""

    AWAY = 0  # the channel went away here (disconnected, or no longer monitored)
    LEFT_OUT = 1  # the backfill left out this channel's rows from here to the snapshot
    SEAM = 2  # the updates from here to the next row are in no row (buckets, then points)
    ARCHIVE = 3  # the archive's part from here to the next row could not be read (`reason`)


def encode_history(
    att: int, sid: int, resolution: int, columns: Sequence[Any], reason: str | None = None
) -> bytes:
    """HISTORY `[8, att, sid, resolution, columns]`: `columns` holds the 7 arrays of
    HISTORY_COLUMNS in order, each preceded by the nil items (0-7) that put its data on a
    multiple of 8 bytes from the message's start, as entries are padded (section 3). An array
    channel's value, min and max are 2-D, [rows, elements], and go as they are (section 2.8).
    `reason`: why the rows end in a gap (`[8, att, sid, resolution, columns, reason]`), when the
    gap is a part that could not be had (the archive's)."""
    head = (b"\x96" if reason is not None else b"\x95") + _pack(Kind.HISTORY) + _pack(att)
    head += _pack(sid) + _pack(resolution)
    # Array 16 header: wide enough for the most items the padding can make (7 + 7 x 7).
    pos = len(head) + 3
    parts: list[bytes | memoryview] = [head, b""]
    count = 0
    for column, (_, dt) in zip(columns, HISTORY_COLUMNS, strict=True):
        ext, info, data = _ndarray_parts(np.ascontiguousarray(column, dtype=dt))
        pad = -(pos + len(ext) + len(info)) & 7
        parts += (_NILS[pad], ext, info, data)
        pos += pad + len(ext) + len(info) + len(data)
        count += pad + 1
    parts[1] = b"\xdc" + count.to_bytes(2, "big")
    if reason is not None:
        parts.append(_pack(reason))
    return b"".join(parts)


def encode_detached(req: int | None, att: int) -> bytes:
    return _pack([Kind.DETACHED, req, att])


def encode_error(req: int | None, code: int, message: str) -> bytes:
    return _pack([Kind.ERROR, req, code, message])


HEARTBEAT = _pack([Kind.HEARTBEAT])


def encode_pong(nonce: object) -> bytes:
    return _pack([Kind.PONG, nonce])


# --- client to server -------------------------------------------------------------------------


class BadMessage(ValueError):
    """A client message that breaks PROTOCOL.md; the text is sent back in ERROR 4400.

    `req` is the message's req when it could be read (PROTOCOL.md section 6: the second element
    of an array whose kind is not PING, when it is an unsigned integer), so the client's pending
    request gets its answer; else None.
    """

    def __init__(self, message: str, req: int | None = None) -> None:
        super().__init__(message)
        self.req = req


@dataclass(frozen=True, slots=True)
class Attach:
    req: int
    token: str
    # Per channel of the token, the time (ns) of the newest backfill row the client holds, 0
    # for none (PROTOCOL.md section 2.8); None: not said, the whole backfill is sent.
    since: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Detach:
    req: int
    att: int


@dataclass(frozen=True, slots=True)
class Ping:
    nonce: int | str


ClientMessage = Attach | Detach | Ping

_NAMES = {Kind.ATTACH: "ATTACH", Kind.DETACH: "DETACH", Kind.PING: "PING"}


def decode_client_message(data: bytes) -> ClientMessage:
    """Parse one client message. The size limit is enforced by the transport before this."""
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except msgpack.ExtraData as exc:
        raise BadMessage(
            "trailing bytes after the MessagePack value", _readable_req(exc.unpacked)
        ) from None
    except UnicodeDecodeError:
        # PROTOCOL.md section 1: every str is UTF-8. The req is still echoed (section 6).
        raise BadMessage(
            "a MessagePack str is not valid UTF-8", _readable_req(_lenient(data))
        ) from None
    except ValueError as exc:
        if "map key" not in str(exc):
            raise BadMessage(f"not a MessagePack value: {exc}") from None
        # PROTOCOL.md section 1: every map has str keys, wherever it is in the message.
        raise BadMessage(
            "a MessagePack map with a key that is not a str", _readable_req(_lenient(data))
        ) from None
    except (TypeError, msgpack.UnpackException) as exc:
        raise BadMessage(f"not a MessagePack value: {exc}") from None
    if not isinstance(msg, list) or not msg or type(msg[0]) is not int:
        raise BadMessage("a message must be an array starting with an integer kind")
    kind = msg[0]
    if kind == Kind.PING:
        if len(msg) < 2:
            raise BadMessage("PING is [18, nonce]")
        nonce = msg[1]
        if type(nonce) is not int and not isinstance(nonce, str):
            raise BadMessage(
                f"PING nonce must be an integer or a string, got {type(nonce).__name__}"
            )
        return Ping(nonce)
    req = _readable_req(msg)
    if kind not in _NAMES:
        raise BadMessage(
            f"unknown message kind {kind} (client kinds are 16 ATTACH, 17 DETACH, 18 PING)", req
        )
    if len(msg) < 3 or req is None:
        raise BadMessage(f"{_NAMES[kind]} needs an unsigned integer req as its second element", req)
    if kind == Kind.ATTACH:
        if not isinstance(msg[2], str):
            raise BadMessage("ATTACH is [16, req, token] with a string token", req)
        since = msg[3] if len(msg) > 3 else None
        if since is None:
            return Attach(req, msg[2])
        if not isinstance(since, list) or not all(_is_uint(t) for t in since):
            raise BadMessage(
                "ATTACH's since is an array of unsigned integers, one per channel (or nil)", req
            )
        return Attach(req, msg[2], tuple(since))
    if not _is_uint(msg[2]):
        raise BadMessage("DETACH is [17, req, att] with an unsigned integer att", req)
    return Detach(req, msg[2])


def _lenient(data: bytes) -> object:
    """The message read with no rule but MessagePack's own (str as bytes, any map key, trailing
    bytes ignored), only to find its req for the ERROR; None if even that fails."""
    unpacker = msgpack.Unpacker(raw=True, strict_map_key=False, use_list=True)
    unpacker.feed(data)
    try:
        return unpacker.unpack()
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


def _readable_req(msg: object) -> int | None:
    """The req of a (possibly malformed) message: element 1 of an array whose kind is an integer
    other than PING, when it is an unsigned integer."""
    if (
        isinstance(msg, list)
        and len(msg) >= 2
        and type(msg[0]) is int
        and msg[0] != Kind.PING
        and _is_uint(msg[1])
    ):
        req: int = msg[1]
        return req
    return None


def _is_uint(x: object) -> bool:
    return type(x) is int and x >= 0
