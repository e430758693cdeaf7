"""core/archive's pure parts: what an archiver is asked for (plan.py), its answer as the history's
rows (series.py) and both parts joined at the seam (join.py), with no row twice and none
missing, checked against the rows counted one by one."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pvwire.aa.operators import Series
from pvwire.aa.pb import PayloadType, PbReader, payload_info, sample
from pvwire.core.archive.join import EMPTY, JOINED, MISSING, missing, past, span
from pvwire.core.archive.plan import LADDER_S, plan, seam, width_for
from pvwire.core.archive.series import (
    ArchiveRefused,
    Collected,
    binned,
    gap_row,
    rebin,
    rows_of,
)
from pvwire.core.history import ChannelHistory, HistorySlice

NS = 1_000_000_000
T0 = 1_780_000_000 * NS
TIERS = (0, 10 * NS, 300 * NS)


def points(times: list[int], first: float = 0.0) -> Series:
    n = len(times)
    return Series(PayloadType.SCALAR_DOUBLE, np.array(times, np.int64),
                  first + np.arange(n, dtype=np.float64), np.zeros(n, np.int64),
                  np.zeros(n, np.int64))  # fmt: skip


def bins_of(s: Series, width: int) -> Series:
    """`optimizedSample`'s answer to samples `s`, counted one by one: [mean, std, min, max,
    count] per bin of `width` ns with samples, at its middle (as the Archiver Appliance)."""
    keys = sorted(set((s.t // width).tolist()))
    rows, times = [], []
    for k in keys:
        v = s.value[s.t // width == k]
        rows.append([v.mean(), v.std(ddof=1) if len(v) > 1 else 0.0, v.min(), v.max(), len(v)])
        sec = width // NS
        times.append((k * sec + sec // 2) * NS + (NS // 2 if sec % 2 else 0))
    n = len(rows)
    return Series(PayloadType.WAVEFORM_DOUBLE, np.array(times, np.int64),
                  np.array(rows, np.float64).reshape(n, 5), np.zeros(n, np.int64),
                  np.zeros(n, np.int64), 5)  # fmt: skip


def own_rows(times: list[int], first: float, max_points: int = 10_000) -> HistorySlice:
    h = ChannelHistory("x")
    for i, t in enumerate(times):
        h.record(first + i, t // NS, t % NS, 0, 0)
    return h.query(0, 2**62, max_points)


@given(
    since=st.integers(0, 10**6),
    span_s=st.integers(1, 10**6),
    ahead=st.integers(1, 10**6),
    points_asked=st.integers(1, 20_000),
    own=st.sampled_from(TIERS),
)
def test_the_archive_s_interval_is_the_width_and_its_bins_share_the_tiers_edges(
    since: int, span_s: int, ahead: int, points_asked: int, own: int
) -> None:
    lo = T0 + since * 997_000
    oldest = lo + span_s * NS + 123
    p = plan(lo, oldest, own, points_asked, oldest + ahead * NS)
    assert p.start % NS == 0 and p.end % NS == 0 and p.start <= lo and p.end >= oldest
    # The Archiver Appliance's interval: (to - from) // K seconds, at least 1.
    assert max(1, (p.end - p.start) // NS // p.points) == p.width // NS
    assert p.width >= own and (not own or p.width % own == 0 or own % p.width == 0)
    assert p.width // NS in LADDER_S or p.width % (86_400 * NS) == 0
    assert seam(p, True) % max(p.width, own) == 0 and seam(p, True) >= oldest
    assert seam(p, False) == (oldest if not own else -(-oldest // own) * own)


def test_the_width_is_the_narrowest_that_fits() -> None:
    assert width_for(3600 * NS, 1000) == 5 * NS  # 3.6 s -> 5 s
    assert width_for(60 * NS, 1000) == NS  # never under a second
    assert width_for(60 * NS, 1000, 300 * NS) == 300 * NS  # never under the tier's buckets
    assert width_for(100 * 86_400 * NS, 10) == 10 * 86_400 * NS  # whole days past a day


def test_a_raw_join_keeps_every_archive_sample_before_the_first_kept_point() -> None:
    archived = points([T0 + k * NS // 10 for k in range(0, 1000)])  # 100 s at 10 Hz
    own_times = [T0 + 55 * NS + 17 + k * NS // 10 for k in range(500)]  # from 55 s on
    own = own_rows(own_times, 1000.0)
    p = plan(T0 + 20 * NS, own.since, own.resolution, 10_000, T0 + 200 * NS)
    rows, note = span(p, own, archived, T0 + 20 * NS, T0 + 200 * NS, 10_000, "PV")
    before = archived.t[archived.t < own.since]
    assert note.state == JOINED and note.seam == own.since and rows.resolution == 0
    # From the last sample before `since` (the value the plot starts with) to the seam, then
    # every point kept: each exactly once.
    keep = before[before >= T0 + 20 * NS - NS // 10]
    assert rows.t.tolist() == [*keep.tolist(), *own.t.tolist()]
    assert note.rows == len(keep) and np.all(np.diff(rows.t) > 0)


def test_a_binned_join_counts_every_sample_once() -> None:
    """Too many for the points asked: bins of one width for both parts, the archive's up to the
    seam (its last bin holds what the server's first point shares), the server's after."""
    times = [T0 + k * NS // 10 + 3 for k in range(3000)]  # 300 s at 10 Hz
    archived_all = points(times)
    own_times = times[1234:]  # the server kept these; the archive holds them too
    own = own_rows(own_times, 1234.0)
    since, until = T0, T0 + 300 * NS
    p = plan(since, own.since, own.resolution, 50, until)
    asked = points([t for t in times if t <= p.end])
    for answer in (asked, bins_of(asked, p.width)):  # the samples, or `optimized`'s bins
        rows, note = span(p, own, answer, since, until, 50, "PV")
        assert note.state == JOINED and rows.resolution == p.width
        assert int(rows.count.sum()) == 3000  # none twice, none missing
        assert np.all(np.diff(rows.t) == p.width)  # every bin, in order
        sums = [float(archived_all.value[(archived_all.t // p.width) * p.width == t].mean())
                for t in rows.t.tolist()]  # fmt: skip
        assert np.allclose(rows.mean, sums)
        assert note.seam % p.width == 0 and note.seam >= own.since


def test_the_archive_s_disconnects_are_gap_rows() -> None:
    s = points([T0, T0 + 10 * NS, T0 + 20 * NS])
    s.fields[1] = (("cnxlostepsecs", str(T0 // NS + 4)), ("cnxregainedepsecs", str(T0 // NS + 9)))
    rows = rows_of(s, NS)
    assert rows.t.tolist() == [T0, T0 + 4 * NS, T0 + 10 * NS, T0 + 20 * NS]
    assert rows.gap.tolist() == [False, True, False, False] and math.isnan(rows.value[1])


@pytest.mark.parametrize("lost", ["\u00b2", "9" * 5_000, "", "-4", "4.5"])
def test_a_disconnect_time_that_is_no_number_is_no_gap(lost: str) -> None:
    """An archiver's `cnxlostepsecs` is its words: one that is not a count of seconds (a
    superscript digit, more digits than int() reads) is left out, not an error of the read."""
    s = points([T0, T0 + 10 * NS, T0 + 20 * NS])
    s.fields[1] = (("cnxlostepsecs", lost),)
    rows = rows_of(s, NS)
    assert rows.t.tolist() == [T0, T0 + 10 * NS, T0 + 20 * NS] and not rows.gap.any()


def test_an_archive_without_data_is_a_gap_row_and_a_missing_one_says_why() -> None:
    own = own_rows([T0 + 50 * NS + k * NS for k in range(10)], 0.0)
    p = plan(T0, own.since, 0, 1000, T0 + 60 * NS)
    rows, note = span(p, own, points([]), T0, T0 + 60 * NS, 1000, "PV")
    assert note.state == EMPTY and "holds no data of PV" in note.reason
    assert rows.gap.tolist() == [True, *[False] * 10] and rows.t[0] == T0
    rows, note = missing(own, T0, "the archiver a:1 did not answer within 5 s")
    assert note.state == MISSING and note.reason.endswith("5 s")
    assert rows.gap.tolist() == [True, *[False] * 10]


def test_rebin_is_the_fold_of_the_points() -> None:
    times = [T0 + k * 700_000_000 for k in range(1000)]
    s = rows_of(points(times), NS)
    by_ten = rebin(s, 10 * NS)
    by_sixty = rebin(s, 60 * NS)
    assert np.array_equal(rebin(by_ten, 60 * NS).count, by_sixty.count)
    assert np.allclose(rebin(by_ten, 60 * NS).mean, by_sixty.mean)
    assert np.array_equal(rebin(by_ten, 60 * NS).value, by_sixty.value)  # the last of each
    assert int(by_sixty.count.sum()) == 1000
    with pytest.raises(ValueError, match="do not fold"):
        rebin(by_ten, 15 * NS)


def test_a_backfill_part_ends_before_the_server_s_rows() -> None:
    times = [T0 + k * NS // 10 for k in range(600)]
    p = plan(T0, T0 + 30 * NS + 5, 0, 1000)
    rows, at = past(p, points(times), T0, T0 + 30 * NS + 5)
    assert at == T0 + 30 * NS + 5 and rows.resolution == 0
    assert rows.t.tolist() == [t for t in times if t < at]
    # Bins: only whole ones before the cut; the bin it cuts into is a gap row.
    p = plan(T0, T0 + 60 * NS, 0, 10)
    rows, at = past(p, bins_of(points(times), p.width), T0, T0 + 31 * NS)
    assert rows.resolution == p.width and not rows.gap[:-1].any() and rows.gap[-1]
    assert int(rows.t[-1]) == T0 + 30 * NS and int(rows.count.sum()) == 300
    rows, _ = past(p, points([]), T0, T0 + 31 * NS)
    assert rows.gap.tolist() == [True] and int(rows.t[0]) == T0
    assert len(gap_row(T0)) == 1


def test_bins_are_told_from_samples() -> None:
    times = [T0 + k * NS // 10 for k in range(600)]
    assert binned(bins_of(points(times), 10 * NS), 10 * NS)
    assert binned(bins_of(points(times), 5 * NS), 5 * NS)  # odd: at half a second past
    assert not binned(points(times), 10 * NS)
    five = bins_of(points(times), 10 * NS)
    five.t[0] += 1  # a 5-element waveform's samples, not at bins' middles
    assert not binned(five, 10 * NS)


def test_collected_reads_numbers_and_refuses_what_is_not() -> None:
    year = 2026
    body = payload_info(PayloadType.SCALAR_BYTE, "PV", year) + sample(
        PayloadType.SCALAR_BYTE, 10, 5, -3
    )
    c = Collected(PbReader())
    c.feed(body)
    c.close()
    s = c.series()
    assert s.value.tolist() == [-3.0] and s.ptype == PayloadType.SCALAR_BYTE
    strings = Collected(PbReader())
    with pytest.raises(ArchiveRefused, match="SCALAR_STRING values of PV, not numbers"):
        strings.feed(payload_info(PayloadType.SCALAR_STRING, "PV", year))
    with pytest.raises(ArchiveRefused, match="only scalars"):
        arrays = Collected(PbReader())
        arrays.feed(payload_info(PayloadType.WAVEFORM_INT, "PV", year, 3)
                    + sample(PayloadType.WAVEFORM_INT, 1, 0, [1, 2, 3]))  # fmt: skip
        rows_of(arrays.series(), NS)
