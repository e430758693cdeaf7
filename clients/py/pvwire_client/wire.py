"""The pvwire stream protocol (protocol/PROTOCOL.md), as pure functions: bytes in, messages out.

No I/O here. Everything the server sends is validated at this boundary; anything that does not
follow the spec raises :class:`ProtocolError` naming what was wrong, so the layers above only ever
see well-formed, typed messages.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import msgpack
import numpy as np
import numpy.typing as npt

from . import msgview
from .entry import ALARM, CONN, KNOWN_MASK, META, TIME, VALUE, Entry
from .errors import ProtocolError

__all__ = [
    "ALARM",
    "CONN",
    "KNOWN_MASK",
    "META",
    "TIME",
    "VALUE",
    "Attached",
    "Data",
    "Detached",
    "Entry",
    "Error",
    "Group",
    "Heartbeat",
    "Hello",
    "History",
    "Message",
    "Pong",
    "ProtocolError",
    "Snapshot",
    "Unknown",
    "decode_message",
    "encode_attach",
    "encode_detach",
    "encode_ndarray",
    "encode_ping",
    "entry_from_list",
]

# How many elements each mask bit adds to an entry (section 3).
_ELEMENTS = ((VALUE, 2), (TIME, 2), (ALARM, 3), (META, 1), (CONN, 2))
# An entry's length by its mask, for every mask of known bits.
_ENTRY_LENGTH = tuple(
    2 + sum(n for bit, n in _ELEMENTS if mask & bit) for mask in range(KNOWN_MASK + 1)
)

NDARRAY_EXT = 1
# dtype codes of the ndarray ext (section 4.1), all little-endian on the wire.
DTYPES: tuple[np.dtype[Any], ...] = tuple(
    np.dtype(s) for s in ("i1", "u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8")
)
_DTYPE_CODES = {dt: code for code, dt in enumerate(DTYPES)}


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    server: str
    tick_ms: int
    heartbeat_ms: int
    max_in_bytes: int


@dataclass(frozen=True, slots=True)
class Attached:
    req: int
    att: int
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """``raw`` holds the validated ``[sid, mask, field...]`` arrays as received (section 3);
    ``entries`` the same as :class:`Entry` objects, built on first use."""

    seq: int
    att: int
    raw: tuple[list[Any], ...]
    _entries: tuple[Entry, ...] | None = field(default=None, repr=False, compare=False)

    @property
    def entries(self) -> tuple[Entry, ...]:
        if self._entries is None:
            object.__setattr__(self, "_entries", tuple(map(entry_from_list, self.raw)))
        assert self._entries is not None
        return self._entries


@dataclass(frozen=True, slots=True)
class Group:
    """One attachment's entries of a DATA message: ``raw`` and ``entries`` as in Snapshot."""

    att: int
    raw: tuple[list[Any], ...]
    _entries: tuple[Entry, ...] | None = field(default=None, repr=False, compare=False)

    @property
    def entries(self) -> tuple[Entry, ...]:
        if self._entries is None:
            object.__setattr__(self, "_entries", tuple(map(entry_from_list, self.raw)))
        assert self._entries is not None
        return self._entries


@dataclass(frozen=True, slots=True)
class Data:
    seq: int
    groups: tuple[Group, ...]


@dataclass(frozen=True, slots=True)
class Detached:
    req: int | None
    att: int


@dataclass(frozen=True, slots=True)
class Error:
    req: int | None
    code: int
    message: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    nonce: int | str


@dataclass(frozen=True, slots=True)
class History:
    """Recorded past of one channel of an attachment, sent before its snapshot when the
    subscription asked for ``backfill`` (section 2.8): columns of one length, oldest first.

    ``resolution`` 0: every update as it came (``min`` = ``max`` = ``value``); else buckets of
    that many ns starting at ``t``, ``value`` the last in the bucket. ``gap`` 1 marks a row with
    no update (value NaN; ``status`` says why: 0 the channel was away, 1 the backfill left its
    rows out from there to the snapshot, 2 updates in no row): a plot breaks its line there.
    An array channel's ``value``,
    ``min`` and ``max`` are 2-D, a row of elements per row (``min``/``max`` element-wise)."""

    att: int
    sid: int
    resolution: int
    t: npt.NDArray[np.int64]  # ns since the POSIX epoch, IOC time
    value: npt.NDArray[np.float64]
    min: npt.NDArray[np.float64]
    max: npt.NDArray[np.float64]
    severity: npt.NDArray[np.uint8]
    status: npt.NDArray[np.uint16]
    gap: npt.NDArray[np.uint8]
    # Why the rows end in a gap, when that gap is a part the server could not have (the
    # archive behind its history: the archiver down, too slow...); None: not said.
    reason: str | None = None

    def rows(self, start: int, stop: int) -> History:
        """Rows [start, stop) of these, as one message's (views of its columns)."""
        if start == 0 and stop == len(self.t):
            return self
        cut = slice(start, stop)
        return dataclasses.replace(
            self, t=self.t[cut], value=self.value[cut], min=self.min[cut], max=self.max[cut],
            severity=self.severity[cut], status=self.status[cut], gap=self.gap[cut],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Unknown:
    """A kind this client does not know; the spec says to ignore it (section 1)."""

    kind: int


Message: TypeAlias = (
    Hello | Attached | Snapshot | Data | Detached | Error | Heartbeat | Pong | History | Unknown
)


# --- decoding -------------------------------------------------------------------------------


def _ext_hook(code: int, payload: bytes) -> Any:
    if code != NDARRAY_EXT:
        raise ProtocolError(f"unknown MessagePack ext type {code}")
    return decode_ndarray(payload)


def _view_ext_hook(code: int, payload: memoryview) -> Any:
    """msgview's ext hook: what ``_ext_hook`` gives msgpack, from a view of the message."""
    if code == NDARRAY_EXT:
        if len(payload) < VIEW_ARRAYS_FROM:
            # A small array gets its own bytes, as from msgpack: a view would keep the whole
            # (large) message alive for as long as the application keeps the small array.
            return decode_ndarray(bytes(payload))
        return decode_ndarray(payload)
    if code == -1:  # msgpack decodes its timestamp ext itself (ext_hook never sees it)
        return msgpack.Timestamp.from_bytes(bytes(payload))
    raise ProtocolError(f"unknown MessagePack ext type {code}")


def decode_ndarray(payload: bytes | memoryview) -> npt.NDArray[Any]:
    """The ndarray ext payload (section 4.1) as a numpy view over ``payload``, read-only when
    ``payload`` is (a ``bytes``, or the read-only memoryview msgview passes)."""
    if len(payload) < 2:
        raise ProtocolError(f"ndarray ext of {len(payload)} bytes: shorter than its 2-byte header")
    code, ndim = payload[0], payload[1]
    if code >= len(DTYPES):
        raise ProtocolError(f"ndarray has bad dtype code {code} (known: 0-{len(DTYPES) - 1})")
    header = 2 + 4 * ndim
    if len(payload) < header:
        raise ProtocolError(
            f"ndarray with ndim {ndim} needs {header} header bytes, has {len(payload)}"
        )
    dims = tuple(int.from_bytes(payload[2 + 4 * i : 6 + 4 * i], "little") for i in range(ndim))
    dtype = DTYPES[code]
    expected = math.prod(dims) * dtype.itemsize
    if len(payload) - header != expected:
        raise ProtocolError(
            f"ndarray length mismatch: dims {list(dims)} of {dtype.name} need {expected}"
            f" data bytes, got {len(payload) - header}"
        )
    return np.frombuffer(memoryview(payload)[header:], dtype=dtype).reshape(dims)


# Messages from this size on are read by msgview, whose ndarrays view the message itself; smaller
# ones by msgpack's C unpacker, whose ndarrays view a copy of their ext payload. Below it the copy
# saved is worth less than msgview's walk (decode_message of a one-image message: ~35 µs).
VIEWS_FROM = 256 * 1024
# Inside such a message, ndarrays of fewer bytes are copied out (so that they do not keep the
# message alive), larger ones are views.
VIEW_ARRAYS_FROM = 64 * 1024
# msgview's budget: a large message of many small entries (15,000 scalar channels is ~315 KB)
# goes to msgpack, which reads it 15 times faster, after a walk of this many items; 512 cost up
# to 0.8 ms more than msgpack's 11.6 ms for such a message. A SNAPSHOT entry of an image with
# its metadata is ~35 items.
_VIEW_MAX_ITEMS = 256


def decode_message(data: bytes | bytearray, *, views: bool | None = None) -> Message:
    """Decode one server message (one binary WebSocket message), validating it completely.

    ndarrays of at least 64 KiB in a message of at least 256 KiB are read-only views over
    ``data`` (``np.frombuffer``, no copy), so each keeps the whole message alive while it lives;
    other ndarrays view a copy of their own bytes. ``views`` forces the reader: True msgview
    (without its item budget; msgpack still reads what is nested deeper than msgview goes),
    False msgpack, None by size (tests compare the two).
    """
    obj = _unpack(data, views)
    if not isinstance(obj, list) or not obj:
        raise ProtocolError(f"message must be a non-empty array, got {type(obj).__name__}")
    kind = obj[0]
    if not _is_uint(kind):
        raise ProtocolError(f"message kind must be an unsigned integer, got {kind!r}")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        # Ignored only when well formed (section 1): the unpack above checked UTF-8, map keys
        # and ext types; bin is the one rule left, as it is checked in values elsewhere.
        _no_bin(obj, "message")
        return Unknown(kind)
    name, arity, fn = decoder
    if len(obj) < arity:
        raise ProtocolError(f"{name} needs {arity} elements, got {len(obj)}")
    return fn(obj)


def _unpack(data: bytes | bytearray, views: bool | None) -> Any:
    if views is None:
        views = len(data) >= VIEWS_FROM
        budget: int | None = _VIEW_MAX_ITEMS
    else:
        budget = None
    if views:
        try:
            return msgview.unpack(data, _view_ext_hook, max_items=budget)
        except ProtocolError:
            raise
        except msgview.TrailingBytes as e:
            raise ProtocolError(f"{e.count} trailing bytes after the message") from None
        except (ValueError, TypeError) as e:
            raise ProtocolError(
                f"not a valid MessagePack value ({type(e).__name__}: {e})"
            ) from None
        except (msgview.TooManyItems, msgview.TooDeep):
            pass  # beyond msgview's budget: msgpack reads it (copying its ndarrays)
    try:
        return msgpack.unpackb(data, raw=False, ext_hook=_ext_hook, strict_map_key=True)
    except ProtocolError:
        raise
    except msgpack.ExtraData as e:
        raise ProtocolError(f"{len(e.extra)} trailing bytes after the message") from None
    except (ValueError, TypeError, UnicodeDecodeError, msgpack.UnpackException) as e:
        # msgpack says "incomplete input" (truncation), invalid UTF-8, bad map keys, ...
        raise ProtocolError(f"not a valid MessagePack value ({type(e).__name__}: {e})") from None


def _is_uint(x: object) -> bool:
    return type(x) is int and x >= 0


def _no_bin(x: object, what: str) -> None:
    if isinstance(x, bytes):
        raise ProtocolError(f"{what}: MessagePack bin is not used (section 1)")
    if isinstance(x, list):
        for i, y in enumerate(x):
            _no_bin(y, f"{what}[{i}]")
    elif isinstance(x, dict):
        for k, y in x.items():
            _no_bin(k, f"{what} key")
            _no_bin(y, f"{what}.{k}")


def _uint(x: object, what: str) -> int:
    if not _is_uint(x):
        raise ProtocolError(f"{what} must be an unsigned integer, got {x!r}")
    assert isinstance(x, int)
    return x


def _opt_uint(x: object, what: str) -> int | None:
    return None if x is None else _uint(x, what)


def _str(x: object, what: str) -> str:
    if not isinstance(x, str):
        raise ProtocolError(f"{what} must be a string, got {type(x).__name__}")
    return x


def _list(x: object, what: str) -> list[Any]:
    if not isinstance(x, list):
        raise ProtocolError(f"{what} must be an array, got {type(x).__name__}")
    return x


def _hello(m: list[Any]) -> Hello:
    return Hello(
        _uint(m[1], "HELLO version"),
        _str(m[2], "HELLO server"),
        _uint(m[3], "HELLO tick_ms"),
        _uint(m[4], "HELLO heartbeat_ms"),
        _uint(m[5], "HELLO max_in_bytes"),
    )


def _attached(m: list[Any]) -> Attached:
    ids = _list(m[3], "ATTACHED ids")
    return Attached(
        _uint(m[1], "ATTACHED req"),
        _uint(m[2], "ATTACHED att"),
        tuple(_str(i, "ATTACHED id") for i in ids),
    )


def _snapshot(m: list[Any]) -> Snapshot:
    return Snapshot(
        _uint(m[1], "SNAPSHOT seq"), _uint(m[2], "SNAPSHOT att"), _entries(m[3], "SNAPSHOT")
    )


def _data(m: list[Any]) -> Data:
    groups = []
    for g in _list(m[2], "DATA groups"):
        g = _list(g, "DATA group")
        if len(g) != 2:
            raise ProtocolError(f"DATA group must be [att, entries], got {len(g)} elements")
        groups.append(Group(_uint(g[0], "DATA group att"), _entries(g[1], "DATA group")))
    return Data(_uint(m[1], "DATA seq"), tuple(groups))


def _nonce(x: object) -> int | str:
    if type(x) is int or isinstance(x, str):
        return x
    raise ProtocolError(f"PONG nonce must be an integer or a string, got {type(x).__name__}")


def _detached(m: list[Any]) -> Detached:
    return Detached(_opt_uint(m[1], "DETACHED req"), _uint(m[2], "DETACHED att"))


def _error(m: list[Any]) -> Error:
    return Error(
        _opt_uint(m[1], "ERROR req"), _uint(m[2], "ERROR code"), _str(m[3], "ERROR message")
    )


# HISTORY's columns in order, with their wire dtypes (section 2.8).
_HISTORY_COLUMNS: tuple[tuple[str, np.dtype[Any]], ...] = (
    ("t", np.dtype("<i8")), ("value", np.dtype("<f8")), ("min", np.dtype("<f8")),
    ("max", np.dtype("<f8")), ("severity", np.dtype("u1")), ("status", np.dtype("<u2")),
    ("gap", np.dtype("u1")),
)  # fmt: skip


def _history(m: list[Any]) -> History:
    # nil items are padding that aligns each column's data (section 2.8), not columns.
    columns = [c for c in _list(m[4], "HISTORY columns") if c is not None]
    if len(columns) != len(_HISTORY_COLUMNS):
        raise ProtocolError(f"HISTORY needs {len(_HISTORY_COLUMNS)} columns, got {len(columns)}")
    for c, (name, dt) in zip(columns, _HISTORY_COLUMNS, strict=True):
        # An array channel's value, min and max are 2-D: [rows, elements].
        ndims = (1, 2) if name in ("value", "min", "max") else (1,)
        if not isinstance(c, np.ndarray) or c.dtype != dt or c.ndim not in ndims:
            shape = " or ".join(f"{n}-D" for n in ndims)
            raise ProtocolError(f"HISTORY column {name} must be a {shape} {dt.name} ndarray")
        if len(c) != len(columns[0]):
            raise ProtocolError(f"HISTORY column {name} has {len(c)} rows, not {len(columns[0])}")
    if not columns[1].shape == columns[2].shape == columns[3].shape:
        raise ProtocolError(
            "HISTORY value, min and max must have the same dims, not "
            f"{list(columns[1].shape)}, {list(columns[2].shape)}, {list(columns[3].shape)}"
        )
    if len(columns[4]) and int(columns[4].max()) > 3:
        raise ProtocolError("HISTORY severity above 3")
    reason = m[5] if len(m) > 5 else None
    if reason is not None and not isinstance(reason, str):
        raise ProtocolError("HISTORY reason must be a string or nil")
    t, value, low, high, severity, status, gap = columns
    return History(
        _uint(m[1], "HISTORY att"),
        _uint(m[2], "HISTORY sid"),
        _uint(m[3], "HISTORY resolution"),
        t, value, low, high, severity, status, gap, reason,
    )  # fmt: skip


_DECODERS: dict[int, tuple[str, int, Callable[[list[Any]], Message]]] = {
    0: ("HELLO", 6, _hello),
    1: ("ATTACHED", 4, _attached),
    2: ("SNAPSHOT", 4, _snapshot),
    3: ("DATA", 3, _data),
    4: ("DETACHED", 3, _detached),
    5: ("ERROR", 4, _error),
    6: ("HEARTBEAT", 1, lambda m: Heartbeat()),
    7: ("PONG", 2, lambda m: Pong(_nonce(m[1]))),
    8: ("HISTORY", 5, _history),
}


def _entries(x: object, where: str) -> tuple[list[Any], ...]:
    # nil items are padding that aligns ndarray data (PROTOCOL.md section 3): not entries.
    return tuple([_checked(e, where) for e in _list(x, f"{where} entries") if e is not None])


def _checked(e: object, where: str) -> list[Any]:
    """One entry array, validated and returned as it is.

    The common shapes are checked inline: decode_entry took ~12 µs per entry (a dict, an Entry
    and a call per field), most of a client's CPU at 10,000 updates/s. Anything the inline checks
    do not accept goes through decode_entry, which names what is wrong.
    """
    if type(e) is list and len(e) >= 2:
        sid, mask = e[0], e[1]
        if (
            type(sid) is int
            and sid >= 0
            and type(mask) is int
            and 0 <= mask <= KNOWN_MASK
            and len(e) == _ENTRY_LENGTH[mask]
        ):
            ok, i = True, 2
            if mask & VALUE:
                v, serial = e[2], e[3]
                t = type(v)
                if not (t is float or t is int or t is str or v is None or t is np.ndarray):
                    _value(v, "entry value")  # structures and arrays of values: raises if bad
                ok, i = type(serial) is int and serial >= 0, 4
            if ok and mask & TIME:
                sec, ns = e[i], e[i + 1]
                ok = type(sec) is int and type(ns) is int and sec >= 0 and 0 <= ns < 1_000_000_000
                i += 2
            if ok and mask & ALARM:
                sev, status, message = e[i], e[i + 1], e[i + 2]
                ok = type(sev) is int and 0 <= sev <= 3 and type(status) is int and status >= 0
                ok = ok and type(message) is str
                i += 3
            if ok and mask & META:
                ok = type(e[i]) is dict
                if ok:
                    _metadata(e[i], "entry metadata")  # raises if a known key is of a wrong type
                i += 1
            if ok and mask & CONN:
                ok = type(e[i]) is int and e[i] >= 0 and type(e[i + 1]) is str
            if ok:
                return e
    decode_entry(e, where)  # raises, naming the problem (the inline checks mirror it)
    return _list(e, f"{where} entry")


def entry_from_list(e: list[Any]) -> Entry:
    """An :class:`Entry` from an array :func:`decode_message` validated (``Group.raw``)."""
    mask = e[1]
    value = serial = seconds = ns = severity = status = message = md = state = reason = None
    i = 2
    if mask & VALUE:
        value, serial, i = e[2], e[3], 4
    if mask & TIME:
        seconds, ns, i = e[i], e[i + 1], i + 2
    if mask & ALARM:
        severity, status, message, i = e[i], e[i + 1], e[i + 2], i + 3
    if mask & META:
        md, i = e[i], i + 1
    if mask & CONN:
        state, reason = e[i], e[i + 1]
    return Entry(
        e[0], mask, value, serial, seconds, ns, severity, status, message, md, state, reason
    )


def decode_entry(e: object, where: str = "entry") -> Entry:
    """Validate one decoded ``[sid, mask, field...]`` array (section 3)."""
    e = _list(e, f"{where} entry")
    if len(e) < 2:
        raise ProtocolError(f"{where} entry needs at least [sid, mask], got {len(e)} elements")
    sid = _uint(e[0], "entry sid")
    mask = _uint(e[1], "entry mask")
    if mask & ~KNOWN_MASK:
        raise ProtocolError(f"entry mask {mask:#x} has unknown bits {mask & ~KNOWN_MASK:#x}")
    expected = 2 + sum(n for bit, n in _ELEMENTS if mask & bit)
    if len(e) != expected:
        raise ProtocolError(
            f"entry element count mismatch: mask {mask} needs {expected} elements, got {len(e)}"
        )
    f: dict[str, Any] = {}
    i = 2
    if mask & VALUE:
        f["value"] = _value(e[i], "entry value")
        f["serial"] = _uint(e[i + 1], "entry serial")
        i += 2
    if mask & TIME:
        f["seconds"] = _uint(e[i], "entry seconds")
        ns = _uint(e[i + 1], "entry nanoseconds")
        if ns >= 1_000_000_000:
            raise ProtocolError(f"entry nanoseconds {ns} not below 10^9")
        f["nanoseconds"] = ns
        i += 2
    if mask & ALARM:
        sev = _uint(e[i], "entry severity")
        if sev > 3:
            raise ProtocolError(f"entry severity {sev} not in 0-3")
        f["severity"] = sev
        f["status"] = _uint(e[i + 1], "entry status")
        f["message"] = _str(e[i + 2], "entry alarm message")
        i += 3
    if mask & META:
        md = e[i]
        if not isinstance(md, dict):
            raise ProtocolError(f"entry metadata must be a map, got {type(md).__name__}")
        f["metadata"] = _metadata(md, "entry metadata")
        i += 1
    if mask & CONN:
        f["state"] = _uint(e[i], "entry state")  # unknown numbers: see state.py
        f["reason"] = _str(e[i + 1], "entry reason")
    return Entry(sid, mask, **f)


def _is_number(x: object) -> bool:
    return type(x) is float or type(x) is int


def _limits(x: object, what: str) -> object:
    if type(x) is not list or len(x) != 2 or not all(map(_is_number, x)):
        raise ProtocolError(f"{what} must be [low, high] numbers, got {x!r}")
    return x


def _int(x: object, what: str) -> int:
    if type(x) is not int:
        raise ProtocolError(f"{what} must be an integer, got {x!r}")
    return x


def _bool(x: object, what: str) -> bool:
    if type(x) is not bool:
        raise ProtocolError(f"{what} must be a boolean, got {x!r}")
    return x


def _choices(x: object, what: str) -> object:
    for i, c in enumerate(_list(x, what)):
        _str(c, f"{what}[{i}]")
    return x


def _reduced(x: object, what: str) -> object:
    if not isinstance(x, dict):
        raise ProtocolError(f"{what} must be a map, got {type(x).__name__}")
    _str(x.get("method"), f"{what}.method")
    for i, d in enumerate(_list(x.get("from"), f"{what}.from")):
        _uint(d, f"{what}.from[{i}]")
    if "step" in x:
        _uint(x["step"], f"{what}.step")
    return x


# Section 5's keys and their types: a known key of another type is malformed (an unknown key is
# kept as it came). The TypeScript client's META_CHECKS is the same table.
_META_CHECKS: dict[str, Callable[[object, str], object]] = {
    "type": _str, "description": _str, "units": _str, "form": _str, "colorMode": _str,
    "count": _uint, "precision": _int,
    "display": _limits, "control": _limits, "alarm": _limits, "warning": _limits,
    "choices": _choices, "writable": _bool, "reduced": _reduced,
}  # fmt: skip


def _metadata(md: dict[str, Any], what: str) -> dict[str, Any]:
    for key, check in _META_CHECKS.items():
        if key in md:
            check(md[key], f"{what}.{key}")
    return md


# Deepest nesting of structures and arrays a value may have (the TypeScript client's bound too):
# the value's own outermost array or map is level 1, and 64 levels are allowed (section 4).
MAX_VALUE_DEPTH = 64


def _value(v: object, what: str, depth: int = 0) -> Any:
    """Check a value follows section 4: scalars, str, nil, ndarray, arrays, structures."""
    if v is None or isinstance(v, str | float | np.ndarray):
        return v
    if type(v) is int:
        return v
    if isinstance(v, bool):
        raise ProtocolError(f"{what}: booleans travel as integers 0/1, got {v!r}")
    if depth >= MAX_VALUE_DEPTH:
        raise ProtocolError(f"{what}: nested deeper than {MAX_VALUE_DEPTH}")
    if isinstance(v, list):
        # An array of str (string arrays), or of values (structure and union arrays).
        if not all(type(x) is str for x in v):
            for i, x in enumerate(v):
                _value(x, f"{what}[{i}]", depth + 1)
        return v
    if isinstance(v, dict):
        for k, x in v.items():
            _value(x, f"{what}.{k}", depth + 1)
        return v
    raise ProtocolError(f"{what}: unsupported value type {type(v).__name__}")


# --- encoding (client messages, and a reference ndarray encoder for tests and tools) ----------


def _pack(obj: list[Any]) -> bytes:
    out = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(out, bytes)
    return out


def _check_req(req: int) -> None:
    if type(req) is not int or req < 0:
        raise ValueError(f"req must be an unsigned integer, got {req!r}")


def encode_attach(req: int, token: str, since: Sequence[int] | None = None) -> bytes:
    """``[16, req, token]``: attach a token from the GraphQL ``subscribe`` mutation.

    ``since``: per channel of the token, the time (ns) after which the client lacks rows (its
    newest, or just before a hole: :mod:`pvwire_client.held`), 0 for none; the server then sends
    only later backfill rows (``[16, req, token, since]``, section 2.8)."""
    _check_req(req)
    if since is None:
        return _pack([16, req, token])
    if any(type(t) is not int or t < 0 for t in since):
        raise ValueError("since holds times in ns, unsigned integers")
    return _pack([16, req, token, list(since)])


def encode_detach(req: int, att: int) -> bytes:
    """``[17, req, att]``: end an attachment."""
    _check_req(req)
    _check_req(att)
    return _pack([17, req, att])


def encode_ping(nonce: int | str) -> bytes:
    """``[18, nonce]``: the server answers ``PONG`` with the same nonce, in order."""
    if type(nonce) is not int and not isinstance(nonce, str):
        raise ValueError(f"a PING nonce is an integer or a string, got {nonce!r}")
    return _pack([18, nonce])


def encode_ndarray(a: npt.NDArray[Any]) -> msgpack.ExtType:
    """The ndarray ext of section 4.1 (what the server sends); used by tests and tools."""
    dt = a.dtype.newbyteorder("<") if a.dtype.itemsize > 1 else a.dtype
    code = _DTYPE_CODES.get(dt)
    if code is None:
        raise ValueError(f"dtype {a.dtype} has no ndarray code")
    head = bytes([code, a.ndim]) + b"".join(int(d).to_bytes(4, "little") for d in a.shape)
    return msgpack.ExtType(NDARRAY_EXT, head + np.ascontiguousarray(a, dtype=dt).tobytes())
