"""The history store (core/history/) in memory: rings, tiers, gaps, the budget's policy, and
recording wired into channels and the registry through an in-memory hub."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest
from pvwire.access.identity import Identity
from pvwire.api.metrics import render_metrics
from pvwire.config import Settings
from pvwire.core import tick as tick_module
from pvwire.core.history import (
    CHANNEL_BYTES,
    NS,
    RAW_POINTS,
    TIERS,
    ArrayHistory,
    ChannelHistory,
    HistoryStore,
    NoHistory,
    array_bytes,
    array_sizes,
)
from pvwire.core.hub import Hub
from pvwire.limits import HISTORY_ARRAY_BYTES, HISTORY_ARRAY_LIMIT, HISTORY_MESSAGE_ROWS
from pvwire.model import ConnState
from pvwire.wire import codec as wire
from pvwire.wire.tokens import TokenSigner
from pvwire_client import wire as client_wire
from pvwire_client.backfill import past_states
from pvwire_client.state import ChannelState

from tests.eventually import eventually_async
from tests.hub_doubles import KEYS, FakeBackend, attach
from tests.hub_doubles import Client as HubClient
from tests.test_hub_faults import values
from tests.test_metrics import samples

T0 = 1_700_000_000  # POSIX seconds: bucket boundaries of every tier
ANONYMOUS = Identity("", frozenset(), "anonymous", "127.0.0.1")
EVERYTHING = (0, 2**62, 10**6)


def record_counter(h: ChannelHistory, n: int, start: int = 0, step_ns: int = NS // 10) -> None:
    """A 10 Hz counter: value i at T0 + i * 100 ms."""
    for i in range(start, start + n):
        t = T0 * NS + i * step_ns
        h.record(i, t // NS, t % NS, 0, 0)


def test_every_update_comes_back_with_its_time_alarm_and_value() -> None:
    h = ChannelHistory("ca://X")
    record_counter(h, 50)
    h.record(50.5, T0 + 5, 7, 2, 3)
    got = h.query(*EVERYTHING)
    assert got.resolution == 0
    assert list(got.value) == [*range(50), 50.5]
    assert got.t[1] == T0 * NS + NS // 10
    assert got.t[-1] == (T0 + 5) * NS + 7
    assert (got.severity[-1], got.status[-1]) == (2, 3)
    assert not got.gap.any() and not got.truncated
    assert got.since == T0 * NS


def test_a_span_selects_its_points_only() -> None:
    h = ChannelHistory("ca://X")
    record_counter(h, 100)
    got = h.query(T0 * NS + 2 * NS, T0 * NS + 3 * NS, 1000)
    assert list(got.value) == list(range(20, 31))


def test_past_the_raw_ring_the_finest_tier_answers_with_exact_buckets() -> None:
    h = ChannelHistory("ca://X")
    n = RAW_POINTS * 3  # 307 s of 10 Hz: the oldest points left the raw ring
    record_counter(h, n)
    got = h.query(T0 * NS, 2**62, 1000)
    width = TIERS[0][0]
    assert got.resolution == width
    per = width // (NS // 10)  # points per bucket
    assert list(got.count[:-1]) == [per] * (len(got) - 1)
    assert got.min[0] == 0 and got.max[0] == per - 1 and got.value[0] == per - 1
    assert got.mean[1] == pytest.approx(per + (per - 1) / 2)
    assert int(got.count.sum()) == n  # the open bucket included
    assert got.since == T0 * NS


def test_max_points_picks_a_coarser_tier_or_keeps_the_newest() -> None:
    h = ChannelHistory("ca://X")
    record_counter(h, 200)  # 20 s: two 10 s buckets, one 5 min bucket
    assert h.query(*EVERYTHING).resolution == 0
    two = h.query(0, 2**62, 2)
    assert two.resolution == TIERS[0][0] and len(two) == 2
    one = h.query(0, 2**62, 1)
    assert one.resolution == TIERS[1][0] and len(one) == 1 and one.count[0] == 200


def test_when_nothing_fits_the_newest_buckets_are_kept_and_it_says_so() -> None:
    h = ChannelHistory("ca://X")
    record_counter(h, 10, step_ns=400 * NS)  # one point per 400 s: one bucket each everywhere
    got = h.query(0, 2**62, 3)
    assert got.truncated and len(got) == 3
    assert list(got.value) == [7, 8, 9]


def test_a_disconnect_is_a_gap_once_and_the_buckets_show_it() -> None:
    h = ChannelHistory("ca://X")
    record_counter(h, 5)
    h.mark_gap()
    h.mark_gap()  # still away: one gap
    record_counter(h, 5, start=10**10)  # back, far later (past the wall clock's gap stamp)
    got = h.query(*EVERYTHING)
    assert list(got.gap) == [False] * 5 + [True] + [False] * 5
    assert math.isnan(got.value[5]) and got.count[5] == 0 and got.severity[5] == 3
    assert got.t[5] > got.t[4]
    buckets = h.query(0, 2**62, 3)
    assert buckets.resolution > 0 and buckets.gap.any()


SEAM_START = (T0 + 10) * NS - 182 * (NS // 999)  # 182 updates of 999 Hz before a boundary


def record_999_hz(h: ChannelHistory, n: int) -> None:
    for i in range(n):
        t = SEAM_START + i * (NS // 999)
        h.record(i, t // NS, t % NS, 0, 0)


def test_a_backfill_marks_the_updates_between_its_whole_buckets_and_its_first_point() -> None:
    """The seam (PROTOCOL.md section 2.8): a 999 Hz counter recorded for 3 s from 182 updates
    before a bucket boundary, then read from 60 s back. The whole buckets end at the boundary
    (0-181), the raw ring starts 1,024 updates before the newest: the updates between are in no
    row, and a gap row at the buckets' end (status 2) says so; a plot breaks there."""
    h = ChannelHistory("ca://COUNTER")
    start = SEAM_START
    n = 3 * 999
    record_999_hz(h, n)
    buckets, *rest = h.backfill((T0 - 50) * NS)
    width = TIERS[0][0]
    assert buckets.resolution == width and list(buckets.t) == [T0 * NS]
    assert (buckets.min[0], buckets.max[0], buckets.count[0]) == (0, 181, 182)
    first = n - RAW_POINTS  # the oldest update the raw ring holds
    rows = rest[0] if len(rest) == 1 else None
    assert rows is not None and rows.resolution == 0
    assert rows.gap[0] and math.isnan(rows.value[0]) and rows.status[0] == wire.GapKind.SEAM
    assert rows.t[0] == (T0 + 10) * NS  # where the buckets end: the missing updates start there
    assert list(rows.value[1:]) == list(range(first, n - 1)) and not rows.gap[1:].any()
    # An array channel's the same, its gap row a row of NaN elements.
    store = HistoryStore(1 << 26, 16)
    frames = store.attach("ca://WAVE")
    assert frames is not None
    for i in range(n):
        t = start + i * (NS // 999)
        frames.record(frame(i), t // NS, t % NS, 0, 0)  # as record_999_hz
    buckets, rows = frames.backfill((T0 - 50) * NS)
    assert buckets.resolution == width and buckets.count[0] == 182
    assert rows.gap[0] and rows.status[0] == wire.GapKind.SEAM and rows.t[0] == (T0 + 10) * NS
    assert rows.value.shape == (RAW_POINTS, 16) and np.isnan(rows.value[0]).all()
    assert list(rows.value[1:, 0]) == list(range(first, n - 1))
    # Updates that all are in rows, whole buckets or points, need no such row.
    h = ChannelHistory("ca://SLOW")
    record_counter(h, RAW_POINTS + 100, step_ns=10 * NS)  # one per bucket: none is split
    buckets, points = h.backfill(0)
    assert buckets.max[-1] + 1 == points.value[0] and not points.gap.any()


def test_a_history_query_counts_every_update_where_a_backfill_has_its_seam() -> None:
    """GraphQL `history` has no such seam: it answers from the raw ring alone, when that
    reaches back to `since`, else from one tier alone, whose buckets hold every update."""
    h = ChannelHistory("ca://COUNTER")
    n = 3 * 999
    record_999_hz(h, n)
    for since, max_points in [((T0 - 50) * NS, 1000), ((T0 - 50) * NS, 5000), (0, 10)]:
        got = h.query(since, 2**62, max_points)
        assert got.resolution == TIERS[0][0] and int(got.count.sum()) == n
    inside = h.query((T0 + 11) * NS, 2**62, 5000)  # the ring does not reach back to it
    assert list(inside.t) == [(T0 + 10) * NS] and inside.count[0] == n - 182
    recent = h.query((T0 + 12) * NS, 2**62, 5000)  # it does
    assert recent.resolution == 0 and recent.value[-1] == n - 1
    assert recent.t[0] >= (T0 + 12) * NS > h.raw().t[0]


def test_strings_and_arrays_are_not_recorded() -> None:
    h = ChannelHistory("ca://S")
    h.record("text", T0, 0, 0, 0)
    h.record(np.arange(3.0), T0, 0, 0, 0)
    assert h.n == 0 and not h.numeric
    h.record(np.float32(1.5), T0, 0, 0, 0)
    h.record(True, T0, 1, 0, 0)
    assert list(h.query(*EVERYTHING).value) == [1.5, 1.0]


async def test_a_channel_records_what_record_records(hub: Hub) -> None:
    """Channel.on_update writes values of a checked type through the store's journal's writer
    itself, without `record`: over 2.5 rings of mixed types, alarms, a string and gaps,
    it keeps what a bare history's `record` keeps. One channel alone puts more than
    AGGREGATE_EVERY points in the journal between two gaps: the flush's one-at-a-time path."""
    client = HubClient(hub)
    attach(client, hub, ["fake://a"])
    channel = hub.registry.channels["fake://a"]
    inline = channel.recorder
    assert inline is not None
    checked = ChannelHistory("fake://a")
    # A day ahead, on a 5 min boundary: an IOC clock ahead of ours stamps each gap 1 ns after
    # the last point (not with our clock), so both histories hold the very same times.
    start = (time.time_ns() // NS + 86_400) // 300 * 300 * NS
    n = RAW_POINTS * 5 // 2
    for i in range(n):
        t = start + i * NS // 10
        value: object = float(i) if i % 300 else i  # the type changes now and then
        if i == 700:
            value = "text"  # not kept; the next number is
        severity, status = (2, 7) if i % 97 == 0 else (0, 0)
        if i in (400, 2000):
            channel.on_connection(ConnState.DISCONNECTED)
            channel.on_connection(ConnState.CONNECTED)
            checked.mark_gap()
        channel.on_update(value, t // NS, t % NS, severity, status, "")  # type: ignore[arg-type]
        checked.record(value, t // NS, t % NS, severity, status)
    assert channel.recorder is inline and inline.wrapped and inline.kind is float
    got, want = inline.points(), checked.points()
    assert got["gap"].sum() == 1 and got["stat"].max() == 7
    for column in ("t", "v", "sev", "stat", "gap"):
        np.testing.assert_array_equal(got[column], want[column])
    for max_points in (1000, 20):
        a, b = inline.query(0, 2**62, max_points), checked.query(0, 2**62, max_points)
        assert a.resolution == b.resolution > 0 and a.gap.any()
        for column in ("t", "value", "min", "max", "mean", "count", "severity", "gap"):
            np.testing.assert_array_equal(getattr(a, column), getattr(b, column))


def test_the_journal_keeps_what_bare_histories_keep_over_many_channels() -> None:
    """Interleaved updates of 40 channels through the store's journal (full flushes of ~400
    points per channel, the vectorised scatter, and flushes by reads and gaps) against 40 bare
    histories fed the same: the same points and buckets, across the rings' ends."""
    store = HistoryStore(64 * CHANNEL_BYTES)
    ids = [f"fake://c{k}" for k in range(40)]
    held = [h for cid in ids if (h := store.attach(cid)) is not None]
    assert len(held) == len(ids)
    bare = [ChannelHistory(cid) for cid in ids]
    start = (time.time_ns() // NS + 86_400) // 300 * 300 * NS
    for i in range(1100):  # 44,000 points: two full journals and a part
        t = start + i * NS // 10
        for k, (h, b) in enumerate(zip(held, bare, strict=True)):
            value = float(i * 40 + k)
            severity = 1 if (i + k) % 50 == 0 else 0
            h.record(value, t // NS, t % NS, severity, k)
            b.record(value, t // NS, t % NS, severity, k)
        if i == 600:
            held[3].mark_gap()  # flushes the journal first, as any read does
            bare[3].mark_gap()
    assert store.journal.j > 0  # some points still wait: the reads below flush them
    for h, b in zip(held, bare, strict=True):
        got, want = h.points(), b.points()
        assert h.wrapped and len(got) == RAW_POINTS
        for column in ("t", "v", "sev", "stat", "gap"):
            np.testing.assert_array_equal(got[column], want[column])
        a, c = h.query(0, 2**62, 20), b.query(0, 2**62, 20)
        for column in ("t", "value", "min", "max", "mean", "count", "severity", "gap"):
            np.testing.assert_array_equal(getattr(a, column), getattr(c, column))


def test_a_reclaimed_slot_s_new_channel_gets_none_of_the_old_points() -> None:
    store = HistoryStore(CHANNEL_BYTES)  # one slot
    old = store.attach("fake://old")
    assert old is not None
    old.record(1.0, T0, 0, 0, 0)
    old.record(2.0, T0 + 1, 0, 0, 0)
    store.detach(old)
    old.record(3.0, T0 + 2, 0, 0, 0)  # (a write after release: still the old channel's)
    new = store.attach("fake://new")
    assert new is not None and new.slot == old.slot and store.reclaimed == 1
    new.record(9.0, T0 + 5, 0, 0, 0)
    assert list(new.query(*EVERYTHING).value) == [9.0]


def test_a_channel_s_buffers_cost_what_the_store_counts() -> None:
    h = ChannelHistory("ca://X")
    tiers = [h.tier]  # the finest; the others hang from it by `next`
    while (coarser := tiers[-1].next) is not None:
        tiers.append(coarser)
    held = h._t.nbytes + h._v.nbytes + h._a.nbytes + sum(t.data.nbytes for t in tiers)
    assert held == CHANNEL_BYTES


# --- the budget -------------------------------------------------------------------------------


def test_a_full_store_reclaims_the_channel_released_longest_ago() -> None:
    store = HistoryStore(3 * CHANNEL_BYTES)
    a, b, c = (store.attach(x) for x in "abc")
    assert a and b and c
    store.detach(b)
    store.detach(a)  # released after b
    d = store.attach("d")
    assert d is not None and store.get("b") is None and store.get("a") is a
    assert store.stats().reclaimed == 1 and store.stats().used_bytes == 3 * CHANNEL_BYTES


def test_a_store_full_of_monitored_channels_refuses_and_counts() -> None:
    store = HistoryStore(2 * CHANNEL_BYTES + CHANNEL_BYTES // 2)
    assert store.attach("a") and store.attach("b")
    assert store.attach("c") is None
    stats = store.stats()
    assert (stats.refused, stats.channels, stats.monitored) == (1, 2, 2)
    assert stats.used_bytes <= stats.budget_bytes


class CountedReads(ChannelHistory):
    """A history that counts how often the store asks whether it is monitored."""

    reads = 0

    @property
    def attached(self) -> bool:
        CountedReads.reads += 1
        return self._attached

    @attached.setter
    def attached(self, value: bool) -> None:
        self._attached = value


def test_channels_past_a_budget_full_of_monitored_ones_are_refused_without_a_scan_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counted, not timed: each refusal once looked at every monitored history (20,000 channels
    opened at once by one address held the loop for seconds)."""
    monkeypatch.setattr("pvwire.core.history.store.ChannelHistory", CountedReads)
    held = 50
    store = HistoryStore(held * CHANNEL_BYTES)
    first = [store.attach(f"a{i}") for i in range(held)]
    assert all(first)
    CountedReads.reads = 0
    assert all(store.attach(f"b{i}") is None for i in range(1_000))
    assert store.stats().refused == 1_000
    assert CountedReads.reads <= 2 * held, CountedReads.reads  # one scan, not one per channel
    # A release makes room again, found by a scan as before.
    released = first[7]
    assert released is not None
    store.detach(released)
    assert store.attach("c") is not None and store.get("a7") is None


def test_a_released_channel_keeps_its_history_and_continues_it() -> None:
    store = HistoryStore(CHANNEL_BYTES)
    h = store.attach("a", pinned=False)
    assert h is not None
    record_counter(h, 3)
    store.detach(h)
    again = store.attach("a")
    assert again is h
    assert list(store.query("a", *EVERYTHING).gap) == [False, False, False, True]


def test_pinned_histories_are_never_reclaimed() -> None:
    store = HistoryStore(CHANNEL_BYTES)
    h = store.attach("a", pinned=True)
    assert h is not None
    store.detach(h)
    assert store.attach("b") is None and store.get("a") is h


def test_no_budget_no_history() -> None:
    store = HistoryStore(0)
    assert store.attach("a") is None
    with pytest.raises(NoHistory, match="no history of a"):
        store.query("a", *EVERYTHING)


# --- wired into channels, views and the registry ----------------------------------------------


async def test_a_subscribed_channel_records_and_its_release_ends_with_a_gap(
    hub: Hub, backend: FakeBackend
) -> None:
    client = HubClient(hub)
    att = attach(client, hub, ["fake://a"])
    for i in range(5):
        backend.update("a", float(i), t=T0 + i)
    cid, got = hub.history("fake://a", *EVERYTHING, ANONYMOUS)
    assert cid == "fake://a" and list(got.value) == [0, 1, 2, 3, 4]
    backend.sinks["a"].on_connection(ConnState.DISCONNECTED)
    backend.connect("a")
    backend.update("a", 9.0, t=T0 + 10**6)
    assert list(hub.history("fake://a", *EVERYTHING, ANONYMOUS)[1].gap) == [False] * 5 + [
        True,
        False,
    ]
    client.send(17, 2, att)  # DETACH
    client.drain()
    await eventually_async(lambda: "fake://a" not in hub.registry.channels)
    kept = hub.history_store.get("fake://a")
    assert kept is not None and not kept.attached
    assert hub.snapshot().history.monitored == 0 and hub.snapshot().history.channels == 1


async def test_every_channel_writes_through_its_store_s_one_write(
    hub: Hub, backend: FakeBackend
) -> None:
    """The channels of a store call one bound `write` (Journal.write), not one of their own
    each: an object per channel was one more cold fetch per update (core/history/)."""
    client = HubClient(hub)
    attach(client, hub, ["fake://a", "fake://b"])
    a, b = (hub.registry.channels[f"fake://{name}"] for name in "ab")
    assert a.history_kind is None  # nothing checked yet: the first value goes through `record`
    backend.update("a", 0.5)
    backend.update("b", 1.5)
    assert a.history_kind is b.history_kind is float
    assert a.history_write is b.history_write is hub.history_store.journal.write
    backend.update("a", 2.5)  # through that one write, by the fast path
    got = hub.history("fake://a", *EVERYTHING, ANONYMOUS)[1]
    assert list(got.value) == [0.5, 2.5]


async def test_an_update_waits_in_its_channel_for_the_tick_or_a_read(
    hub: Hub, backend: FakeBackend
) -> None:
    """A checked value's update is written at the tick, in one batch for every dirty channel
    (core/channel.py); a second update before the tick writes the first, and a read (history,
    backfill, a gap) writes what waits first, so no reader ever misses an update."""
    client = HubClient(hub)
    attach(client, hub, ["fake://a"])
    ch = hub.registry.channels["fake://a"]
    journal = hub.history_store.journal
    backend.update("a", 0.5, t=T0)  # the first value: checked by `record`, written at once
    hub.ticker.tick()
    j = journal.j
    backend.update("a", 1.5, t=T0 + 1)
    assert ch.history_pending and journal.j == j
    hub.ticker.tick()
    assert not ch.history_pending and journal.j == j + 1
    backend.update("a", 2.5, t=T0 + 2)
    backend.update("a", 3.5, t=T0 + 3)  # the same tick: 2.5 goes into the journal now
    assert ch.history_pending and journal.j == j + 2
    got = hub.history("fake://a", *EVERYTHING, ANONYMOUS)[1]
    assert list(got.value) == [0.5, 1.5, 2.5, 3.5] and not ch.history_pending
    backend.update("a", 4.5, t=T0 + 4)
    ch.on_connection(ConnState.DISCONNECTED)  # the waiting update first, then the gap
    got = hub.history("fake://a", *EVERYTHING, ANONYMOUS)[1]
    assert list(got.value[:5]) == [0.5, 1.5, 2.5, 3.5, 4.5] and list(got.gap) == [False] * 5 + [
        True
    ]


async def test_a_recording_failure_stops_that_history_only(hub: Hub, backend: FakeBackend) -> None:
    client = HubClient(hub)
    att = attach(client, hub, ["fake://a", "fake://b"])
    ch = hub.registry.channels["fake://a"]
    assert ch.recorder is not None
    backend.update("a", 0.5)
    backend.update("b", 3.5)
    assert ch.recorder.kind is float  # the next float is written by the channel itself
    backend.update("a", 1.0, severity=300)  # a severity the ring cannot hold: recording raises
    backend.update("b", 4.0)  # after it in the tick's batch, which goes on past the refusal
    assert ch.history_pending and ch.recorder is not None  # written at the tick
    hub.ticker.tick()
    assert ch.recorder is None and ch.value == 1.0 and not ch.history_pending
    # The fast path in on_update tests history_kind alone: it is None now, so nothing more is
    # written for this channel.
    assert ch.history_kind is None and ch.history_write is None
    assert hub.snapshot().failures["history"] == 1
    backend.update("a", 2.0)
    hub.ticker.tick()
    frames = client.drain()
    assert 2.0 in values(frames, att)
    backend.update("b", 5.0)
    assert list(hub.history("fake://b", *EVERYTHING, ANONYMOUS)[1].value) == [3.5, 4.0, 5.0]
    with pytest.raises(NoHistory, match="recording it failed"):
        hub.history("fake://a", *EVERYTHING, ANONYMOUS)


async def test_a_failure_writing_the_tick_s_updates_costs_no_frame(
    hub: Hub, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = HubClient(hub)
    att = attach(client, hub, ["fake://a"])
    backend.update("a", 0.5)
    hub.ticker.tick()
    client.drain()

    def broken(channels: list[object]) -> None:
        raise RuntimeError("broken")

    monkeypatch.setattr(tick_module, "write_all_pending", broken)
    backend.update("a", 1.5)
    hub.ticker.tick()
    assert values(client.drain(), att) == [1.5]  # the frame went out
    assert hub.snapshot().failures["history"] == 1
    monkeypatch.undo()
    backend.update("a", 2.5)  # the update left pending is written before this one
    assert list(hub.history("fake://a", *EVERYTHING, ANONYMOUS)[1].value) == [0.5, 1.5, 2.5]


def test_only_a_server_with_a_budget_looks_for_updates_to_record(backend: FakeBackend) -> None:
    for mb, records in ((0.0, False), (1.0, True)):
        settings = Settings(default_scheme="fake", history_mb=mb)
        assert Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1")).ticker.records is records


async def test_metrics_show_the_budget_and_its_use(backend: FakeBackend) -> None:
    settings = Settings(default_scheme="fake", linger_s=0.0, history_mb=2 * CHANNEL_BYTES / 2**20)
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    hub.start()
    try:
        client = HubClient(hub)
        attach(client, hub, ["fake://a", "fake://b"])
        attach(client, hub, ["fake://c"])  # the budget holds two
        text = render_metrics(hub.snapshot(detail=False))
    finally:
        await hub.stop()
    assert samples(text, "pvwire_history_bytes") == {"": str(2 * CHANNEL_BYTES)}
    assert samples(text, "pvwire_history_budget_bytes") == {"": str(2 * CHANNEL_BYTES)}
    assert samples(text, "pvwire_history_refused_total") == {"": "1"}
    assert samples(text, "pvwire_history_channels") == {
        'monitored="true"': "2",
        'monitored="false"': "0",
    }


# --- backfill: HISTORY before the snapshot ------------------------------------------------------


def columns(msg: list[object]) -> list[np.ndarray]:
    """A HISTORY message's columns, padding nils skipped."""
    assert msg[0] == 8
    cols = [c for c in msg[4] if c is not None]  # type: ignore[attr-defined]
    assert len(cols) == 7 and all(isinstance(c, np.ndarray) for c in cols)
    return cols


def joined(msgs: list[list[object]]) -> list[np.ndarray]:
    """The columns of several HISTORY messages of one channel, end to end."""
    parts = [columns(m) for m in msgs]
    return [np.concatenate([p[k] for p in parts]) for k in range(7)]


def attach_with_backfill(hub: Hub, ids: list[str], seconds: float) -> list[list[Any]]:
    client = HubClient(hub)
    client.send(16, 1, hub.signer.issue(ids, backfill=seconds).token)
    return [m for m in client.drain() if m[0] != 0]  # after HELLO


async def test_backfill_is_the_past_before_the_snapshot_with_no_gap_or_duplicate(
    hub: Hub, backend: FakeBackend
) -> None:
    watcher = HubClient(hub)
    att = attach(watcher, hub, ["fake://a"])  # the channel records from its first subscriber
    now = int(time.time())
    for i in range(20):
        backend.update("a", float(i), t=now - 20 + i)
    client = HubClient(hub)
    client.send(16, 1, hub.signer.issue(["fake://a"], backfill=60).token)
    msgs = [m for m in client.drain() if m[0] != 0]  # after HELLO
    assert [m[0] for m in msgs] == [1, 8, 2]  # ATTACHED, HISTORY, SNAPSHOT
    _, hatt, sid, resolution, _ = msgs[1]
    assert (hatt, sid, resolution) == (msgs[0][2], 0, 0)
    t, value, low, high, _, _, gap = columns(msgs[1])
    # Every update but the current one, which the snapshot carries: no gap, no duplicate.
    assert list(value) == [float(i) for i in range(19)]
    assert list(t) == [(now - 20 + i) * NS for i in range(19)]
    assert not gap.any() and list(low) == list(value) == list(high)
    snapshot = msgs[2]
    assert snapshot[1] == 1  # HISTORY is not counted by seq
    (entry,) = snapshot[3]
    assert entry[2] == 19.0 and entry[4] == now - 1
    # Live updates follow the snapshot with their serials, exactly as without backfill.
    backend.update("a", 20.0, t=now)
    hub.ticker.tick()
    assert values(client.drain(), msgs[0][2]) == [20.0]
    assert values(watcher.drain(), att)[-1] == 20.0


async def test_backfill_reaches_past_the_raw_ring_with_whole_buckets_first(
    hub: Hub, backend: FakeBackend
) -> None:
    attach(HubClient(hub), hub, ["fake://a"])
    now = time.time_ns() // NS // 10 * 10 - 3  # the ring's first point is no bucket's first
    n = 2 * RAW_POINTS  # one point a second: older than the raw ring by RAW_POINTS s
    for i in range(n):
        backend.update("a", float(i), t=now - n + i)
    msgs = attach_with_backfill(hub, ["fake://a"], 3600)
    kinds = [m[0] for m in msgs]
    assert kinds[0] == 1 and kinds[-1] == 2 and set(kinds[1:-1]) == {8}
    width = TIERS[0][0]
    # The buckets first, then the points; several messages, none over HISTORY_MESSAGE_ROWS.
    resolutions = [m[3] for m in msgs[1:-1]]
    assert resolutions == sorted(resolutions, reverse=True) and resolutions[0] == width
    assert all(len(columns(m)[0]) <= HISTORY_MESSAGE_ROWS for m in msgs[1:-1])
    bt, _, blow, bhigh, *_ = joined([m for m in msgs[1:-1] if m[3] == width])
    pt, pvalue, *_, pstatus, pgap = joined([m for m in msgs[1:-1] if m[3] == 0])
    # Whole buckets, then a gap row where they end: the bucket that holds the ring's first
    # point also holds updates the ring no longer has, which are in no row (the seam).
    assert pgap[0] == 1 and pstatus[0] == wire.GapKind.SEAM and pt[0] == bt[-1] + width
    assert math.isnan(pvalue[0]) and not pgap[1:].any()
    assert list(pvalue[1:]) == [float(i) for i in range(RAW_POINTS, n - 1)]
    assert bhigh[-1] < pvalue[1] and blow[0] == 0.0


async def test_backfill_of_a_disconnected_channel_ends_with_its_gap(
    hub: Hub, backend: FakeBackend
) -> None:
    attach(HubClient(hub), hub, ["fake://a", "fake://b"])
    now = int(time.time())
    for i in range(3):
        backend.update("a", float(i), t=now - 5 + i)
    backend.sinks["a"].on_connection(ConnState.DISCONNECTED)
    msgs = attach_with_backfill(hub, ["fake://a", "fake://b"], 60)
    assert [m[0] for m in msgs] == [1, 8, 2]  # b has no history: no HISTORY for it
    _, value, *_, gap = columns(msgs[1])
    assert list(gap) == [0, 0, 0, 1] and list(value[:3]) == [0.0, 1.0, 2.0]
    assert math.isnan(value[3])


async def test_a_token_without_backfill_gets_no_history(hub: Hub, backend: FakeBackend) -> None:
    attach(HubClient(hub), hub, ["fake://a"])
    backend.update("a", 1.0, t=int(time.time()))
    backend.update("a", 2.0, t=int(time.time()))
    assert [m[0] for m in attach_with_backfill(hub, ["fake://a"], 0)] == [1, 2]


# --- small arrays (opt-in: --history-array-max) -------------------------------------------------


def frame(i: int, n: int = 16) -> np.ndarray:
    """Frame i of a test waveform: element k is i for even k and -i for odd k, plus k."""
    k = np.arange(n)
    return (np.where(k % 2 == 0, i, -i) + k).astype(np.int32)


def record_frames(h: ChannelHistory, n: int, start: int = 0, width: int = 16) -> None:
    for i in range(start, start + n):
        t = T0 * NS + i * (NS // 10)
        h.record(frame(i, width), t // NS, t % NS, 1 if i % 7 == 0 else 0, 5 if i % 7 == 0 else 0)


def array_store(budget: int = 1 << 26, array_max: int = 16) -> HistoryStore:
    return HistoryStore(budget, array_max)


def test_array_frames_come_back_whole_with_their_times_and_alarms() -> None:
    store = array_store()
    h = store.attach("ca://W")
    assert h is not None
    record_frames(h, 50)
    got = store.query("ca://W", *EVERYTHING)
    assert got.resolution == 0 and got.value.shape == (50, 16) and got.value.dtype == np.float64
    np.testing.assert_array_equal(got.value, [frame(i) for i in range(50)])
    assert list(got.t) == [T0 * NS + i * (NS // 10) for i in range(50)]
    assert (got.severity[7], got.status[7], got.severity[8], got.status[8]) == (1, 5, 0, 0)
    assert got.min is got.value and np.isnan(got.mean).all() and not got.gap.any()
    assert h.kind is None and h.n == 0  # nothing went to the scalar ring


def test_array_buckets_hold_the_last_frame_and_element_wise_min_and_max() -> None:
    store = array_store()
    h = store.attach("ca://W")
    assert h is not None
    n = RAW_POINTS * 3  # the oldest frames left the raw ring
    record_frames(h, n)
    got = store.query("ca://W", T0 * NS, 2**62, 1000)
    width = TIERS[0][0]
    per = width // (NS // 10)
    assert got.resolution == width and got.value.shape == (len(got), 16)
    assert list(got.count[:-1]) == [per] * (len(got) - 1) and int(got.count.sum()) == n
    k = np.arange(16)
    # Bucket 1 holds frames per..2*per-1: even elements rise, odd ones fall.
    lo, hi = per, 2 * per - 1
    np.testing.assert_array_equal(got.min[1], np.where(k % 2 == 0, lo, -hi) + k)
    np.testing.assert_array_equal(got.max[1], np.where(k % 2 == 0, hi, -lo) + k)
    np.testing.assert_array_equal(got.value[1], frame(hi))
    assert got.severity[1] == 1 and np.isnan(got.mean).all()
    coarse = store.query("ca://W", T0 * NS, 2**62, 2)  # the 5 min tier
    assert coarse.resolution == TIERS[1][0] and int(coarse.count.sum()) == n
    np.testing.assert_array_equal(np.fmax.reduce(coarse.max), np.where(k % 2 == 0, n - 1, 0) + k)
    np.testing.assert_array_equal(np.fmin.reduce(coarse.min), np.where(k % 2 == 0, 0, 1 - n) + k)
    np.testing.assert_array_equal(coarse.value[-1], frame(n - 1))


def test_an_array_gap_is_a_row_of_its_own_once() -> None:
    store = array_store()
    h = store.attach("ca://W")
    assert h is not None
    record_frames(h, 5)
    h.mark_gap()
    h.mark_gap()
    record_frames(h, 5, start=10**10)
    got = store.query("ca://W", *EVERYTHING)
    assert list(got.gap) == [False] * 5 + [True] + [False] * 5
    assert np.isnan(got.value[5]).all() and got.count[5] == 0 and got.severity[5] == 3
    assert store.query("ca://W", 0, 2**62, 3).gap.any()


@pytest.mark.parametrize(
    ("array_max", "value", "why"),
    [
        (0, np.arange(4.0), r"only with --history-array-max \(it is 0\)"),
        (16, np.arange(17.0), r"array of 17 elements is longer than --history-array-max \(16\)"),
        (16, np.zeros((2, 2)), "1-D numeric"),
        (16, np.array(["a", "b"]), "1-D numeric"),
        (16, "text", "only numbers"),
    ],
)
def test_arrays_not_kept_say_why(array_max: int, value: object, why: str) -> None:
    store = array_store(array_max=array_max)
    h = store.attach("ca://W")
    assert h is not None
    h.record(value, T0, 0, 0, 0)
    with pytest.raises(NoHistory, match=why):
        store.query("ca://W", *EVERYTHING)
    assert h.arrays is None and store.stats().used_bytes == CHANNEL_BYTES


def test_a_longer_frame_breaks_the_line_and_another_length_starts_again() -> None:
    store = array_store()
    h = store.attach("ca://W")
    assert h is not None
    record_frames(h, 3)
    h.record(np.arange(40.0), T0 + 1, 0, 0, 0)  # longer than 16: not kept, a gap instead
    got = store.query("ca://W", *EVERYTHING)
    assert list(got.gap) == [False] * 3 + [True]
    record_frames(h, 2, start=20, width=8)  # another width: the array history starts again
    got = store.query("ca://W", *EVERYTHING)
    assert got.value.shape == (2, 8) and h.arrays is not None
    assert store.stats().used_bytes == CHANNEL_BYTES + h.arrays.nbytes


def test_an_array_channel_costs_its_allocated_bytes_under_a_per_channel_cap() -> None:
    store = array_store(array_max=HISTORY_ARRAY_LIMIT)
    for width in (1, 16, HISTORY_ARRAY_LIMIT):
        h = store.attach(f"ca://W{width}")
        assert h is not None
        h.record(np.zeros(width), T0, 0, 0, 0)
        arrays = h.arrays
        assert arrays is not None
        held = arrays._t.nbytes + arrays._v.nbytes + arrays._a.nbytes
        tiers = [arrays.tier]
        while (coarser := tiers[-1].next) is not None:
            tiers.append(coarser)
        for tier in tiers:
            held += sum(getattr(tier, f).nbytes for f in ("t", "last", "lo", "hi", "count", "sev",
                        "gap", "o_last", "o_lo", "o_hi"))  # fmt: skip
        assert arrays.nbytes == held == array_bytes(width)
        assert held <= HISTORY_ARRAY_BYTES + 3 * 8 * width * len(TIERS)
        assert h.nbytes == CHANNEL_BYTES + held
    frames, sizes = array_sizes(16)
    assert (frames, sizes) == (RAW_POINTS, tuple(size for _, size in TIERS))  # 16: all of it
    frames, sizes = array_sizes(HISTORY_ARRAY_LIMIT)
    assert frames < RAW_POINTS and all(s < size for s, (_, size) in zip(sizes, TIERS, strict=True))
    assert store.stats().used_bytes == sum(
        x.nbytes for x in (store.get(f"ca://W{w}") for w in (1, 16, HISTORY_ARRAY_LIMIT)) if x
    )


def test_arrays_reclaim_the_history_released_longest_ago_then_are_refused() -> None:
    arrays = ArrayHistory(16).nbytes
    assert arrays > CHANNEL_BYTES  # ~400 KB against ~47 KB: a frame is 16 numbers
    store = array_store(budget=2 * CHANNEL_BYTES + arrays + CHANNEL_BYTES // 2)
    old, older, a = store.attach("old"), store.attach("older"), store.attach("a")
    assert old and older and a
    store.detach(older)
    store.detach(old)  # released after `older`
    a.record(frame(1), T0, 0, 0, 0)  # its arrays need the room of one history
    assert a.arrays is not None and store.get("older") is None and store.get("old") is old
    b = store.attach("b")  # a new history: `old` goes
    assert b is not None and store.get("old") is None and store.stats().reclaimed == 2
    for i in range(3):  # only monitored histories left: refused, counted once
        b.record(frame(i), T0 + i, 0, 0, 0)
    assert b.arrays is None and store.stats().refused == 1
    with pytest.raises(NoHistory, match="no room for its arrays"):
        store.query("b", *EVERYTHING)
    stats = store.stats()
    assert stats.used_bytes == 2 * CHANNEL_BYTES + arrays <= stats.budget_bytes
    store.detach(a)  # `a` is released: b, opened again, finds room for its arrays
    assert store.attach("b") is b
    b.record(frame(5), T0 + 5, 0, 0, 0)
    assert b.arrays is not None and store.get("a") is None and store.stats().refused == 1
    assert store.stats().used_bytes == CHANNEL_BYTES + arrays


def test_the_array_limit_is_checked() -> None:
    with pytest.raises(ValueError, match="between 0 and 1,024"):
        HistoryStore(1 << 20, HISTORY_ARRAY_LIMIT + 1)


async def test_an_array_channel_records_through_the_hub_only_when_asked(
    backend: FakeBackend,
) -> None:
    for array_max, kept in ((16, True), (0, False)):
        settings = Settings(default_scheme="fake", linger_s=0.0, history_array_max=array_max)
        hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
        hub.start()
        try:
            attach(HubClient(hub), hub, ["fake://a", "fake://b"])
            for i in range(5):
                backend.update("a", frame(i), t=T0 + i)
                backend.update("b", float(i), t=T0 + i)
            assert list(hub.history("fake://b", *EVERYTHING, ANONYMOUS)[1].value) == [0, 1, 2, 3, 4]
            if kept:
                got = hub.history("fake://a", *EVERYTHING, ANONYMOUS)[1]
                np.testing.assert_array_equal(got.value, [frame(i) for i in range(5)])
                assert hub.snapshot().history.used_bytes > 2 * CHANNEL_BYTES
            else:
                with pytest.raises(NoHistory, match="--history-array-max"):
                    hub.history("fake://a", *EVERYTHING, ANONYMOUS)
                assert hub.snapshot().history.used_bytes == 2 * CHANNEL_BYTES
        finally:
            await hub.stop()


async def backfill_of_frames(
    backend: FakeBackend, n: int, seconds: float
) -> tuple[int, list[list[Any]]]:
    """`n` frames (frame(i)) recorded on fake://a one a second up to now (s, returned), then
    what a new attachment asking `seconds` of backfill gets."""
    settings = Settings(default_scheme="fake", linger_s=0.0, history_array_max=16)
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    hub.start()
    try:
        attach(HubClient(hub), hub, ["fake://a"])
        now = int(time.time())
        for i in range(n):
            backend.update("a", frame(i), t=now - n + i)
        return now, attach_with_backfill(hub, ["fake://a"], seconds)
    finally:
        await hub.stop()


async def test_an_array_channel_s_backfill_is_2d_before_the_snapshot_with_no_duplicate(
    backend: FakeBackend,
) -> None:
    now, msgs = await backfill_of_frames(backend, 20, 60)
    assert [m[0] for m in msgs] == [1, 8, 2]  # ATTACHED, HISTORY, SNAPSHOT
    assert msgs[1][3] == 0
    t, value, low, high, severity, status, gap = columns(msgs[1])
    assert value.shape == low.shape == high.shape == (19, 16) and value.dtype == np.float64
    assert t.shape == severity.shape == status.shape == gap.shape == (19,)
    np.testing.assert_array_equal(value, [frame(i) for i in range(19)])  # all but the current
    assert list(t) == [(now - 20 + i) * NS for i in range(19)]
    (entry,) = msgs[2][3]
    np.testing.assert_array_equal(entry[2], frame(19))  # the snapshot carries the current one


async def test_an_array_channel_s_backfill_counts_elements_against_the_message_bound(
    backend: FakeBackend,
) -> None:
    n = 3 * HISTORY_MESSAGE_ROWS // 16  # frames of 16 elements: three messages' worth
    now, msgs = await backfill_of_frames(backend, n, 3600)
    history = msgs[1:-1]
    assert [m[0] for m in history] == [8] * 3 and msgs[-1][0] == 2
    assert all(columns(m)[1].size <= HISTORY_MESSAGE_ROWS for m in history)  # rows x elements
    t, value, *_ = joined(history)
    np.testing.assert_array_equal(value, [frame(i) for i in range(n - 1)])
    assert list(t) == [(now - n + i) * NS for i in range(n - 1)]


def test_the_python_client_gives_an_array_channel_s_past_rows_as_arrays() -> None:
    store = array_store()
    h = store.attach("ca://W")
    assert h is not None
    record_frames(h, 4)
    h.mark_gap()
    (p,) = h.backfill(0)  # the points, ending with the gap
    msg = wire.encode_history(1, 0, 0, (p.t, p.value, p.min, p.max, p.severity, p.status, p.gap))
    decoded = client_wire.decode_message(msg)
    assert isinstance(decoded, client_wire.History) and decoded.value.shape == (5, 16)
    states = past_states(decoded, ChannelState(id="ca://W"), 0)
    assert [s.value is None for s, _, _ in states] == [False] * 4 + [True]
    for i, (state, _, t) in enumerate(states[:4]):
        assert isinstance(state.value, np.ndarray) and state.serial is None
        np.testing.assert_array_equal(state.value, frame(i))
        assert t == T0 * NS + i * (NS // 10)
