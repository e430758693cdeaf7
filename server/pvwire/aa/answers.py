"""The bodies the Archiver Appliance sends, a piece at a time: `getData.json` (and
`getDataForPVs.json`): a list of `{"meta": {"name", headers...}, "data": [{"secs", "val",
"nanos", "severity", "status"(, "fields")}]}`, numbers as Java writes them (NaN, Infinity);
`getData.raw`: PB/HTTP (`pb`), a chunk per PV and year; `getData.csv`: `secs,val,severity,status,
nanos` lines. Each takes the PVs as an iterable of `Answer`, made when its turn comes, and
gives bytes of about PIECE_VALUES values at a time (`pieces`, the one writer of all three)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import pb
from .operators import Series
from .pb import PayloadType

__all__ = ["PIECE_VALUES", "Answer", "csv_pieces", "json_pieces", "pieces", "raw_pieces", "values"]

NS = 1_000_000_000
# Values per piece written (each element of an array one): small enough that a piece is a few
# tens of KB, large enough that a piece costs little more than its values.
PIECE_VALUES = 512


@dataclass(frozen=True, slots=True)
class Answer:
    name: str  # as the request named it, without its post-processor
    headers: Sequence[tuple[str, str]]  # EGU, PREC... (empty values are left out)
    series: Series
    year: int  # of a chunk with no sample


_INT_RANGE = {
    PayloadType.SCALAR_INT: (-(1 << 31), (1 << 31) - 1),
    PayloadType.SCALAR_SHORT: (-(1 << 15), (1 << 15) - 1),
    PayloadType.SCALAR_ENUM: (0, (1 << 16) - 1),
    PayloadType.SCALAR_BYTE: (-(1 << 7), (1 << 8) - 1),
}


def values(s: Series) -> list[Any]:
    """The values as the payload type holds them: floats, ints (in the type's range), str, or
    rows of a 2-D array."""
    v = s.value
    if isinstance(v, list):
        return v
    if s.ptype in _INT_RANGE:
        lo, hi = _INT_RANGE[s.ptype]
        ints = np.clip(np.nan_to_num(np.rint(np.asarray(v, np.float64))), lo, hi).astype(np.int64)
        if s.ptype == PayloadType.SCALAR_BYTE:  # as Java's byte: -128..127
            ints = (ints + 128) % 256 - 128
        return ints.tolist()  # type: ignore[no-any-return]
    if s.ptype.vector:
        return list(v)
    return np.asarray(v, np.float64).tolist()  # type: ignore[no-any-return]


def _double(x: float) -> str:
    if math.isfinite(x):
        return repr(x)
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _float(x: float) -> str:
    if math.isfinite(x):
        return str(np.float32(x))  # the shortest text of the float32, as Java's Float
    return _double(x)


def _text_of(ptype: PayloadType) -> Any:
    """How one value is written in JSON and CSV."""
    if ptype in (PayloadType.SCALAR_DOUBLE, PayloadType.WAVEFORM_DOUBLE):
        return _double
    if ptype in (PayloadType.SCALAR_FLOAT, PayloadType.WAVEFORM_FLOAT):
        return _float
    if ptype in (PayloadType.SCALAR_STRING, PayloadType.WAVEFORM_STRING):
        return lambda x: json.dumps(x, ensure_ascii=False)
    return lambda x: str(int(x))


def _vector_text(ptype: PayloadType, row: npt.NDArray[Any]) -> str:
    if ptype == PayloadType.WAVEFORM_BYTE:
        row = (np.asarray(row, np.float64).astype(np.int64) + 128) % 256 - 128
    one = _text_of(ptype)
    return "[" + ",".join(one(x) for x in np.asarray(row).tolist()) + "]"


def _fields_json(fields: Sequence[tuple[str, str]]) -> str:
    inner = ",".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in fields)
    return f', "fields": {{ {inner}}}'


@dataclass(frozen=True, slots=True)
class _Columns:
    """One answer's columns as the rows are written from them (Python values, made once)."""

    series: Series
    secs: npt.NDArray[np.int64]
    secs_list: list[int]  # written per row: a list's int formats several times faster
    nanos: list[int]
    values: list[Any]
    severity: list[int]
    status: list[int]

    @staticmethod
    def of(s: Series) -> _Columns:
        secs, nanos = np.divmod(s.t, NS)
        return _Columns(s, secs, secs.tolist(), nanos.tolist(), values(s), s.severity.tolist(),
                        s.status.tolist())  # fmt: skip


# A chunk of one answer: the bytes that open it and the rows it holds (lo, hi).
Sections = Callable[[Answer, _Columns, int], Iterable[tuple[bytes, int, int]]]
# Rows lo to hi of a chunk as bytes; `more`: rows of the chunk came before them.
RowWriter = Callable[[_Columns, int, int, bool], bytes]


def pieces(answers: Iterable[Answer], begin: bytes, sections: Sections, rows: RowWriter,
           end: Callable[[int], bytes]) -> Iterator[bytes]:  # fmt: skip
    """The one writer of every body: `begin`, then for each answer (made when its turn comes)
    each of its sections' head and rows, a piece of about PIECE_VALUES values at a time (an
    array's elements each count), then `end` (of how many answers were written)."""
    yield begin
    n = 0
    for a in answers:
        cols = _Columns.of(a.series)
        step = max(1, PIECE_VALUES // max(a.series.elements, 1))
        for head, lo, hi in sections(a, cols, n):
            for start in range(lo, hi, step):
                yield head + rows(cols, start, min(start + step, hi), start > lo)
                head = b""
            if head:
                yield head
        n += 1
    yield end(n)


def _one(a: Answer, cols: _Columns, n: int) -> list[tuple[bytes, int, int]]:
    return [(b"", 0, len(cols.values))]


def _value_text(ptype: PayloadType, strings: Callable[[Any], str]) -> Callable[[Any], str]:
    if ptype.vector:
        return lambda v: _vector_text(ptype, v)
    if ptype in (PayloadType.SCALAR_STRING, PayloadType.WAVEFORM_STRING):
        return strings
    return _text_of(ptype)  # type: ignore[no-any-return]


def _json_sections(a: Answer, cols: _Columns, n: int) -> list[tuple[bytes, int, int]]:
    meta = "".join(f", {json.dumps(k)}: {json.dumps(v)} " for k, v in a.headers if v)
    head = "] },\n" if n else ""
    head += f'{{ "meta": {{ "name": {json.dumps(a.name)} {meta}}},\n"data": [ \n'
    return [(head.encode(), 0, len(cols.values))]


def _json_rows(cols: _Columns, lo: int, hi: int, more: bool) -> bytes:
    s = cols.series
    one = _value_text(s.ptype, _json_string)
    lines = []
    for i in range(lo, hi):
        extra = _fields_json(s.fields[i]) if i in s.fields else ""
        lines.append(f'{{ "secs": {cols.secs_list[i]}, "val": {one(cols.values[i])}, '
                     f'"nanos": {cols.nanos[i]}, "severity":{cols.severity[i]}, '
                     f'"status":{cols.status[i]}{extra} }}')  # fmt: skip
    return ((",\n" if more else "") + ",\n".join(lines)).encode()


def _json_string(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)


def json_pieces(answers: Iterable[Answer]) -> Iterator[bytes]:
    """`getData.json`: a list of {meta, data} (the module docstring)."""
    return pieces(answers, b"[ \n", _json_sections, _json_rows,
                  lambda n: b"\n] }\n ]\n" if n else b" ]\n")  # fmt: skip


def _csv_rows(cols: _Columns, lo: int, hi: int, more: bool) -> bytes:
    one = _value_text(cols.series.ptype, str)  # strings unquoted, as the Archiver Appliance
    return "".join(
        f"{cols.secs_list[i]},{one(cols.values[i])},{cols.severity[i]},{cols.status[i]},"
        f"{cols.nanos[i]}\n"
        for i in range(lo, hi)
    ).encode()


def csv_pieces(answers: Iterable[Answer]) -> Iterator[bytes]:
    """`getData.csv`: `secs,val,severity,status,nanos` lines."""
    return pieces(answers, b"", _one, _csv_rows, lambda n: b"\n")


def _raw_sections(a: Answer, cols: _Columns, n: int) -> Iterator[tuple[bytes, int, int]]:
    """A chunk per UTC year of the samples (one for a PV without any)."""
    s = a.series
    for k, (year, lo, hi) in enumerate(_years(cols.secs) if len(cols.secs) else [(a.year, 0, 0)]):
        head = b"" if n == 0 and k == 0 else pb.chunk_break()
        yield head + pb.payload_info(s.ptype, a.name, year, s.elements, a.headers), lo, hi


def _raw_rows(cols: _Columns, lo: int, hi: int, more: bool) -> bytes:
    s = cols.series
    base = pb.year_start(pb.seconds_into_year(int(cols.secs[lo]))[0])  # one year per section
    into = (cols.secs[lo:hi] - base).tolist()
    return b"".join([
        pb.sample(s.ptype, into[j - lo], cols.nanos[j], cols.values[j], cols.severity[j],
                  cols.status[j], s.fields.get(j, ()))
        for j in range(lo, hi)
    ])  # fmt: skip


def raw_pieces(answers: Iterable[Answer]) -> Iterator[bytes]:
    """PB/HTTP: for each PV a chunk per UTC year of its samples (one for a PV without any)."""
    return pieces(answers, b"", _raw_sections, _raw_rows, lambda n: b"")


def _years(secs: npt.NDArray[np.int64]) -> list[tuple[int, int, int]]:
    """(year, first row, end row) of each UTC year the sorted times `secs` span."""
    out = []
    lo, n = 0, len(secs)
    while lo < n:
        year = pb.seconds_into_year(int(secs[lo]))[0]
        hi = int(np.searchsorted(secs, pb.year_start(year + 1), side="left"))
        out.append((year, lo, max(hi, lo + 1)))
        lo = max(hi, lo + 1)
    return out
