"""Frames put every entry's ndarray data on a multiple of 8 bytes from the message's start with
nil padding (PROTOCOL.md section 3), and the Python client reads them back without the nils."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pvwire.core.channel import Channel
from pvwire.core.reduce import NO_REDUCTION, Reduction
from pvwire.core.view import View, ViewKey
from pvwire.model import META, TIME, VALUE, ConnState, Metadata
from pvwire.wire import codec as wire
from pvwire_client import wire as client_wire

from tests.alignment import ndarray_data_offsets

DTYPES = ["<i1", "<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8"]


@st.composite
def values(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return draw(st.floats(allow_nan=False) | st.integers(-(2**40), 2**40) | st.text(max_size=9))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=2))
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


@st.composite
def groups(draw: st.DrawFn) -> list[tuple[int, list[tuple[int, int, dict[str, Any]]]]]:
    out = []
    for att in draw(st.lists(st.integers(1, 70_000), min_size=1, max_size=3, unique=True)):
        items = []
        for sid in draw(st.lists(st.integers(0, 70_000), min_size=1, max_size=20)):
            mask = draw(st.sampled_from([VALUE | TIME, VALUE | TIME | META, VALUE]))
            fields: dict[str, Any] = {"value": draw(values()), "serial": 1}
            if mask & TIME:
                fields.update(seconds=1_700_000_000, nanoseconds=draw(st.integers(0, 10**9 - 1)))
            if mask & META:
                fields["metadata"] = {"units": draw(st.text(max_size=30))}
            items.append((sid, mask, fields))
        out.append((att, items))
    return out


def _entries(items: list[tuple[int, int, dict[str, Any]]]) -> wire.Entries:
    bodies = [wire.encode_entry_body(mask, **fields) for _, mask, fields in items]
    return wire.encode_entries([sid for sid, _, _ in items], bodies)


def _same(got: client_wire.Entry, want: tuple[int, int, dict[str, Any]]) -> None:
    sid, mask, fields = want
    assert (got.sid, got.mask) == (sid, mask)
    value = fields["value"]
    if isinstance(value, np.ndarray):
        assert isinstance(got.value, np.ndarray)
        assert got.value.dtype == value.dtype and got.value.shape == value.shape
        assert got.value.tobytes() == value.tobytes()
    else:
        assert got.value == value


def _arrays_with_data(items: list[tuple[int, int, dict[str, Any]]]) -> int:
    return sum(isinstance(f["value"], np.ndarray) and f["value"].size > 0 for _, _, f in items)


@settings(max_examples=200, deadline=None)
@given(seq=st.integers(1, 2**40), groups=groups())
def test_data_aligns_every_array_and_decodes(
    seq: int, groups: list[tuple[int, list[tuple[int, int, dict[str, Any]]]]]
) -> None:
    frame = wire.encode_data(seq, [(att, _entries(items)) for att, items in groups])
    offsets = ndarray_data_offsets(frame)
    assert [o % 8 for o in offsets] == [0] * sum(_arrays_with_data(i) for _, i in groups)
    msg = client_wire.decode_message(frame)
    assert isinstance(msg, client_wire.Data) and msg.seq == seq
    assert [g.att for g in msg.groups] == [att for att, _ in groups]
    for group, (_, items) in zip(msg.groups, groups, strict=True):
        assert len(group.entries) == len(items)
        for got, want in zip(group.entries, items, strict=True):
            _same(got, want)


@settings(max_examples=100, deadline=None)
@given(seq=st.integers(1, 2**40), groups=groups())
def test_snapshot_aligns_every_array_and_decodes(
    seq: int, groups: list[tuple[int, list[tuple[int, int, dict[str, Any]]]]]
) -> None:
    att, items = groups[0]
    frame = wire.encode_snapshot(seq, att, _entries(items))
    assert [o % 8 for o in ndarray_data_offsets(frame)] == [0] * _arrays_with_data(items)
    msg = client_wire.decode_message(frame)
    assert isinstance(msg, client_wire.Snapshot) and (msg.seq, msg.att) == (seq, att)
    for got, want in zip(msg.entries, items, strict=True):
        _same(got, want)


def _raw_entries(frame: bytes) -> list[Any]:
    import msgpack

    decoded: list[Any] = msgpack.unpackb(frame, ext_hook=lambda c, d: d)[2][0][1]
    return decoded


def test_padding_is_at_most_seven_nils_per_array_entry_and_only_before_it() -> None:
    f64 = wire.encode_entry_body(VALUE, value=np.arange(3.0), serial=1)
    scalar = wire.encode_entry_body(VALUE, value=1.5, serial=1)
    assert f64.array_at > 0 and scalar.array_at == 0
    entries = wire.encode_entries([0, 1, 2, 3], [scalar, f64, scalar, f64])
    for seq in range(1, 300):
        raw = _raw_entries(wire.encode_data(seq, [(1, entries)]))
        kinds = ["nil" if x is None else "scalar" if x[2] == 1.5 else "array" for x in raw]
        # Nils only right before an array entry, at most 7 of them.
        runs = "".join({"nil": "n", "scalar": "s", "array": "a"}[k] for k in kinds)
        assert runs.replace("n", "") == "sasa"
        assert all(len(run) <= 7 for run in runs.replace("s", " ").replace("a", " ").split())
        assert "ns" not in runs and not runs.endswith("n")


def test_scalar_frames_carry_no_padding() -> None:
    scalar = wire.encode_entry_body(VALUE | TIME, value=2.0, serial=3, seconds=1, nanoseconds=2)
    entries = wire.encode_entries([0, 1], [scalar, scalar])
    assert entries.arrays == ()
    frame = wire.encode_data(5, [(1, entries)])
    assert frame == b"\x93\x03\x05\x91\x92\x01\x92" + wire.entry(0, scalar) + wire.entry(1, scalar)


def test_update_bodies_frame_like_full_bodies() -> None:
    # The fast body of an ordinary scalar update is built without NamedTuple.__new__: it must
    # still hold every field the frame assembly reads, and the same bytes as the full encoder.
    fast = wire.encode_update_body(2.0, 3, 1, 2)
    full = wire.encode_entry_body(VALUE | TIME, value=2.0, serial=3, seconds=1, nanoseconds=2)
    assert fast == full and fast.array_at == 0
    frame = wire.encode_data(5, [(1, wire.encode_entries([0], [fast]))])
    assert frame == wire.encode_data(5, [(1, wire.encode_entries([0], [full]))])


def test_empty_array_needs_no_padding() -> None:
    body = wire.encode_entry_body(VALUE, value=np.zeros(0), serial=1)
    assert body.array_at == 0


def test_struct_aligns_its_largest_array() -> None:
    value = {"small": np.arange(2, dtype="<f8"), "big": np.arange(100, dtype="<f8")}
    body = wire.encode_entry_body(VALUE, value=value, serial=1)
    frame = wire.encode_data(3, [(1, wire.encode_entries([0], [body]))])
    small, big = ndarray_data_offsets(frame)
    assert big % 8 == 0 and big - small == 16 + 2 + 4 + 4 + 4  # 2 float64, key, ext and nd heads


@pytest.mark.parametrize(
    ("scalars", "arrays", "width"),
    [(1, 1, 1), (7, 1, 1), (8, 1, 3), (65_510, 2, 3), (65_520, 2, 5)],
)
def test_entries_header_width_fits_the_most_padding(scalars: int, arrays: int, width: int) -> None:
    """The header width is that of `count + 7 x arrays`: known before the padding is chosen,
    wider than needed when the padding is less (valid MessagePack)."""
    scalar = wire.encode_entry_body(VALUE, value=0.5, serial=1)
    f64 = wire.encode_entry_body(VALUE, value=np.arange(4.0), serial=1)
    bodies = [scalar] * scalars + [f64] * arrays
    entries = wire.encode_entries(range(len(bodies)), bodies)
    for seq in (1, 200, 70_000):
        frame = wire.encode_snapshot(seq, 1, entries)
        head = len(b"\x94\x02") + len(wire.pack_value(seq)) + 1
        first = frame[head]
        got = 1 if first < 0xA0 else 3 if first == 0xDC else 5 if first == 0xDD else 0
        assert got == width
        assert [o % 8 for o in ndarray_data_offsets(frame)] == [0] * arrays
        msg = client_wire.decode_message(frame, views=False)
        assert isinstance(msg, client_wire.Snapshot) and len(msg.entries) == len(bodies)


class _Listener:
    def __init__(self) -> None:
        self.dirty: list[Channel] = []

    def mark_dirty(self, channel: Channel) -> None:
        self.dirty.append(channel)

    def count_failure(self, what: str) -> None:
        raise AssertionError(what)

    def count_dropped(self, n: int) -> None:
        raise AssertionError(f"{n} dropped")


def _tick(listener: _Listener, view: View) -> None:
    """What the hub's tick does for one view: hand the changes over, encode once."""
    dirty, listener.dirty = listener.dirty, []
    for ch in dirty:
        mask, ch.dirty = ch.dirty, 0
        for v, sid in ch.views:
            v.add_change(sid, mask, ch)
    view.emit(0.0)


@pytest.mark.parametrize(
    ("mode", "reduction"),
    [("LATEST", NO_REDUCTION), ("ALL", NO_REDUCTION), ("LATEST", Reduction(columns=3, pixels=8))],
)
def test_views_entries_align_in_every_frame_kind(mode: str, reduction: Reduction) -> None:
    """A view's tick entries (LATEST, ALL with several updates per channel, reduced), catch-up
    entries and snapshot entries: every frame built from them has its arrays aligned."""
    listener = _Listener()
    values: list[Any] = [1.5, np.arange(50.0), np.arange(12, dtype="<i4"), np.ones((4, 6), "<u2")]
    channels = []
    for i, _ in enumerate(values):
        ch = Channel(f"sim://c{i}", None, f"c{i}", listener)  # type: ignore[arg-type]
        ch.on_meta(Metadata("float64", 1, "", "", 0))
        ch.on_connection(ConnState.CONNECTED)
        channels.append(ch)
    view = View(ViewKey(tuple(c.id for c in channels), mode, 0.0, reduction), channels)
    view.link()
    for step in range(2):  # two updates per channel before the tick: two entries each in ALL
        for ch, v in zip(channels, values, strict=True):
            ch.on_update(v + step, 1_700_000_000, step, 0, 0, "")
    _tick(listener, view)
    n_arrays = (2 if mode == "ALL" else 1) * 3
    entries = [view.tick_entries, view.entries_for({sid: 3 for sid in range(4)})]
    for seq in (1, 130, 300, 70_000):
        for att in (1, 200):
            frames = [wire.encode_data(seq, [(att, e)]) for e in entries]
            frames.append(wire.encode_snapshot(seq, att, view.snapshot_entries()))
            frames.append(wire.encode_data(seq, [(att, entries[0]), (att + 1, entries[1])]))
            counts = [n_arrays, 3, 3, n_arrays + 3]
            for frame, count in zip(frames, counts, strict=True):
                assert [o % 8 for o in ndarray_data_offsets(frame)] == [0] * count
                assert client_wire.decode_message(frame, views=False)
