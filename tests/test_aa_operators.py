"""aa/operators.py and aa/times.py: the post-processors as the Archiver Appliance computes them
(its sources: retrieval/postprocessors/), on rows made here; and its times."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pvwire.aa import pb, times
from pvwire.aa.operators import BadOperator, Operator, Rows, compute, estimate, parse_pv
from pvwire.aa.pb import PayloadType

NS = 10**9
D = PayloadType.SCALAR_DOUBLE


def points(ts: list[float], vs: list[float], gaps: tuple[int, ...] = ()) -> Rows:
    """Raw points at POSIX seconds `ts`; rows listed in `gaps` are gaps."""
    t = (np.array(ts) * NS).astype(np.int64)
    v = np.array(vs, np.float64)
    gap = np.isin(np.arange(len(ts)), gaps)
    v[gap] = np.nan
    ones = np.where(gap, 0, 1)
    sev = np.where(gap, 3, 0)
    return Rows(t, v, v, v, np.where(gap, 0, v), ones, sev, np.zeros(len(ts), np.int64), gap, 0)


def op(text: str) -> Operator:
    found, pv = parse_pv(f"{text}(PV)")
    assert found is not None and pv == "PV"
    return found


@pytest.mark.parametrize(
    ("text", "name", "n", "fill"),
    [
        ("mean_60", "mean", 60, True),
        ("meanSample_60", "mean", 60, False),
        ("mean", "mean", 900, True),
        ("optimized_500", "optimized", 500, True),
        ("optimized", "optimized", 1000, True),
        ("optimLastSample_10", "optimLastSample", 10, True),
        ("lastSample_5", "lastSample", 5, True),
        ("firstSample_5", "firstSample", 5, True),
        ("countSample_5", "count", 5, False),
        ("ncount", "ncount", 900, True),
        ("nth_3", "nth", 3, True),
        ("meanX_7", "mean", 7, True),  # it takes the first name the operator starts with
    ],
)
def test_operators_are_named_as_the_archiver_appliance_names_them(
    text: str, name: str, n: int, fill: bool
) -> None:
    found = op(text)
    assert (found.name, found.n, found.fill) == (name, n, fill)


def test_names_that_are_not_operators() -> None:
    assert parse_pv("sim://sine(-10, 10, 0.2)") == (None, "sim://sine(-10, 10, 0.2)")
    assert parse_pv("PV:A") == (None, "PV:A")
    assert parse_pv("nosuch_60(PV:A)") == (None, "PV:A")  # unknown: the samples as they were
    with pytest.raises(BadOperator, match="does not compute median_60"):
        parse_pv("median_60(PV)")
    with pytest.raises(BadOperator, match="whole number"):
        parse_pv("mean_x(PV)")
    with pytest.raises(BadOperator, match="whole number"):
        parse_pv("mean_0(PV)")


def test_raw_starts_with_the_last_sample_at_or_before_from() -> None:
    rows = points([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    got = compute(None, rows, D, 3 * NS + 1, 10 * NS)
    assert got.value.tolist() == [30, 40, 50]
    assert compute(None, rows, D, 3 * NS, 10 * NS).value.tolist() == [30, 40, 50]
    assert compute(None, rows, D, 0, 10 * NS).value.tolist() == [10, 20, 30, 40, 50]


def test_a_gap_marks_the_next_sample_as_the_engine_does() -> None:
    rows = points([1, 2, 5, 6], [1, 0, 3, 4], gaps=(1,))
    got = compute(None, rows, D, 0, 10 * NS)
    assert got.value.tolist() == [1, 3, 4]
    assert got.fields == {1: (("cnxlostepsecs", "2"), ("cnxregainedepsecs", "5"))}


def test_mean_bins_are_the_archiver_appliances() -> None:
    """Bins of epoch seconds // N, answered at their middle; the last sample before `from` in
    the bin before; an empty bin repeats the one before, up to `to`'s bin."""
    rows = points([95, 100, 101, 102, 107, 115], [7, 1, 2, 3, 4, 5])
    got = compute(op("mean_5"), rows, D, 99 * NS, 124 * NS)
    assert got.ptype == D
    assert (got.t // NS).tolist() == [92, 97, 102, 107, 112, 117, 122]
    assert (got.t % NS).tolist() == [500_000_000] * 7  # an odd N: half a second more
    assert got.value.tolist() == [7, 7, 2, 4, 4, 5, 5]
    nofill = compute(op("meanSample_5"), rows, D, 99 * NS, 124 * NS)
    assert nofill.value.tolist() == [7, 2, 4, 5]
    # A sample at `from` itself: the one before is not added.
    assert compute(op("mean_5"), rows, D, 100 * NS, 124 * NS).value.tolist() == [2, 4, 4, 5, 5]


def test_min_max_count_and_std_skip_nan_as_the_archiver_appliance() -> None:
    rows = points([10, 11, 12, 13, 20], [1, 5, math.nan, 3, 8])
    span = (10 * NS, 24 * NS)
    assert compute(op("min_10"), rows, D, *span).value.tolist() == [1, 8]
    assert compute(op("max_10"), rows, D, *span).value.tolist() == [5, 8]
    assert compute(op("count_10"), rows, D, *span).value.tolist() == [3, 1]
    std = compute(op("std_10"), rows, D, *span).value.tolist()
    assert math.isclose(std[0], float(np.std([1, 5, 3], ddof=1))) and std[1] == 0.0
    empty = compute(op("count_5"), rows, D, 10 * NS, 24 * NS).value.tolist()
    assert empty == [3, 0, 1]  # an empty bin counts 0, it does not repeat


def test_first_and_last_sample_keep_the_samples_as_they_were() -> None:
    rows = points([95, 100.5, 101, 104, 106, 109], [9, 1, 2, 3, 4, 5])
    first = compute(op("firstSample_5"), rows, PayloadType.SCALAR_INT, 100 * NS, 110 * NS)
    assert first.ptype == PayloadType.SCALAR_INT
    assert first.value.tolist() == [9, 1, 4] and (first.t / NS).tolist() == [95, 100.5, 106]
    last = compute(op("lastSample_5"), rows, D, 100 * NS, 110 * NS)
    assert last.value.tolist() == [9, 3, 5]


def test_nth_and_ncount() -> None:
    rows = points([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7])
    assert compute(op("nth_3"), rows, D, 2 * NS, 7 * NS).value.tolist() == [2, 5]
    count = compute(op("ncount"), rows, D, 2 * NS, 6 * NS)
    assert count.ptype == PayloadType.SCALAR_INT and count.value.tolist() == [5]
    assert count.t.tolist() == [2 * NS]


def test_optimized_gives_the_samples_or_bins_of_five_statistics() -> None:
    rows = points(list(range(100, 200)), list(range(100)))
    few = compute(op("optimized_200"), rows, D, 100 * NS, 200 * NS)
    assert few.ptype == D and len(few) == 100
    bins = compute(op("optimized_10"), rows, D, 100 * NS, 200 * NS)
    assert bins.ptype == PayloadType.WAVEFORM_DOUBLE and bins.elements == 5
    mean, std, lo, hi, n = bins.value[1]  # the second bin: seconds 110-119
    assert (mean, lo, hi, n) == (14.5, 10, 19, 10) and math.isclose(
        std, np.std(range(10, 20), ddof=1)
    )
    last = compute(op("optimLastSample_10"), rows, D, 100 * NS, 200 * NS)
    assert last.elements == 6 and last.value[1][5] == 19


def test_buckets_read_as_their_aggregates() -> None:
    """A tier's buckets: each at its start with its last value, and min, max, sum and count of
    its updates; a bucket has no sum of squares, so std is NaN."""
    t = np.array([0, 10, 20], np.int64) * NS
    rows = Rows(t, np.array([2.0, 4, 6]), np.array([0.0, 3, 5]), np.array([2.0, 5, 9]),
                np.array([10.0, 40, 70]), np.array([10, 10, 10]), np.zeros(3, np.int64),
                np.zeros(3, np.int64), np.zeros(3, bool), 10 * NS)  # fmt: skip
    assert compute(op("mean_20"), rows, D, 0, 39 * NS).value.tolist() == [2.5, 7.0]
    assert compute(op("min_20"), rows, D, 0, 39 * NS).value.tolist() == [0, 5]
    assert compute(op("count_20"), rows, D, 0, 39 * NS).value.tolist() == [20, 10]
    assert np.isnan(compute(op("std_20"), rows, D, 0, 39 * NS).value).all()
    assert compute(None, rows, D, 0, 39 * NS).value.tolist() == [2, 4, 6]


def test_estimates_bound_what_is_computed() -> None:
    rows = points(list(range(100, 200)), list(range(100)))
    for text in ("mean_1", "meanSample_1", "optimized_10", "nth_2", "lastSample_3", "ncount"):
        o = op(text)
        for since, until in ((100, 199), (0, 1000), (150, 160)):
            got = compute(o, rows, D, since * NS, until * NS)
            assert got.points <= estimate(o, rows, since * NS, until * NS), (text, since, until)
    assert estimate(op("mean_1"), rows, 0, 86_400 * NS) == 86_402  # filled bins count


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2026-12-02T10:00:00.000Z", 1796205600 * NS),
        ("2026-12-02T10:00:00Z", 1796205600 * NS),
        ("2026-12-02T03:00:00.5-07:00", 1796205600 * NS + 500_000_000),
        ("2026-12-02T12:00+02:00", 1796205600 * NS),
        ("2026-12-02T10:00:00.123456789Z", 1796205600 * NS + 123_456_789),
    ],
)
def test_times_as_the_archiver_appliance_parses_them(text: str, ns: int) -> None:
    assert times.parse_instant(text) == ns


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-02",
        "2026-12-02T10:00:00",
        "2026-13-02T10:00:00Z",
        "yesterday",
        "2026-12-02T10:00:00.1234567890Z",
        "0001-01-01T00:00:00+01:00",  # year 0 in UTC
        "9999-12-31T23:30:00-01:00",  # year 10000 in UTC
        "2026-12-02T10:00:00+18:01",  # past Java's offsets
        "2026-12-02T10:00:00+01:60",
        "٢٠٢٦-12-02T10:00:00Z",  # Unicode digits, which Java refuses
    ],
)
def test_times_it_refuses(text: str) -> None:
    with pytest.raises(times.BadTime):
        times.parse_instant(text)


def test_the_first_and_last_instants_are_answered() -> None:
    first = times.parse_instant("0001-01-01T01:00:00+01:00")
    assert times.iso(first) == "0001-01-01T00:00:00.000Z"
    assert times.iso(times.parse_instant("9999-12-31T23:59:59.999999999Z")).startswith("9999")
    with pytest.raises(times.BadTime, match="give `from`"):
        times.request_range(None, "0001-01-01T12:00:00Z")


def _iso(y: int, mo: int, d: int, h: int, mi: int, sec: int, frac: str, off: str) -> str:
    return f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{sec:02d}{frac}{off}"


# Date-times of every field's range and a little past it, the offsets Java takes and some more.
_NEAR_ISO = st.builds(
    _iso, st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32), st.integers(0, 24),
    st.integers(0, 60), st.integers(0, 60), st.from_regex(r"(\.[0-9]{1,9})?", fullmatch=True),
    st.from_regex(r"Z|[+-](1[0-9]|0[0-9]|2[0-4]):[0-6][0-9](:[0-6][0-9])?", fullmatch=True),
)  # fmt: skip


@given(st.one_of(_NEAR_ISO, st.text(max_size=40)), st.one_of(st.none(), _NEAR_ISO))
def test_any_time_is_an_instant_the_answer_can_write_or_a_bad_time(
    text: str, to: str | None
) -> None:
    """Every `from`, `to` and `at` ends in a value that everything after parsing can use (its
    text, its PB year), or in BadTime (the 400), never in another exception (a 500)."""
    try:
        since, until = times.request_range(text, to)
    except times.BadTime:
        return
    for ns in (since, until):
        assert times.iso(ns)
        assert 1 <= pb.seconds_into_year(ns // NS)[0] <= 9999


def test_the_default_range_is_a_day_to_an_hour_from_now() -> None:
    assert times.request_range(None, None, now_ns=10**6 * NS) == ((10**6 - 82_800) * NS,
                                                                 (10**6 + 3600) * NS)  # fmt: skip
    assert times.iso(1796205600 * NS + 5_000_000) == "2026-12-02T10:00:00.005Z"
