"""The history journal's writers (core/history.py): the compiled one (core/_journal.c), which the
server uses wherever `make ext` built it, and the Python one for a checkout where it is not
built, through the same cases: what they write, what they refuse, and that a refused point is
not counted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from pvwire.core import _journal, history
from pvwire.core.history import NS, HistoryStore, Journal, PyWriter

WRITERS = pytest.mark.parametrize("writer", [_journal.Writer, PyWriter], ids=["compiled", "python"])
Columns = tuple[np.ndarray[Any, Any], ...]


def columns(n: int) -> Columns:
    return (np.zeros(n, "<i8"), np.zeros(n, "<f8"), np.zeros(n, "<u2"), np.zeros(n, "<i4"))


def test_the_server_uses_the_compiled_writer() -> None:
    # `make test` builds it: a fallback to Python here would only show as a slower server.
    assert history.Writer is _journal.Writer
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
    cols = list(columns(4))
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
