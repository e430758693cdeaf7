"""The Archiver Appliance's PB/HTTP format, as `getData.raw` sends it: lines of protobuf messages
(EPICSEvent.proto), each escaped so that it holds no 0x0A (0x1B -> 1B 01, 0x0A -> 1B 02, 0x0D ->
1B 03) and ended by 0x0A; a chunk is a `PayloadInfo` line (the type, the PV, the year) and then
one line per sample, its time in seconds into that year (UTC); chunks are separated by an empty
line, a new one at each year and each PV.

Written here, not with the `protobuf` library: the messages are flat (one nested message, a
name and a value), the encoder writes straight from the history's columns without a message
object per sample, and the reader bounds what it accepts before it allocates anything, as
every parser of network input in pvwire does. tests/test_aa_pb.py checks both directions
against the independent protobuf classes of PyPI's `epicsarchiver-retrieval-client`.

Encoding: `payload_info` and `sample` give one escaped line with its newline; `chunk_break` is
the empty line between chunks. Reading: `PbReader.feed(bytes)` -> events (`Chunk` when a
`PayloadInfo` line starts one, then `Sample`s), `close()` at the end of the input; anything
malformed or past a bound raises `PbError` and the reader is spent."""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..limits import integer

__all__ = [
    "Chunk",
    "PayloadType",
    "PbError",
    "PbReader",
    "Sample",
    "chunk_break",
    "escape",
    "payload_info",
    "sample",
    "seconds_into_year",
    "unescape",
    "year_start",
]

NS = 1_000_000_000


class PayloadType(enum.IntEnum):
    """EPICSEvent.proto's `PayloadType`: which message each line of a chunk holds."""

    SCALAR_STRING = 0
    SCALAR_SHORT = 1
    SCALAR_FLOAT = 2
    SCALAR_ENUM = 3
    SCALAR_BYTE = 4
    SCALAR_INT = 5
    SCALAR_DOUBLE = 6
    WAVEFORM_STRING = 7
    WAVEFORM_SHORT = 8
    WAVEFORM_FLOAT = 9
    WAVEFORM_ENUM = 10
    WAVEFORM_BYTE = 11
    WAVEFORM_INT = 12
    WAVEFORM_DOUBLE = 13
    V4_GENERIC_BYTES = 14

    @property
    def vector(self) -> bool:
        return PayloadType.WAVEFORM_STRING <= self <= PayloadType.WAVEFORM_DOUBLE


class PbError(ValueError):
    """The bytes are not the Archiver Appliance's PB format, or go past a bound (the peer's
    error: h11's RemoteProtocolError)."""


# --- escaping -------------------------------------------------------------------------------

_ESC, _NL, _CR = b"\x1b", b"\n", b"\r"


def escape(message: bytes) -> bytes:
    """A message as one line's content: 0x1B first, so that its own escapes stay whole."""
    if _ESC in message:
        message = message.replace(_ESC, b"\x1b\x01")
    if _NL in message:
        message = message.replace(_NL, b"\x1b\x02")
    if _CR in message:
        message = message.replace(_CR, b"\x1b\x03")
    return message


def unescape(line: bytes) -> bytes:
    """A line's content as the message it escapes; PbError for an escape that is not one of the
    three (or ends the line)."""
    if _ESC not in line:
        return line
    out = bytearray()
    i, n = 0, len(line)
    while i < n:
        j = line.find(_ESC, i)
        if j < 0:
            out += line[i:]
            break
        out += line[i:j]
        if j + 1 >= n:
            raise PbError("a line ends inside an escape (0x1B)")
        code = line[j + 1]
        if code == 1:
            out += _ESC
        elif code == 2:
            out += _NL
        elif code == 3:
            out += _CR
        else:
            raise PbError(f"unknown escape 0x1B 0x{code:02X}")
        i = j + 2
    return bytes(out)


# --- times ----------------------------------------------------------------------------------

_DAYS_TO_1970 = 719_162  # from January 1st of year 1


def year_start(year: int) -> int:
    """POSIX seconds of January 1st of `year`, UTC (proleptic Gregorian), for any year: a
    peer's timestamp can lie past 9999, where `calendar.timegm` raises."""
    y = year - 1
    return (365 * y + y // 4 - y // 100 + y // 400 - _DAYS_TO_1970) * 86_400


def seconds_into_year(posix_seconds: int) -> tuple[int, int]:
    """(UTC year, seconds since its start) of a POSIX time."""
    year = _year_of(posix_seconds)
    return year, posix_seconds - year_start(year)


def _year_of(posix_seconds: int) -> int:
    # 365.2425 days a year on average: the estimate is at most one year off either way.
    year = 1970 + int(posix_seconds // 31_556_952)
    while year_start(year) > posix_seconds:
        year -= 1
    while year_start(year + 1) <= posix_seconds:
        year += 1
    return year


# --- encoding -------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    """A protobuf varint; a negative int32/int64 as its 64-bit two's complement (10 bytes)."""
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 31) if -(1 << 31) <= n < 1 << 31 else _range_error(n, "sint32")


def _range_error(n: int, kind: str) -> int:
    raise ValueError(f"{n} is out of range for {kind}")


def _string(tag: int, text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return _varint(tag) + _varint(len(data)) + data


_DOUBLE = struct.Struct("<d")
_FLOAT = struct.Struct("<f")
_INT = struct.Struct("<i")
_TAG_VAL_VARINT, _TAG_VAL_I64, _TAG_VAL_LEN, _TAG_VAL_I32 = 0x18, 0x19, 0x1A, 0x1D


def _scalar_value(ptype: PayloadType, value: Any) -> bytes:
    if ptype == PayloadType.SCALAR_DOUBLE:
        return b"\x19" + _DOUBLE.pack(value)
    if ptype == PayloadType.SCALAR_FLOAT:
        f = float(value)
        # A finite double beyond float's range is an OverflowError in struct: it reads as inf.
        if math.isfinite(f) and abs(f) > 3.4028234663852886e38:
            f = math.copysign(math.inf, f)
        return b"\x1d" + _FLOAT.pack(f)
    if ptype == PayloadType.SCALAR_INT:
        return b"\x1d" + _INT.pack(value)
    if ptype in (PayloadType.SCALAR_SHORT, PayloadType.SCALAR_ENUM):
        return b"\x18" + _varint(_zigzag(int(value)))
    if ptype == PayloadType.SCALAR_BYTE:
        return b"\x1a\x01" + bytes((int(value) & 0xFF,))
    if ptype == PayloadType.SCALAR_STRING:
        return _string(_TAG_VAL_LEN, str(value))
    raise ValueError(f"{ptype.name} is not a scalar type")


def _vector_value(ptype: PayloadType, value: Any) -> bytes:
    if ptype == PayloadType.WAVEFORM_STRING:
        return b"".join(_string(_TAG_VAL_LEN, str(v)) for v in value)
    if ptype == PayloadType.WAVEFORM_DOUBLE:
        data = np.asarray(value, "<f8").tobytes()
    elif ptype == PayloadType.WAVEFORM_FLOAT:
        with np.errstate(over="ignore"):
            data = np.asarray(value, np.float64).astype("<f4").tobytes()
    elif ptype == PayloadType.WAVEFORM_INT:
        data = np.asarray(value).astype("<i4").tobytes()
    elif ptype == PayloadType.WAVEFORM_BYTE:
        data = np.asarray(value).astype(np.int64).astype(np.uint8).tobytes()
    elif ptype in (PayloadType.WAVEFORM_SHORT, PayloadType.WAVEFORM_ENUM):
        data = b"".join(_varint(_zigzag(int(v))) for v in np.asarray(value).tolist())
    else:
        raise ValueError(f"{ptype.name} is not a vector type")
    return b"\x1a" + _varint(len(data)) + data


def _fields(tag: int, fields: Iterable[tuple[str, str]]) -> bytes:
    out = bytearray()
    for name, val in fields:
        inner = _string(0x0A, name) + _string(0x12, val)
        out += _varint(tag) + _varint(len(inner)) + inner
    return bytes(out)


def payload_info(
    ptype: PayloadType,
    pvname: str,
    year: int,
    element_count: int | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> bytes:
    """A chunk's first line: its `PayloadInfo`, escaped, with its newline."""
    msg = b"\x08" + _varint(int(ptype)) + _string(0x12, pvname) + b"\x18" + _varint(year)
    if element_count is not None:
        msg += b"\x20" + _varint(element_count)
    msg += _fields(0x7A, headers)  # field 15, `headers`
    return escape(msg) + b"\n"


def sample(
    ptype: PayloadType,
    secondsintoyear: int,
    nano: int,
    value: Any,
    severity: int = 0,
    status: int = 0,
    fields: Sequence[tuple[str, str]] = (),
) -> bytes:
    """One sample's line: its message for `ptype`, escaped, with its newline. Severity and
    status 0 are left out (their default); `fields` are the sample's `fieldvalues`."""
    msg = b"\x08" + _varint(secondsintoyear) + b"\x10" + _varint(nano)
    msg += _vector_value(ptype, value) if ptype.vector else _scalar_value(ptype, value)
    if severity:
        msg += b"\x20" + _varint(severity)
    if status:
        msg += b"\x28" + _varint(status)
    if fields:
        msg += _fields(0x3A, fields)  # field 7, `fieldvalues`
    return escape(msg) + b"\n"


def chunk_break() -> bytes:
    """The empty line that ends a chunk before the next one's `PayloadInfo`."""
    return b"\n"


# --- reading --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    """A `PayloadInfo`: how the lines after it are read."""

    type: PayloadType
    pvname: str
    year: int
    element_count: int | None = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of the chunk before it. `value`: float or int for numeric scalars, str for
    strings, bytes for SCALAR_BYTE and the byte waveform and V4 generic bytes, a numpy array for
    numeric vectors, a tuple of str for string vectors."""

    year: int
    secondsintoyear: int
    nano: int
    value: Any
    severity: int = 0
    status: int = 0
    repeatcount: int | None = None
    fields: tuple[tuple[str, str], ...] = field(default=())

    @property
    def time_ns(self) -> int:
        """POSIX time in nanoseconds."""
        return (year_start(self.year) + self.secondsintoyear) * NS + self.nano


# The reader's bounds (limits.py): one line, the samples and bytes of one answer, and the
# names and values of one message (`headers`, `fieldvalues`).
PB_LINE_BYTES = integer("aa_pb_line_bytes")
PB_SAMPLES = integer("aa_pb_samples")
PB_BYTES = integer("aa_pb_bytes")
PB_FIELDS = integer("aa_pb_fields")


class PbReader:
    """A `getData.raw` answer read as its bytes arrive (sans-I/O): `feed` gives the events of
    every line it completes, `close` those of a last line without its newline."""

    def __init__(
        self,
        max_line: int = PB_LINE_BYTES,
        max_samples: int = PB_SAMPLES,
        max_bytes: int = PB_BYTES,
        max_fields: int = PB_FIELDS,
    ) -> None:
        self.max_line = max_line
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self.max_fields = max_fields
        self._buf = bytearray()
        self._chunk: Chunk | None = None
        self.samples = 0  # read so far
        self.bytes = 0
        self._failed: PbError | None = None

    def feed(self, data: bytes) -> list[Chunk | Sample]:
        if self._failed is not None:
            raise self._failed
        try:
            return self._feed(data)
        except PbError as exc:
            self._failed = exc
            raise

    def close(self) -> list[Chunk | Sample]:
        """The end of the input: a last line without its newline is read as a line."""
        if self._failed is not None:
            raise self._failed
        rest, self._buf = bytes(self._buf), bytearray()
        try:
            return self._line(rest) if rest else []
        except PbError as exc:
            self._failed = exc
            raise

    def _feed(self, data: bytes) -> list[Chunk | Sample]:
        self.bytes += len(data)
        if self.bytes > self.max_bytes:
            raise PbError(f"the answer is longer than {self.max_bytes:,} bytes")
        events: list[Chunk | Sample] = []
        buf = self._buf
        start = len(buf)
        buf += data
        begin = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            events += self._line(bytes(buf[begin:end]))
            begin = start = end + 1
        del buf[:begin]
        if len(buf) > self.max_line:
            raise PbError(f"a line longer than {self.max_line:,} bytes")
        return events

    def _line(self, line: bytes) -> list[Chunk | Sample]:
        if len(line) > self.max_line:
            raise PbError(f"a line longer than {self.max_line:,} bytes")
        if not line:
            self._chunk = None  # the next line starts a chunk
            return []
        message = unescape(line)
        if self._chunk is None:
            self._chunk = self._payload_info(message)
            return [self._chunk]
        self.samples += 1
        if self.samples > self.max_samples:
            raise PbError(f"more than {self.max_samples:,} samples")
        return [self._sample(self._chunk, message)]

    def _payload_info(self, message: bytes) -> Chunk:
        ptype = name = year = None
        count: int | None = None
        headers: list[tuple[str, str]] = []
        for number, wire, value in _fields_of(message):
            if number == 1 and wire == 0:
                ptype = value
            elif number == 2 and wire == 2:
                name = _text(value, "pvname")
            elif number == 3 and wire == 0:
                year = _int32(value)
            elif number == 4 and wire == 0:
                count = _int32(value)
            elif number == 15 and wire == 2:
                headers.append(_field_value(value))
                if len(headers) > self.max_fields:
                    raise PbError(f"more than {self.max_fields:,} headers")
        if ptype is None or name is None or year is None:
            raise PbError("a PayloadInfo needs its type, pvname and year")
        try:
            payload = PayloadType(ptype)
        except ValueError:
            raise PbError(f"unknown payload type {ptype}") from None
        if not 1 <= year <= 9999:
            raise PbError(f"year {year} is out of range")
        return Chunk(payload, name, year, count, tuple(headers))

    def _sample(self, chunk: Chunk, message: bytes) -> Sample:
        ptype = chunk.type
        seconds = nano = None
        severity = status = 0
        repeat: int | None = None
        fields: list[tuple[str, str]] = []
        parts: list[Any] = []  # the value's field occurrences (repeated fields come in several)
        for number, wire, value in _fields_of(message):
            if number == 1 and wire == 0:
                seconds = value
            elif number == 2 and wire == 0:
                nano = value
            elif number == 3:
                parts.append((wire, value))
            elif number == 4 and wire == 0:
                severity = _int32(value)
            elif number == 5 and wire == 0:
                status = _int32(value)
            elif number == 6 and wire == 0:
                repeat = value
            elif number == 7 and wire == 2:
                fields.append(_field_value(value))
                if len(fields) > self.max_fields:
                    raise PbError(f"more than {self.max_fields:,} field values in a sample")
        if seconds is None or nano is None:
            raise PbError("a sample needs its secondsintoyear and nano")
        if seconds >= 1 << 32 or nano >= NS:
            raise PbError(f"a sample's time is out of range ({seconds} s, {nano} ns)")
        return Sample(chunk.year, seconds, nano, _value(ptype, parts), severity, status, repeat,
                      tuple(fields))  # fmt: skip


def _fields_of(message: bytes) -> Iterable[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field: an int for varints, bytes for the
    others. Groups (wire types 3 and 4) are refused: nothing in EPICSEvent.proto nests but a
    FieldValue inside its message, and that is read as bytes, one level down."""
    i, n = 0, len(message)
    while i < n:
        key, i = _read_varint(message, i)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise PbError("field number 0")
        value: int | bytes
        if wire == 0:
            value, i = _read_varint(message, i)
        elif wire == 1:
            if i + 8 > n:
                raise PbError("a message ends inside a 64-bit field")
            value, i = message[i : i + 8], i + 8
        elif wire == 2:
            length, i = _read_varint(message, i)
            if length > n - i:
                raise PbError("a length-delimited field runs past its message")
            value, i = message[i : i + length], i + length
        elif wire == 5:
            if i + 4 > n:
                raise PbError("a message ends inside a 32-bit field")
            value, i = message[i : i + 4], i + 4
        else:
            raise PbError(f"wire type {wire} (groups are not part of EPICSEvent.proto)")
        yield number, wire, value


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    for k in range(i, min(i + 10, len(data))):
        b = data[k]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result & ((1 << 64) - 1), k + 1
        shift += 7
    raise PbError("a varint runs past its message or past 10 bytes")


def _int32(v: int) -> int:
    """An int32 field's varint: negative ones come as 64-bit two's complement."""
    v &= (1 << 64) - 1
    if v >= 1 << 63:
        v -= 1 << 64
    if not -(1 << 31) <= v < 1 << 31:
        raise PbError(f"{v} is out of range for int32")
    return v


def _unzigzag(v: int) -> int:
    if v >= 1 << 32:
        raise PbError(f"{v} is out of range for sint32")
    return (v >> 1) ^ -(v & 1)


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PbError(f"{what} is not UTF-8") from None


def _field_value(data: bytes) -> tuple[str, str]:
    name = val = None
    for number, wire, value in _fields_of(data):
        if number == 1 and wire == 2:
            name = _text(value, "a field name")
        elif number == 2 and wire == 2:
            val = _text(value, "a field value")
    if name is None or val is None:
        raise PbError("a FieldValue needs its name and val")
    return name, val


_NUMPY = {
    PayloadType.WAVEFORM_DOUBLE: ("<f8", 1),
    PayloadType.WAVEFORM_FLOAT: ("<f4", 5),
    PayloadType.WAVEFORM_INT: ("<i4", 5),
}


def _value(ptype: PayloadType, parts: list[tuple[int, Any]]) -> Any:
    if ptype.vector:
        return _vector(ptype, parts)
    if not parts:
        raise PbError(f"a {ptype.name} sample without its val")
    wire, v = parts[-1]  # a scalar given twice: the last one counts, as protobuf reads it
    if ptype == PayloadType.SCALAR_DOUBLE and wire == 1:
        return _DOUBLE.unpack(v)[0]
    if ptype == PayloadType.SCALAR_FLOAT and wire == 5:
        return _FLOAT.unpack(v)[0]
    if ptype == PayloadType.SCALAR_INT and wire == 5:
        return _INT.unpack(v)[0]
    if ptype in (PayloadType.SCALAR_SHORT, PayloadType.SCALAR_ENUM) and wire == 0:
        return _unzigzag(v)
    if ptype == PayloadType.SCALAR_BYTE and wire == 2:
        return bytes(v)
    if ptype == PayloadType.SCALAR_STRING and wire == 2:
        return _text(v, "a string value")
    if ptype == PayloadType.V4_GENERIC_BYTES and wire == 2:
        return bytes(v)
    raise PbError(f"a {ptype.name} sample's val has wire type {wire}")


def _vector(ptype: PayloadType, parts: list[tuple[int, Any]]) -> Any:
    if ptype == PayloadType.WAVEFORM_STRING:
        if any(w != 2 for w, _ in parts):
            raise PbError("a WAVEFORM_STRING element is not length-delimited")
        return tuple(_text(v, "a string element") for _, v in parts)
    if ptype == PayloadType.WAVEFORM_BYTE:
        if len(parts) > 1 or any(w != 2 for w, _ in parts):
            raise PbError("a WAVEFORM_BYTE val is one length-delimited field")
        return bytes(parts[0][1]) if parts else b""
    if ptype in _NUMPY:
        dtype, unpacked = _NUMPY[ptype]
        width = np.dtype(dtype).itemsize
        pieces: list[npt.NDArray[Any]] = []
        for w, v in parts:  # packed (wire 2) or one element per field, as protobuf accepts
            if w == 2:
                if len(v) % width:
                    raise PbError(f"a packed {ptype.name} of {len(v)} bytes")
            elif w != unpacked:
                raise PbError(f"a {ptype.name} element has wire type {w}")
            pieces.append(np.frombuffer(v, dtype))
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype)
    # WAVEFORM_SHORT and WAVEFORM_ENUM: zigzag varints, packed or not.
    values: list[int] = []
    for w, v in parts:
        if w == 0:
            values.append(_unzigzag(v))
        elif w == 2:
            i = 0
            while i < len(v):
                x, i = _read_varint(v, i)
                values.append(_unzigzag(x))
        else:
            raise PbError(f"a {ptype.name} element has wire type {w}")
    return np.array(values, np.int32)
