"""The bodies the Archiver Appliance sends, a piece at a time: `getData.json` (and
`getDataForPVs.json`): a list of `{"meta": {"name", headers...}, "data": [{"secs", "val",
"nanos", "severity", "status"(, "fields")}]}`, numbers as Java writes them (NaN, Infinity);
`getData.raw`: PB/HTTP (`pb`), a chunk per PV and year; `getData.csv`: `secs,val,severity,status,
nanos` lines. Each takes the PVs as an iterable of `Answer`, made when its turn comes, and
gives bytes of about PIECE_SAMPLES samples at a time."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import pb
from .operators import Series
from .pb import PayloadType

__all__ = ["PIECE_SAMPLES", "Answer", "csv_pieces", "json_pieces", "raw_pieces", "values"]

NS = 1_000_000_000
# Samples per piece written: small enough that a piece is a few tens of KB, large enough that
# a piece costs little more than its samples.
PIECE_SAMPLES = 512


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


def json_pieces(answers: Iterable[Answer]) -> Iterator[bytes]:
    yield b"[ \n"
    first = True
    for a in answers:
        s = a.series
        meta = "".join(f", {json.dumps(k)}: {json.dumps(v)} " for k, v in a.headers if v)
        head = "" if first else "] },\n"
        first = False
        yield f'{head}{{ "meta": {{ "name": {json.dumps(a.name)} {meta}}},\n"data": [ \n'.encode()
        one = _text_of(s.ptype)
        vals = values(s)
        secs, nanos = np.divmod(s.t, NS)
        secs_l, nanos_l = secs.tolist(), nanos.tolist()
        sev, stat = s.severity.tolist(), s.status.tolist()
        for start in range(0, len(vals), PIECE_SAMPLES):
            lines = []
            for i in range(start, min(start + PIECE_SAMPLES, len(vals))):
                v = _vector_text(s.ptype, vals[i]) if s.ptype.vector else one(vals[i])
                extra = _fields_json(s.fields[i]) if i in s.fields else ""
                lines.append(f'{{ "secs": {secs_l[i]}, "val": {v}, "nanos": {nanos_l[i]}, '
                             f'"severity":{sev[i]}, "status":{stat[i]}{extra} }}')  # fmt: skip
            yield ((",\n" if start else "") + ",\n".join(lines)).encode()
    yield b"\n] }\n ]\n" if not first else b" ]\n"


def csv_pieces(answers: Iterable[Answer]) -> Iterator[bytes]:
    for a in answers:
        s = a.series
        one = _text_of(s.ptype)
        vals = values(s)
        if s.ptype in (PayloadType.SCALAR_STRING, PayloadType.WAVEFORM_STRING):
            one = str  # unquoted, as the Archiver Appliance writes them
        secs, nanos = np.divmod(s.t, NS)
        secs_l, nanos_l = secs.tolist(), nanos.tolist()
        sev, stat = s.severity.tolist(), s.status.tolist()
        for start in range(0, len(vals), PIECE_SAMPLES):
            lines = []
            for i in range(start, min(start + PIECE_SAMPLES, len(vals))):
                v = _vector_text(s.ptype, vals[i]) if s.ptype.vector else one(vals[i])
                lines.append(f"{secs_l[i]},{v},{sev[i]},{stat[i]},{nanos_l[i]}\n")
            yield "".join(lines).encode()
    yield b"\n"


def raw_pieces(answers: Iterable[Answer]) -> Iterator[bytes]:
    """PB/HTTP: for each PV a chunk per UTC year of its samples (one for a PV without any)."""
    first = True
    for a in answers:
        s = a.series
        vals = values(s)
        secs, nanos = np.divmod(s.t, NS)
        years = _years(secs) if len(secs) else [(a.year, 0, 0)]
        for year, lo, hi in years:
            head = b"" if first else pb.chunk_break()
            first = False
            yield head + pb.payload_info(s.ptype, a.name, year, s.elements, a.headers)
            base = pb.year_start(year)
            into, nano = (secs[lo:hi] - base).tolist(), nanos[lo:hi].tolist()
            sev, stat = s.severity[lo:hi].tolist(), s.status[lo:hi].tolist()
            for start in range(0, hi - lo, PIECE_SAMPLES):
                end = min(start + PIECE_SAMPLES, hi - lo)
                yield b"".join([
                    pb.sample(s.ptype, into[j], nano[j], vals[lo + j], sev[j], stat[j],
                              s.fields.get(lo + j, ()))
                    for j in range(start, end)
                ])  # fmt: skip


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
