"""The history store (core/history.py) in memory: rings, tiers, gaps, the budget's policy, and
recording wired into channels and the registry through an in-memory hub."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from pvwire.access.identity import Identity
from pvwire.api.metrics import render_metrics
from pvwire.config import Settings
from pvwire.core.history import (
    CHANNEL_BYTES,
    NS,
    RAW_POINTS,
    TIERS,
    ChannelHistory,
    HistoryStore,
    NoHistory,
)
from pvwire.core.hub import Hub
from pvwire.model import ConnState
from pvwire.wire.tokens import TokenSigner

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


def test_strings_and_arrays_are_not_recorded() -> None:
    h = ChannelHistory("ca://S")
    h.record("text", T0, 0, 0, 0)
    h.record(np.arange(3.0), T0, 0, 0, 0)
    assert h.n == 0 and not h.numeric
    h.record(np.float32(1.5), T0, 0, 0, 0)
    h.record(True, T0, 1, 0, 0)
    assert list(h.query(*EVERYTHING).value) == [1.5, 1.0]


async def test_a_channel_records_what_record_records(hub: Hub) -> None:
    """Channel.on_update writes values of a checked type itself (ChannelHistory.record's lines,
    inline): over 2.5 rings of mixed types, alarms, a string and gaps, both keep the same."""
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


def test_a_channel_s_buffers_cost_what_the_store_counts() -> None:
    h = ChannelHistory("ca://X")
    held = h._t.nbytes + h._v.nbytes + h._a.nbytes + sum(t.data.nbytes for t in _tiers(h))
    assert held == CHANNEL_BYTES


def _tiers(h: ChannelHistory) -> list[object]:
    out, tier = [], h.tier
    while tier is not None:
        out.append(tier)
        tier = tier.next
    return out


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


async def test_a_recording_failure_stops_that_history_only(hub: Hub, backend: FakeBackend) -> None:
    client = HubClient(hub)
    att = attach(client, hub, ["fake://a", "fake://b"])
    ch = hub.registry.channels["fake://a"]
    assert ch.recorder is not None
    backend.update("a", 0.5)
    assert ch.recorder.kind is float  # the next float is written by the channel itself
    backend.update("a", 1.0, severity=300)  # a severity the ring cannot hold: recording raises
    assert ch.recorder is None and ch.value == 1.0
    assert hub.snapshot().failures["history"] == 1
    backend.update("a", 2.0)
    hub.ticker.tick()
    frames = client.drain()
    assert 2.0 in values(frames, att)
    backend.update("b", 5.0)
    assert list(hub.history("fake://b", *EVERYTHING, ANONYMOUS)[1].value) == [5.0]
    with pytest.raises(NoHistory, match="recording it failed"):
        hub.history("fake://a", *EVERYTHING, ANONYMOUS)


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


def attach_with_backfill(hub: Hub, ids: list[str], seconds: float) -> list[list[object]]:
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
    now = time.time_ns() // NS
    n = 2 * RAW_POINTS  # one point a second: older than the raw ring by RAW_POINTS s
    for i in range(n):
        backend.update("a", float(i), t=now - n + i)
    msgs = attach_with_backfill(hub, ["fake://a"], 3600)
    assert [m[0] for m in msgs] == [1, 8, 8, 2]
    width = TIERS[0][0]
    assert msgs[1][3] == width and msgs[2][3] == 0
    bt, _, blow, bhigh, *_ = columns(msgs[1])
    pt, pvalue, *_ = columns(msgs[2])
    assert bt[-1] + width <= pt[0]  # whole buckets, ending before the first point
    assert list(pvalue) == [float(i) for i in range(RAW_POINTS, n - 1)]
    assert bhigh[-1] < pvalue[0] and blow[0] == 0.0


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
