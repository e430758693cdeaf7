"""aa/pb.py, the Archiver Appliance's PB/HTTP format, against the independent protobuf classes of
PyPI's epicsarchiver-retrieval-client (its EPICSEvent_pb2, compiled from the Archiver
Appliance's EPICSEvent.proto): what pvwire writes they read, what they write pvwire reads; and
the reader under its bounds, whole, byte by byte, and fuzzed."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from epicsarchiver.retrieval import EPICSEvent_pb2 as ee
from epicsarchiver.retrieval.pb import escape_bytes, parse_pb_data, unescape_bytes
from hypothesis import given
from hypothesis import strategies as st
from pvwire.aa import answers, pb
from pvwire.aa.answers import Answer
from pvwire.aa.operators import Series
from pvwire.aa.pb import Chunk, PayloadType, PbError, PbReader, Sample

T = PayloadType
CLASSES: dict[PayloadType, Any] = {
    T.SCALAR_STRING: ee.ScalarString, T.SCALAR_SHORT: ee.ScalarShort,
    T.SCALAR_FLOAT: ee.ScalarFloat,
    T.SCALAR_ENUM: ee.ScalarEnum, T.SCALAR_BYTE: ee.ScalarByte, T.SCALAR_INT: ee.ScalarInt,
    T.SCALAR_DOUBLE: ee.ScalarDouble, T.WAVEFORM_SHORT: ee.VectorShort,
    T.WAVEFORM_FLOAT: ee.VectorFloat, T.WAVEFORM_ENUM: ee.VectorEnum,
    T.WAVEFORM_BYTE: ee.VectorChar, T.WAVEFORM_INT: ee.VectorInt,
    T.WAVEFORM_DOUBLE: ee.VectorDouble, T.WAVEFORM_STRING: ee.VectorString,
}  # fmt: skip

# A value of each type, with the bytes that need escaping (0x0A, 0x0D, 0x1B) inside it.
VALUES: dict[PayloadType, Any] = {
    T.SCALAR_STRING: "a\nb\rc\x1bd µA",
    T.SCALAR_SHORT: -10,
    T.SCALAR_FLOAT: 1.5,
    T.SCALAR_ENUM: 13,
    T.SCALAR_BYTE: 0x0A,
    T.SCALAR_INT: 0x0D0A1B,
    T.SCALAR_DOUBLE: -2.25e-7,
    T.WAVEFORM_SHORT: [-32768, 10, 13, 27],
    T.WAVEFORM_FLOAT: [1.0, float("inf"), -0.5],
    T.WAVEFORM_ENUM: [0, 10, 65535],
    T.WAVEFORM_BYTE: [10, 13, 27, 255],
    T.WAVEFORM_INT: [-(2**31), 0x0A0D1B, 2**31 - 1],
    T.WAVEFORM_DOUBLE: [0.0, float("nan"), 1e300],
    T.WAVEFORM_STRING: ["x\n", "", "y"],
}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float):
        return math.isnan(a) and math.isnan(b) if math.isnan(a) else a == b
    return bool(a == b)


def expected(ptype: PayloadType, value: Any) -> Any:
    """The value as the protobuf class holds it."""
    if ptype == T.SCALAR_BYTE:
        return bytes([value])
    if ptype == T.WAVEFORM_BYTE:
        return bytes(value)
    if ptype.vector:
        return list(value)
    return value


@pytest.mark.parametrize("ptype", list(VALUES), ids=lambda t: t.name)
def test_what_pvwire_writes_the_archiver_classes_read(ptype: PayloadType) -> None:
    value = VALUES[ptype]
    line = pb.sample(ptype, 3 * 86400 + 10, 123_456_789, value, 2, 17, [("cnxlostepsecs", "5")])
    assert line.endswith(b"\n") and b"\n" not in line[:-1] and b"\r" not in line
    msg = CLASSES[ptype]()
    msg.ParseFromString(unescape_bytes(line[:-1]))
    head = (msg.secondsintoyear, msg.nano, msg.severity, msg.status)
    assert head == (3 * 86400 + 10, 123_456_789, 2, 17)
    got = msg.val if not ptype.vector or ptype == T.WAVEFORM_BYTE else list(msg.val)
    want = expected(ptype, value)
    if isinstance(want, list):
        assert len(got) == len(want) and all(same(float(a) if not isinstance(a, str) else a, b)
                                             for a, b in zip(want, got, strict=True))  # fmt: skip
    else:
        assert same(want, got)
    assert [(f.name, f.val) for f in msg.fieldvalues] == [("cnxlostepsecs", "5")]


@pytest.mark.parametrize("ptype", list(VALUES), ids=lambda t: t.name)
def test_what_the_archiver_classes_write_pvwire_reads(ptype: PayloadType) -> None:
    info = ee.PayloadInfo(
        type=ee.PayloadType.Value(ptype.name), pvname="X:\n:Y", year=2026, elementCount=3
    )
    info.headers.add(name="EGU", val="m\rm")
    msg = CLASSES[ptype](secondsintoyear=42, nano=7, severity=1, status=3)
    value = expected(ptype, VALUES[ptype])
    if ptype.vector and ptype != T.WAVEFORM_BYTE:
        msg.val.extend(value)
    else:
        msg.val = value
    msg.fieldvalues.add(name="a", val="b")
    data = b"\n".join(escape_bytes(m.SerializeToString()) for m in (info, msg)) + b"\n"
    events = PbReader().feed(data)
    assert events[0] == Chunk(ptype, "X:\n:Y", 2026, 3, (("EGU", "m\rm"),))
    s = events[1]
    assert isinstance(s, Sample) and (s.secondsintoyear, s.nano, s.severity, s.status) == (
        42,
        7,
        1,
        3,
    )
    assert s.fields == (("a", "b"),)
    got = list(s.value) if ptype.vector and ptype != T.WAVEFORM_BYTE else s.value
    if isinstance(value, list):
        assert all(same(type(v)(g), v) for g, v in zip(got, value, strict=True))
    else:
        assert same(got, value)


def test_a_chunk_per_year_read_by_the_archiver_client() -> None:
    """Two years, two chunks, an empty line between: the PyPI client's own parser reads them."""
    t0 = pb.year_start(2026) - 1  # the last second of 2025
    body = pb.payload_info(T.SCALAR_DOUBLE, "PV", 2025, 1, [("EGU", "V")])
    body += pb.sample(T.SCALAR_DOUBLE, t0 - pb.year_start(2025), 5, 1.0)
    body += pb.chunk_break() + pb.payload_info(T.SCALAR_DOUBLE, "PV", 2026, 1, [("EGU", "V")])
    body += pb.sample(T.SCALAR_DOUBLE, 0, 6, 2.0)
    meta, events = parse_pb_data(body)
    assert sorted(meta) == [2025, 2026]
    assert [(e.timestamp_ns, e.val) for e in events] == [(t0 * 10**9 + 5, 1.0),
                                                         ((t0 + 1) * 10**9 + 6, 2.0)]  # fmt: skip
    assert [e.time_ns for e in PbReader().feed(body) if isinstance(e, Sample)] == [
        t0 * 10**9 + 5, (t0 + 1) * 10**9 + 6,
    ]  # fmt: skip


def body() -> bytes:
    out = pb.payload_info(T.WAVEFORM_DOUBLE, "W", 2026, 2)
    for i in range(20):
        out += pb.sample(T.WAVEFORM_DOUBLE, i, i * 1000 + 10, [float(i), 10.0 + i / 7])
    return (
        out
        + pb.chunk_break()
        + pb.payload_info(T.SCALAR_STRING, "S", 2026)
        + pb.sample(T.SCALAR_STRING, 1, 2, "\x1b\n\r")
    )


def test_the_reader_gives_the_same_events_whole_byte_by_byte_and_at_the_end() -> None:
    data = body()
    whole = PbReader().feed(data)
    reader = PbReader()
    bytewise = [e for i in range(len(data)) for e in reader.feed(data[i : i + 1])]
    assert reader.close() == []
    unterminated = PbReader()
    last = unterminated.feed(data[:-1]) + unterminated.close()
    assert len(whole) == 23 and repr(whole) == repr(bytewise) == repr(last)


@pytest.mark.parametrize(
    ("bound", "value", "message"),
    [
        ("max_line", 20, "a line longer than 20 bytes"),
        ("max_samples", 19, "more than 19 samples"),
        ("max_bytes", 300, "longer than 300 bytes"),
    ],
)
def test_each_bound_of_the_reader_refuses_past_it(bound: str, value: int, message: str) -> None:
    data = body()
    assert len(data) > 300 and PbReader(**{bound: value + 100_000}).feed(data)
    reader = PbReader(**{bound: value})
    with pytest.raises(PbError, match=message):
        for i in range(0, len(data), 7):
            reader.feed(data[i : i + 7])
    with pytest.raises(PbError):  # spent: it fails again, whatever comes
        reader.feed(b"\n")


def test_the_field_bound_counts_headers_and_field_values() -> None:
    line = pb.payload_info(T.SCALAR_DOUBLE, "P", 2026, 1, [(str(i), "v") for i in range(5)])
    assert PbReader(max_fields=5).feed(line)
    with pytest.raises(PbError, match="more than 4 headers"):
        PbReader(max_fields=4).feed(line)
    sample = pb.sample(T.SCALAR_DOUBLE, 1, 1, 1.0, fields=[("a", "b")] * 3)
    with pytest.raises(PbError, match="more than 2 field values"):
        PbReader(max_fields=2).feed(pb.payload_info(T.SCALAR_DOUBLE, "P", 2026) + sample)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"\x1b\x07", "unknown escape"),
        (b"\x08\x06\x12\x01P", "needs its type, pvname and year"),
        (b"\x08\x63\x12\x01P\x18\xea\x0f", "unknown payload type 99"),
        (b"\x0b\x00", "wire type 3"),
        (b"\x08\x06\x12\x05P", "runs past its message"),
        (b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "varint"),
        (b"\x1b", "ends inside an escape"),
    ],
)
def test_malformed_headers_are_errors_of_the_answer(line: bytes, message: str) -> None:
    with pytest.raises(PbError, match=message):
        PbReader().feed(line + b"\n")


def test_a_sample_of_the_wrong_shape_is_an_error() -> None:
    head = pb.payload_info(T.SCALAR_DOUBLE, "P", 2026)
    with pytest.raises(PbError, match="val has wire type 5"):
        PbReader().feed(head + pb.sample(T.SCALAR_FLOAT, 1, 1, 1.0))
    with pytest.raises(PbError, match="needs its secondsintoyear"):
        PbReader().feed(head + b"\x19" + b"\0" * 8 + b"\n")


@given(st.binary(max_size=400), st.integers(min_value=1, max_value=64))
def test_any_bytes_give_events_or_a_pb_error(data: bytes, step: int) -> None:
    reader = PbReader(max_line=128, max_samples=50, max_bytes=300, max_fields=4)
    try:
        for i in range(0, len(data), step):
            reader.feed(data[i : i + step])
        reader.close()
    except PbError:
        pass


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 10**9 - 1),
                          st.floats(allow_nan=False), st.integers(0, 3), st.integers(0, 21)),
                max_size=30))  # fmt: skip
def test_any_samples_round_trip(rows: list[tuple[int, int, float, int, int]]) -> None:
    data = pb.payload_info(T.SCALAR_DOUBLE, "P", 2026, 1)
    data += b"".join(pb.sample(T.SCALAR_DOUBLE, *r) for r in rows)
    got = [e for e in PbReader().feed(data) if isinstance(e, Sample)]
    assert [(s.secondsintoyear, s.nano, s.value, s.severity, s.status) for s in got] == rows


@given(st.binary(max_size=200))
def test_escaping_round_trips_and_leaves_no_newline(message: bytes) -> None:
    line = pb.escape(message)
    assert b"\n" not in line and b"\r" not in line
    assert pb.unescape(line) == message == unescape_bytes(line)


def test_years_and_seconds_into_them() -> None:
    for year in (1, 1969, 1970, 2000, 2024, 2025, 2100, 9999, 10_000, 300_000):
        start = pb.year_start(year)
        assert pb.seconds_into_year(start) == (year, 0)
        assert pb.seconds_into_year(start - 1)[0] == year - 1
    assert np.int64(pb.year_start(2026)) == 1767225600
    assert pb.year_start(1) == -62135596800 and pb.year_start(10_000) == 253402300800


@pytest.mark.parametrize("elements", [1, 100, 2_000])
def test_a_piece_of_an_answer_holds_about_piece_values_values(elements: int) -> None:
    """Each piece of every body holds at most PIECE_VALUES values (an array's elements each
    count), or one sample when a sample alone holds more; together they are the answer."""
    n = 3_000
    t = (np.arange(n, dtype=np.int64) + 1_767_225_600) * 1_000_000_000
    value = np.arange(n * elements, dtype=np.float64).reshape(n, elements)
    ptype = T.WAVEFORM_DOUBLE if elements > 1 else T.SCALAR_DOUBLE
    series = Series(ptype, t, value if elements > 1 else value[:, 0], np.zeros(n, np.int64),
                    np.zeros(n, np.int64), elements)  # fmt: skip
    answer = Answer("PV", (), series, 2026)
    most = max(1, answers.PIECE_VALUES // elements)
    per_line = {"raw": b"\n", "csv": b"\n", "json": b'"secs"'}
    for kind, write in (("raw", answers.raw_pieces), ("csv", answers.csv_pieces),
                        ("json", answers.json_pieces)):  # fmt: skip
        body = list(write([answer]))
        counts = [p.count(per_line[kind]) for p in body]
        assert max(counts) <= most + (kind == "raw"), kind  # raw: and its PayloadInfo line
        if kind == "raw":
            got = [e for e in PbReader().feed(b"".join(body)) if isinstance(e, Sample)]
            assert len(got) == n and np.atleast_1d(got[-1].value).tolist() == value[-1].tolist()
        if kind == "json":
            data = json.loads(b"".join(body))[0]["data"]
            assert len(data) == n and data[-1]["val"] == (value[-1].tolist() if elements > 1
                                                          else value[-1, 0])  # fmt: skip
