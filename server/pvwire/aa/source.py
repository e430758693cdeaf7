"""A channel as the Archiver Appliance API reads it (core/recorded.py's `Recorded`): its rows
for a time range, its payload type and the headers it sends.

The rows are the raw points when the raw ring reaches back to `from` (or holds every update
since the history began), else the buckets of the finest tier that reaches back to it (else the
coarsest): one source per answer, so no seam inside it. Every row up to `to` is kept, also
before `from`: the post-processors read the last sample before it. A string channel has no
history (core/history records numbers and numeric arrays): its rows are its current value."""

from __future__ import annotations

import numpy as np

from ..core.history.reading import Held
from ..core.history.slices import HistorySlice
from ..core.history.tiers import tier_for
from ..core.recorded import Recorded
from ..model import Metadata
from .operators import Rows, Series
from .pb import PayloadType

__all__ = ["as_rows", "headers", "payload_type", "rows_of", "string_series"]

NS = 1_000_000_000

# The Archiver Appliance's type of each metadata type (a CA DBR type, or PVA's scalar types):
# 64-bit and unsigned 32-bit integers have no PB type of their own; as doubles they are exact
# up to 2^53.
_SCALAR = {
    "float64": PayloadType.SCALAR_DOUBLE,
    "float32": PayloadType.SCALAR_FLOAT,
    "int32": PayloadType.SCALAR_INT,
    "uint16": PayloadType.SCALAR_INT,
    "int16": PayloadType.SCALAR_SHORT,
    "int8": PayloadType.SCALAR_BYTE,
    "uint8": PayloadType.SCALAR_BYTE,
    "bool": PayloadType.SCALAR_BYTE,
    "enum": PayloadType.SCALAR_ENUM,
    "string": PayloadType.SCALAR_STRING,
}
_VECTOR = {
    PayloadType.SCALAR_DOUBLE: PayloadType.WAVEFORM_DOUBLE,
    PayloadType.SCALAR_FLOAT: PayloadType.WAVEFORM_FLOAT,
    PayloadType.SCALAR_INT: PayloadType.WAVEFORM_INT,
    PayloadType.SCALAR_SHORT: PayloadType.WAVEFORM_SHORT,
    PayloadType.SCALAR_BYTE: PayloadType.WAVEFORM_BYTE,
    PayloadType.SCALAR_ENUM: PayloadType.WAVEFORM_ENUM,
    PayloadType.SCALAR_STRING: PayloadType.WAVEFORM_STRING,
}


def payload_type(rec: Recorded, vector: bool) -> PayloadType:
    """The channel's type while it is open; a double (or a waveform of them) once closed, when
    its history is all that is left of it."""
    scalar = _SCALAR.get(rec.meta.type or "", PayloadType.SCALAR_DOUBLE)
    if vector or isinstance(rec.value, np.ndarray):
        return _VECTOR[scalar]
    return scalar


def _number(x: float) -> str:
    return repr(float(x))


def headers(meta: Metadata, latest: bool) -> list[tuple[str, str]]:
    """EGU and PREC, as the Archiver Appliance sends them with every answer; with
    `fetchLatestMetadata` also the limits and the description it reads from the engine."""
    out = [("EGU", meta.units or ""), ("PREC", str(meta.precision or 0))]
    if latest:
        pairs = ((("LOPR", "HOPR"), meta.display), (("DRVL", "DRVH"), meta.control),
                 (("LOLO", "HIHI"), meta.alarm), (("LOW", "HIGH"), meta.warning))  # fmt: skip
        for (lo, hi), limits in pairs:
            if limits is not None:
                out += [(lo, _number(limits[0])), (hi, _number(limits[1]))]
        if meta.description:
            out.append(("DESC", meta.description))
    return [(k, v) for k, v in out if v]


def rows_of(held: Held, since: int, until: int) -> Rows:
    """Every row up to `until` of the finest source reaching back to `since` (module doc)."""
    raw = held.raw()
    if not held.wrapped or (len(raw) and int(raw.t[0]) <= since):
        return _rows(raw[raw.t <= until].slice(0, False))
    tier, buckets = tier_for(held.tier, since)
    return _rows(buckets[buckets.t <= until].slice(tier.width, False, 0))


def as_rows(s: HistorySlice) -> Rows:
    """A history's rows (points or buckets) as the post-processors read them."""
    return _rows(s)


def _rows(s: HistorySlice) -> Rows:
    count = s.count.astype(np.int64)
    if s.resolution:  # buckets: each the aggregate of its updates
        total = np.where(count > 0, s.mean * count, 0.0)
        if s.value.ndim == 2:
            total = np.zeros(len(s))
        return Rows(s.t, s.value, s.min, s.max, total, count, s.severity, s.status, s.gap,
                    s.resolution)  # fmt: skip
    return Rows(s.t, s.value, s.min, s.max, s.value if s.value.ndim == 1 else np.zeros(len(s)),
                count, s.severity, s.status, s.gap, 0)  # fmt: skip


def string_series(rec: Recorded, until: int) -> Series:
    """A string channel's answer: its current value, if it came before `until`."""
    t = rec.seconds * NS + rec.nanoseconds
    if not isinstance(rec.value, str) or t > until:
        return Series(PayloadType.SCALAR_STRING, np.zeros(0, np.int64), [],
                      np.zeros(0, np.int64), np.zeros(0, np.int64))  # fmt: skip
    return Series(PayloadType.SCALAR_STRING, np.array([t], np.int64), [rec.value],
                  np.array([rec.severity], np.int64), np.array([rec.status], np.int64))  # fmt: skip
