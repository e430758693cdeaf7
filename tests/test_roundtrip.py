"""Property test: whatever the server encodes, the Python client decodes to the same thing."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pvwire.model import ALARM, CONN, META, TIME, VALUE
from pvwire.wire import codec as wire
from pvwire_client import wire as client_wire

DTYPES = ["<i1", "<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8"]

uints = st.integers(min_value=0, max_value=2**63)
texts = st.text(max_size=20)
scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    texts,
    st.lists(texts, max_size=4),
)


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray[Any, Any]:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    raw = draw(st.binary(min_size=int(np.prod(shape)) * dtype.itemsize,
                         max_size=int(np.prod(shape)) * dtype.itemsize))  # fmt: skip
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


metadata = st.dictionaries(
    st.sampled_from(["units", "description", "type", "form"]), texts, max_size=3
) | st.fixed_dictionaries({"precision": st.integers(0, 10), "choices": st.lists(texts)})


@st.composite
def entries(draw: st.DrawFn) -> tuple[int, int, dict[str, Any]]:
    mask = draw(st.integers(min_value=0, max_value=31))
    fields: dict[str, Any] = {}
    if mask & VALUE:
        fields["value"] = draw(st.one_of(scalars, arrays()))
        fields["serial"] = draw(uints)
    if mask & TIME:
        fields["seconds"] = draw(uints)
        fields["nanoseconds"] = draw(st.integers(0, 999_999_999))
    if mask & ALARM:
        fields["severity"] = draw(st.integers(0, 3))
        fields["status"] = draw(st.integers(0, 21))
        fields["message"] = draw(texts)
    if mask & META:
        fields["metadata"] = draw(metadata)
    if mask & CONN:
        fields["state"] = draw(st.integers(0, 3))
        fields["reason"] = draw(texts)
    return draw(st.integers(0, 70_000)), mask, fields


@settings(max_examples=300, deadline=None)
@given(seq=uints, att=st.integers(1, 5000),
       items=st.lists(entries(), min_size=1, max_size=8))  # fmt: skip
def test_server_encoder_to_client_decoder(
    seq: int, att: int, items: list[tuple[int, int, dict[str, Any]]]
) -> None:
    bodies = [wire.encode_entry_body(mask, **f) for _, mask, f in items]
    entries = wire.encode_entries([sid for sid, _, _ in items], bodies)
    frame = wire.encode_data(seq, [(att, entries)])
    msg = client_wire.decode_message(frame)
    assert isinstance(msg, client_wire.Data) and msg.seq == seq
    (group,) = msg.groups
    assert group.att == att
    for (sid, mask, fields), got in zip(items, group.entries, strict=True):
        assert (got.sid, got.mask) == (sid, mask)
        for name, want in fields.items():
            have = getattr(got, name)
            if isinstance(want, np.ndarray):
                assert have.dtype == want.dtype and have.shape == want.shape
                assert have.tobytes() == want.tobytes()
            else:
                assert have == want, name
