"""The history journal's writers (core/history/): the compiled one (core/_journal.c), which the
server uses wherever `make ext` built it, and the Python one for a checkout where it is not
built, through the same cases: what they write, what they refuse, and that a refused point is
not counted."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from pvwire.core import _journal, history
from pvwire.core import channel as channel_module
from pvwire.core.channel import Channel, write_all_pending
from pvwire.core.history import (
    AGGREGATE_EVERY,
    NS,
    RAW_POINTS,
    ChannelHistory,
    HistoryStore,
    Journal,
    PyWriter,
)
from pvwire.model import ConnState

WRITERS = pytest.mark.parametrize("writer", [_journal.Writer, PyWriter], ids=["compiled", "python"])
Columns = tuple[
    npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.uint16], npt.NDArray[np.int32]
]


def columns(n: int) -> Columns:
    return (np.zeros(n, "<i8"), np.zeros(n, "<f8"), np.zeros(n, "<u2"), np.zeros(n, "<i4"))


def test_the_server_uses_the_compiled_writer() -> None:
    # `make test` builds it: a fallback to Python here would only show as a slower server.
    assert vars(history)["Writer"] is _journal.Writer  # not in history's __all__
    assert type(HistoryStore(1 << 20).journal.writer) is _journal.Writer


@WRITERS
def test_points_go_into_the_four_columns_in_order(writer: Callable[..., Any]) -> None:
    t, v, a, c = cols = columns(4)
    w = writer(*cols)
    assert w.size == 4 and w.j == 0
    full = [
        w.write(1.5, 1_700_000_000, 123_456_789, 0, 0, 7),
        w.write(2, 1_700_000_001, 0, 2, 7, 2_000),  # an int value
        w.write(True, 0, 999_999_999, 255, -1, 0),  # a status keeps its low byte, as in Python
        w.write(np.float32(0.25), -1, 5, 1, 300, 2**31 - 1),  # a numpy number; before 1970
    ]
    assert full == [False, False, False, True] and w.j == 4
    assert t.tolist() == [
        1_700_000_000 * NS + 123_456_789, 1_700_000_001 * NS, 999_999_999, -NS + 5,
    ]  # fmt: skip
    assert v.tolist() == [1.5, 2.0, 1.0, 0.25]
    assert a.tolist() == [0, 2 << 8 | 7, 255 << 8 | 0xFF, 1 << 8 | 300 & 0xFF]
    assert c.tolist() == [7, 2_000, 0, 2**31 - 1]


@WRITERS
def test_ints_of_any_size_convert_as_python_converts_them(writer: Callable[..., Any]) -> None:
    """Ints of more than one 30-bit digit (every time in seconds), big and negative int values,
    and numpy ints (through __index__) are written as float() and int() give them."""
    t, v, _a, c = cols = columns(3)
    w = writer(*cols)
    w.write(2**60 + 1, np.int64(1_700_000_002), np.int32(5), 0, 0, np.int16(9))
    w.write(-(2**53) - 1, 2**31, 2**30, 0, 0, 2**30)
    w.write(10**300, -(2**33), 0, 0, 0, 0)
    assert v.tolist() == [float(2**60 + 1), float(-(2**53) - 1), float(10**300)]
    assert t.tolist() == [1_700_000_002 * NS + 5, 2**31 * NS + 2**30, -(2**33) * NS]
    assert c.tolist() == [9, 2**30, 0]


@WRITERS
@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("text", 1, 0, 0, 0, 0), TypeError),
        ((None, 1, 0, 0, 0, 0), TypeError),
        ((1j, 1, 0, 0, 0, 0), TypeError),
        ((np.zeros(3), 1, 0, 0, 0, 0), TypeError),
        ((10**400, 1, 0, 0, 0, 0), ValueError),  # an int no double holds
        ((1.0, 1.5, 0, 0, 0, 0), TypeError),  # seconds must be an int
        ((1.0, 2**62, 0, 0, 0, 0), ValueError),  # past 2262 in ns
        ((1.0, 2**64, 0, 0, 0, 0), ValueError),  # past 64 bits before the ns
        ((1.0, 1, -(2**70), 0, 0, 0), ValueError),
        ((1.0, 1, 0, 256, 0, 0), ValueError),  # the alarm column holds severities 0..255
        ((1.0, 1, 0, -1, 0, 0), ValueError),
        ((1.0, 1, 0, 0, 0, 2**31), ValueError),  # the slot column is 32-bit
    ],
)
def test_a_refused_point_raises_and_is_not_counted(
    writer: Callable[..., Any], args: tuple[object, ...], error: type[Exception]
) -> None:
    w = writer(*columns(4))
    w.write(0.5, 1, 0, 0, 0, 3)
    with pytest.raises(error):
        w.write(*args)
    assert w.j == 1
    assert w.write(0.75, 2, 0, 0, 0, 3) is False and w.j == 2  # it goes on


@WRITERS
def test_a_full_writer_refuses_until_its_index_is_reset(writer: Callable[..., Any]) -> None:
    cols = columns(2)
    v = cols[1]
    w = writer(*cols)
    assert w.write(1.0, 1, 0, 0, 0, 0) is False
    assert w.write(2.0, 2, 0, 0, 0, 0) is True
    with pytest.raises(IndexError):
        w.write(3.0, 3, 0, 0, 0, 0)
    assert w.j == 2 and v.tolist() == [1.0, 2.0]
    w.j = 0  # as the flush does once it has taken the points
    assert w.write(4.0, 4, 0, 0, 0, 1) is False and v.tolist() == [4.0, 2.0]


@WRITERS
def test_columns_of_different_lengths_are_refused(writer: Callable[..., Any]) -> None:
    t, v, a, c = columns(4)
    with pytest.raises(ValueError, match="one length"):
        writer(t, v, a[:3], c)


@pytest.mark.parametrize("wrong", [0, 1, 2, 3])
def test_the_compiled_writer_takes_only_columns_of_its_types(wrong: int) -> None:
    """It writes through raw pointers: a column of another item size or type, or one it may
    not write, would be memory it does not own."""
    cols: list[npt.NDArray[Any]] = list(columns(4))  # of any type: the writer checks
    cols[wrong] = cols[wrong].astype("<f4" if wrong != 2 else "<i2")
    with pytest.raises(TypeError, match="must be a 1-D buffer"):
        _journal.Writer(*cols)
    cols = list(columns(4))
    cols[wrong].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _journal.Writer(*cols)
    cols = list(columns(8))
    cols[wrong] = cols[wrong][::2]  # not contiguous
    with pytest.raises(ValueError, match="not C-contiguous"):
        _journal.Writer(*cols)


def test_the_compiled_writer_keeps_its_columns_alive() -> None:
    t, v, a, c = columns(2)
    w = _journal.Writer(t, v, a, c)
    del t, v, a, c  # the writer holds the buffers: writing is still into live memory
    assert w.write(1.0, 1, 0, 0, 0, 0) is False and w.j == 1


@WRITERS
def test_a_journal_with_either_writer_fills_the_channels_rings_alike(
    writer: type[Any],
) -> None:
    """The same updates of 3 channels through a store's journal with each writer come back from
    the rings the same, across a full journal's flush."""
    store = HistoryStore(8 << 20)
    store.journal = Journal(store, writer)
    held = [store.attach(f"fake://{k}") for k in range(3)]
    n = history.JOURNAL_POINTS // 3 + 10  # more than one journal's worth in all
    for i in range(n):
        for k, h in enumerate(held):
            assert h is not None
            h.record(float(i * 3 + k), 1_700_000_000 + i, k, i % 3, k)
    for k, h in enumerate(held):
        assert h is not None
        p = h.points()
        assert len(p) == history.RAW_POINTS
        want = np.arange(n - history.RAW_POINTS, n)
        np.testing.assert_array_equal(p["v"], want * 3.0 + k)
        np.testing.assert_array_equal(p["t"], (1_700_000_000 + want) * NS + k)
        np.testing.assert_array_equal(p["sev"], want % 3)
        np.testing.assert_array_equal(p["stat"], np.full(len(want), k))


# --- the tick's batch: updates left in the channels (Channel.on_update), written at the tick ---


class Listener:
    """The ticker as a channel sees it: dirty channels in order, and failures counted."""

    def __init__(self) -> None:
        self.dirty: list[Channel] = []
        self.failures: list[str] = []

    def mark_dirty(self, channel: Channel) -> None:
        self.dirty.append(channel)

    def count_failure(self, unit: str) -> None:
        self.failures.append(unit)

    def count_dropped(self, n: int) -> None:
        raise AssertionError(f"{n} dropped: no ALL mode view here")

    def tick(self) -> None:
        """What Ticker.tick does with the dirty channels before it sends them."""
        dirty, self.dirty = self.dirty, []
        write_all_pending(dirty)
        for ch in dirty:
            ch.dirty = 0


def recording(store: HistoryStore, n: int, listener: Listener) -> list[Channel]:
    out = []
    for k in range(n):
        ch = Channel(f"fake://c{k}", None, f"c{k}", listener)  # type: ignore[arg-type]
        ch.record_into(store.attach(ch.id))
        out.append(ch)
    return out


# A day ahead: an IOC clock ahead of ours stamps each gap 1 ns after the last point (not with
# our clock), so a channel's history and a bare one fed the same hold the very same times.
AHEAD = time.time_ns() // NS + 86_400


def update(ch: Channel, value: object, i: int, severity: int = 0) -> None:
    ch.on_update(value, AHEAD + i, i, severity, 3, "")  # type: ignore[arg-type]


BATCHES = pytest.mark.parametrize("batch", ["compiled", "python"])


@pytest.fixture
def use_batch(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """`batch`: the compiled Pending.write (what the server uses) or the Python fallback."""
    if request.getfixturevalue("batch") == "python":
        monkeypatch.setattr(channel_module, "_write_batch", channel_module._python_batch)


def test_the_server_uses_the_compiled_batch() -> None:
    assert getattr(channel_module._write_batch, "__self__", None).__class__ is _journal.Pending


def test_the_batch_writes_each_pending_update_in_list_order() -> None:
    store, listener = HistoryStore(8 << 20), Listener()
    chans = recording(store, 3, listener)
    for k, ch in enumerate(chans):
        update(ch, float(k), 0)  # a first value: checked by `record` and written at once
    assert store.journal.j == 3 and not any(ch.history_pending for ch in chans)
    listener.tick()  # nothing pending: the tick writes nothing
    assert store.journal.j == 3
    for k, ch in reversed(list(enumerate(chans))):
        update(ch, 10.0 + k, 1, severity=k)
    assert store.journal.j == 3 and all(ch.history_pending for ch in chans)
    batch = _journal.Pending(Channel).write
    assert batch(listener.dirty, 0) == 3
    assert store.journal.j == 6 and not any(ch.history_pending for ch in chans)
    t, v, a, c = (col[3:6].tolist() for col in (store.journal._t, store.journal._v,
                                                 store.journal._a, store.journal._c))  # fmt: skip
    assert v == [12.0, 11.0, 10.0]  # the order they became dirty in
    assert t == [(AHEAD + 1) * NS + 1] * 3
    assert a == [2 << 8 | 3, 1 << 8 | 3, 3]
    assert c == [chans[2].history_slot, chans[1].history_slot, chans[0].history_slot]
    assert batch(listener.dirty, 0) == 3 and store.journal.j == 6  # nothing pending: nothing


def test_the_batch_stops_after_a_point_that_fills_the_journal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(history, "JOURNAL_POINTS", 4)
    store, listener = HistoryStore(8 << 20), Listener()
    chans = recording(store, 3, listener)
    for ch in chans:
        update(ch, 1.0, 0)
    listener.tick()
    for ch in chans:
        update(ch, 2.0, 1)
    batch = _journal.Pending(Channel).write
    assert batch(listener.dirty, 0) == -1  # channel 0's point filled it: flush, then go on
    assert store.journal.j == 4 and not chans[0].history_pending and chans[1].history_pending
    chans[0].flush_journal()
    assert store.journal.j == 0
    assert batch(listener.dirty, 1) == 3 and store.journal.j == 2
    for ch in chans:
        update(ch, 3.0, 2)  # and once more, through what the tick calls, which flushes itself
    listener.tick()
    assert store.journal.j == 1 and not any(ch.history_pending for ch in chans)
    for ch in chans:
        assert ch.recorder is not None
        assert ch.recorder.points()["v"].tolist() == [1.0, 2.0, 3.0]


def test_the_batch_leaves_to_python_what_it_cannot_write() -> None:
    """Another class, a Python writer, a value the encoder failed since, a point the writer
    refuses: the batch answers that channel's index, and has changed nothing of it."""

    class Sub(Channel):
        __slots__ = ()

    store, listener = HistoryStore(8 << 20), Listener()
    py_store = HistoryStore(8 << 20)
    py_store.journal = Journal(py_store, PyWriter)
    plain = recording(store, 3, listener)
    sub = Sub("fake://sub", None, "sub", listener)  # type: ignore[arg-type]
    sub.record_into(store.attach(sub.id))
    in_python = Channel("fake://py", None, "py", listener)  # type: ignore[arg-type]
    in_python.record_into(py_store.attach(in_python.id))
    chans = [plain[0], sub, in_python, plain[1], plain[2]]
    for ch in chans:
        update(ch, 1.0, 0)
    for ch in chans:
        update(ch, 2.0, 1)
    plain[1].value = None  # as Channel._fail leaves it
    plain[2].severity = 300  # refused by the writer
    batch = _journal.Pending(Channel).write
    j = store.journal.j
    assert batch(chans, 0) == 1 and store.journal.j == j + 1  # plain[0] written; sub left
    for i in (1, 2, 3, 4):
        assert batch(chans, i) == i and chans[i].history_pending
    assert store.journal.j == j + 1 and py_store.journal.j == 1
    write_all_pending(chans)
    assert not any(ch.history_pending for ch in chans)
    assert sub.recorder is not None and sub.recorder.points()["v"].tolist() == [1.0, 2.0]
    assert in_python.recorder is not None
    assert in_python.recorder.points()["v"].tolist() == [1.0, 2.0]
    failed = plain[1].recorder
    assert failed is not None and failed.points()["v"].tolist() == [1.0]  # not kept: no value
    assert plain[2].recorder is None and listener.failures == ["history"]  # stopped, counted


def test_the_batch_takes_only_a_class_with_these_slots() -> None:
    with pytest.raises(AttributeError):
        _journal.Pending(int)

    class Props(Channel):
        history_pending = property(lambda self: True)

    with pytest.raises(TypeError, match="not a writable slot of its own"):
        _journal.Pending(Props)
    with pytest.raises(TypeError):
        _journal.Pending(Channel).write((), 0)  # type: ignore[arg-type]  # a list only


@BATCHES
@pytest.mark.parametrize("writer", [_journal.Writer, PyWriter], ids=["compiled", "python"])
@pytest.mark.usefixtures("use_batch")
def test_updates_left_for_the_tick_are_recorded_as_record_records_them(
    batch: str, writer: type[Any]
) -> None:
    """30 channels, 3,000 updates in a random order with ticks between random ones (so some
    channels update several times between two ticks, and some not at all), a string, type
    changes and disconnects among them: each channel's history holds what a bare history's
    `record` holds, fed the same updates."""
    rng = np.random.default_rng(7)
    store, listener = HistoryStore(8 << 20), Listener()
    store.journal = Journal(store, writer)
    chans = recording(store, 30, listener)
    bare = [ChannelHistory(ch.id) for ch in chans]
    for i in range(3000):
        k = int(rng.integers(30))
        ch, h = chans[k], bare[k]
        if rng.random() < 0.01:
            ch.on_connection(ConnState.DISCONNECTED)
            ch.on_connection(ConnState.CONNECTED)
            h.mark_gap()
        value: object = float(i) if i % 200 else (i if i % 400 else "text")
        severity = int(rng.integers(3))
        update(ch, value, i, severity)
        h.record(value, AHEAD + i, i, severity, 3)
        if rng.random() < 0.05:
            listener.tick()
    for ch, h in zip(chans, bare, strict=True):
        assert ch.recorder is not None
        got, want = ch.recorder.points(), h.points()
        for column in ("t", "v", "sev", "stat", "gap"):
            np.testing.assert_array_equal(got[column], want[column])
    assert listener.failures == []


# --- the flush's compiled steps: Rings (moving ring indexes on) and fold (into the tiers) ------


def journal_of(points: list[tuple[int, float]]) -> Columns:
    """Journal columns holding (slot, value) points, at times 1 s apart."""
    t, v, a, c = cols = columns(len(points) + 3)  # longer than n, as the journal's are
    for j, (slot, value) in enumerate(points):
        t[j], v[j], a[j], c[j] = (AHEAD + j) * NS, value, 1 << 8, slot
    return cols


def test_the_compiled_flush_moves_each_ring_on_as_advance_does() -> None:
    rings = _journal.Rings(ChannelHistory, RAW_POINTS, AGGREGATE_EVERY)
    store = HistoryStore(4 * history.CHANNEL_BYTES)
    hs = [h for k in range(3) if (h := store.attach(f"fake://{k}")) is not None]
    assert len(hs) == 3
    h0, h1, h2 = hs
    h0.i = h0.folded = RAW_POINTS - 3  # its 8 points wrap around the ring's end
    h1.i, h1.folded = 600, 99  # 11 more make 512 waiting: due for the tiers
    # Interleaved as the journal holds them; the fourth slot has no history.
    points = [(h0.slot, 0.0), (h1.slot, 100.0), (3, -1.0)] + [
        (h1.slot, 101.0 + k) for k in range(10)
    ]
    points += [(h0.slot, 1.0 + k) for k in range(7)] + [(h2.slot, 200.0)]
    cols = journal_of(points)
    assert len(store.by_slot) == 4 and store.by_slot[3] is None  # its budget's 4 rows
    due = rings.flush(*cols, len(points), store.raw_t, store.raw_v, store.raw_a, store.by_slot)
    assert due == [h1]
    assert [h.i for h in hs] == [5, 611, 1] and [h.wrapped for h in hs] == [True, False, False]
    assert h0.folded == RAW_POINTS - 3  # folding is the caller's
    ring0 = np.concatenate((store.raw_v[h0.slot][RAW_POINTS - 3 :], store.raw_v[h0.slot][:5]))
    assert ring0.tolist() == [0.0, *(1.0 + k for k in range(7))]
    assert store.raw_v[h1.slot][600:611].tolist() == [100.0 + k for k in range(11)]
    assert store.raw_v[h2.slot][0] == 200.0 and store.raw_a[h2.slot][0] == 1 << 8
    assert store.raw_t[h2.slot][0] == (AHEAD + len(points) - 1) * NS
    assert not store.raw_v[3].any()  # no history: not written


def test_the_compiled_flush_checks_everything_before_writing() -> None:
    rings = _journal.Rings(ChannelHistory, RAW_POINTS, AGGREGATE_EVERY)
    store = HistoryStore(2 * history.CHANNEL_BYTES)
    a, b = store.attach("fake://a"), store.attach("fake://b")
    assert a is not None and b is not None
    rows = (store.raw_t, store.raw_v, store.raw_a)

    def flush(points: list[tuple[int, float]], by_slot: list[Any] = store.by_slot) -> Any:
        return rings.flush(*journal_of(points), len(points), *rows, by_slot)

    with pytest.raises(ValueError, match=r"slot 2 out of 0\.\.1"):
        flush([(a.slot, 1.0), (2, 2.0)])
    with pytest.raises(TypeError, match="is not a ChannelHistory"):
        flush([(a.slot, 1.0), (b.slot, 2.0)], [a, "b"])
    b.i = RAW_POINTS  # an index out of its ring
    with pytest.raises(ValueError, match="i out of the ring"):
        flush([(a.slot, 1.0), (b.slot, 2.0)])
    b.i = 0
    with pytest.raises(ValueError, match=r"n must be 0\.\.4"):
        rings.flush(*journal_of([(a.slot, 1.0)]), 5, *rows, store.by_slot)
    with pytest.raises(TypeError, match="raw_v must be 2-D rows"):
        rings.flush(*journal_of([(a.slot, 1.0)]), 1, store.raw_t, store.raw_v[0], store.raw_a,
                    store.by_slot)  # fmt: skip
    with pytest.raises(ValueError, match="one row per slot"):
        flush([(a.slot, 1.0)], [a])
    # A burst (more points of one slot than may wait for the tiers): None, for the numpy path.
    assert flush([(a.slot, float(k)) for k in range(AGGREGATE_EVERY + 1)]) is None
    assert a.i == b.i == 0 and not a.wrapped and not store.raw_v.any()
    with pytest.raises(AttributeError):
        _journal.Rings(Channel, RAW_POINTS, AGGREGATE_EVERY)  # a class without those slots


def test_the_compiled_fold_makes_the_buckets_numpy_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rings of a channel with NaNs, whole numbers, times that go back, and jumps of
    minutes, folded with the compiled `fold` and with numpy: the same buckets in every tier
    (sums to the bit), and the same answers."""
    rng = np.random.default_rng(5)
    n = 3 * RAW_POINTS
    steps = rng.choice([NS // 10, NS // 10, NS // 10, -NS, 420 * NS], n)
    t = AHEAD * NS + np.cumsum(steps)
    values = rng.normal(size=n) * 1e3
    values[rng.integers(0, n, 20)] = np.nan
    values[::7] = np.round(values[::7])
    severities = rng.integers(0, 4, n)
    made = []
    for fold in (history._fold, None):
        monkeypatch.setattr(history, "_fold", fold)
        h = ChannelHistory("fake://f")
        for i in range(n):
            ti = int(t[i])
            h.record(float(values[i]), ti // NS, ti % NS, int(severities[i]), 1)
        made.append(h)
    compiled, numpy_made = made
    a: history.Tier | None = compiled.tier
    b: history.Tier | None = numpy_made.tier
    while a is not None and b is not None:
        assert a.n == b.n
        for field in history.BUCKET_DTYPE.names or ():
            np.testing.assert_array_equal(a.data[field], b.data[field])
        np.testing.assert_array_equal(np.array(a.open_row()), np.array(b.open_row()))
        a, b = a.next, b.next
    assert compiled.tier.n > 100  # buckets closed in the finest tier
    for max_points in (50, 5000):
        x, y = (
            compiled.query(-(2**62), 2**62, max_points),
            numpy_made.query(-(2**62), 2**62, max_points),
        )
        for column in ("t", "value", "min", "max", "mean", "count", "severity", "gap"):
            np.testing.assert_array_equal(getattr(x, column), getattr(y, column))


def test_fold_refuses_what_is_not_a_ring() -> None:
    t, v, a = np.zeros(4, "<i8"), np.zeros(4, "<f8"), np.zeros(4, "<u2")
    assert _journal.fold(t, v, a, 3, 2, NS) == [(0, 0.0, 0.0, 0.0, 0.0, 2, 0)]  # across the end
    with pytest.raises(TypeError, match="v must be a 1-D buffer"):
        _journal.fold(t, v.astype("<f4"), a, 0, 1, NS)
    with pytest.raises(ValueError, match="one length"):
        _journal.fold(t, v[:3], a, 0, 1, NS)
    for start, k, width in ((4, 1, NS), (0, 5, NS), (0, 1, 0), (-1, 1, NS)):
        with pytest.raises(ValueError, match="needs width > 0"):
            _journal.fold(t, v, a, start, k, width)


@pytest.mark.parametrize("steps", ["compiled", "python"])
def test_a_flush_by_either_steps_fills_the_rings_alike(
    monkeypatch: pytest.MonkeyPatch, steps: str
) -> None:
    """The flush with the compiled Rings and fold, or with Python and numpy (a checkout where
    they are not built), against bare histories fed the same."""
    if steps == "python":
        monkeypatch.setattr(history, "_rings", None)
        monkeypatch.setattr(history, "_fold", None)
    store = HistoryStore(8 * history.CHANNEL_BYTES)
    held = [store.attach(f"fake://{k}") for k in range(5)]
    bare = [ChannelHistory(f"fake://{k}") for k in range(5)]
    for i in range(3 * RAW_POINTS):
        for k, (h, b) in enumerate(zip(held, bare, strict=True)):
            if k <= i % 5:  # channels at different rates: some flushes hold more of one
                assert h is not None
                h.record(float(i), AHEAD + i, k, k % 3, 0)
                b.record(float(i), AHEAD + i, k, k % 3, 0)
    for h, b in zip(held, bare, strict=True):
        assert h is not None
        got, want = h.points(), b.points()
        for column in ("t", "v", "sev", "stat", "gap"):
            np.testing.assert_array_equal(got[column], want[column])
        x, y = h.query(0, 2**62, 20), b.query(0, 2**62, 20)
        for column in ("t", "value", "min", "max", "mean", "count", "severity", "gap"):
            np.testing.assert_array_equal(getattr(x, column), getattr(y, column))
