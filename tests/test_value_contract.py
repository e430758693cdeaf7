"""The value contract at the backend sink (upstream/values.py) and guarded upstream callbacks.

Unit tests of `wire_value`, then the guard against the real test IOC: a sink that raises once in
the middle of a 10 Hz monitor turns the channel FAILED with the reason, the aioca / p4p
subscription stays open, and the next update brings it back CONNECTED with fresh values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pvwire.model import ConnState, Value
from pvwire.upstream.base import Backend
from pvwire.upstream.ca import CaBackend
from pvwire.upstream.pva import PvaBackend
from pvwire.upstream.values import UnsupportedValue, long_string, wire_value
from pvwire.wire import codec

from tests.conftest import RecordingSink


@pytest.mark.parametrize(
    ("given", "want"),
    [
        (1, 1),
        (2**64 - 1, 2**64 - 1),
        (True, 1),
        (np.bool_(False), 0),
        (np.int64(-(2**63)), -(2**63)),
        (np.float32(1.5), 1.5),
        ("µ", "µ"),
        (None, None),
        (np.array(["a", "", "bc"]), ["a", "", "bc"]),
        (np.array([], dtype="<U1"), []),
        (np.array([b"x", b"\xc2\xb5"]), ["x", "µ"]),
        (np.array(["o", 1], dtype=object), ["o", 1]),
        (("a", "b"), ["a", "b"]),
        ({"a": np.bool_(True), "n": {"s": ["x"]}}, {"a": 1, "n": {"s": ["x"]}}),
        ([{"q": 1}, None, 2.5], [{"q": 1}, None, 2.5]),
    ],
)
def test_wire_value_converts_to_protocol_forms(given: object, want: Any) -> None:
    got = wire_value(given)
    assert got == want and type(got) is type(want)
    codec.pack_value(got)  # and the encoder carries it


@pytest.mark.parametrize(
    ("given", "dtype"),
    [
        (np.arange(3, dtype=">i4"), np.dtype(">i4")),
        (np.array([True, False]), np.dtype("u1")),
        (np.array([1.0], dtype=np.float16), np.dtype("f4")),
        (np.zeros((2, 3), dtype="u2"), np.dtype("u2")),
    ],
)
def test_numeric_arrays_keep_or_get_a_wire_dtype(given: np.ndarray[Any, Any], dtype: Any) -> None:
    got = wire_value(given)
    assert isinstance(got, np.ndarray) and got.dtype == dtype
    assert np.array_equal(got, given)
    codec.pack_value(got)


@pytest.mark.parametrize(
    ("given", "complaint"),
    [
        (np.array([1 + 2j]), "complex128 arrays cannot be sent"),
        (np.zeros(2, dtype="M8[s]"), "datetime64"),
        (np.array([["a"]]), "2-dimensional array"),
        (b"raw", "bytes values cannot be sent"),
        ({1: 2}, "field name 1 is not a string"),
        ([1, object()], "object values cannot be sent"),
    ],
)
def test_what_the_wire_cannot_carry_is_named(given: object, complaint: str) -> None:
    with pytest.raises(UnsupportedValue, match=complaint):
        wire_value(given)


def test_plain_ndarray_passes_as_the_same_object() -> None:
    a = np.arange(10.0)
    assert wire_value(a) is a


def test_long_string_stops_at_the_first_nul() -> None:
    raw = np.frombuffer("text µ\0junk".encode(), dtype=np.int8)
    assert long_string(raw) == "text µ"
    assert long_string("already text") == "already text"


# --- guarded callbacks, against the real test IOC ----------------------------------------------


class RaisingSink(RecordingSink):
    """Raises in `on_update` once, after `after` good updates: a bug in the hub's side."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.raised = False

    def on_update(self, value: Value, *args: Any, **kwargs: Any) -> None:
        if not self.raised and len(self.updates) == self.after:
            self.raised = True
            raise RuntimeError("sink exploded")
        super().on_update(value, *args, **kwargs)


@pytest.mark.ioc
@pytest.mark.usefixtures("epics_env")
@pytest.mark.parametrize("backend", [CaBackend, PvaBackend])
async def test_a_raising_callback_fails_the_channel_and_the_subscription_recovers(
    backend: type[Backend],
) -> None:
    sink = RaisingSink(after=2)
    be = backend()
    mon = be.monitor("PVW:COUNTER", sink)
    try:
        await sink.wait(lambda: sink.raised, timeout=20)
        await sink.wait(lambda: (ConnState.FAILED, sink.states[-1][1]) == sink.states[-1])
        reason = sink.states[-1][1]
        assert "sink exploded" in reason and "RuntimeError" in reason
        n = len(sink.updates)
        # The upstream subscription was not ended: updates keep coming and CONNECTED is back.
        await sink.wait(lambda: len(sink.updates) >= n + 3, timeout=20)
        failed_at = sink.events.index(("conn", ConnState.FAILED))
        after = sink.events[failed_at + 1 :]
        assert after[0] == ("conn", ConnState.CONNECTED), after[:3]
        values = [u.value for u in sink.updates if isinstance(u.value, float)]
        assert len(values) == len(sink.updates)
        assert values[-1] > values[n - 1]
    finally:
        mon.close()
        await be.close()
