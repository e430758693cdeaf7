"""`loc://` local PVs (upstream/loc.py) as Phoebus' LocalPVFactory and LocalPV define them."""

from __future__ import annotations

import numpy as np
import pytest
from pvwire.errors import TypeMismatch
from pvwire.upstream.loc import LocBackend, parse_loc

from tests.conftest import RecordingSink


def test_quoted_items_keep_commas_spaces_and_escaped_quotes() -> None:
    _, v = parse_loc(r'x("a, b",  "say \"hi\"" , "c")')
    assert v.value == ["a, b", 'say "hi"', "c"] and v.meta.count == 3 and v.array


@pytest.mark.parametrize(
    ("name", "value", "type_name"),
    [
        ("x(0x1F)", 31.0, "float64"),
        ("x<vlong>(7.9)", 7, "int64"),  # a lenient type name, truncated as Phoebus' VLong
        ("x<VBoolean>", False, "bool"),
        ("x<VBoolean>(TRUE)", True, "bool"),
        ("x<VStringArray>", [""], "string"),
        ("x<VDoubleArray>", None, "float64"),
    ],
)
def test_types_and_defaults(name: str, value: object, type_name: str) -> None:
    _, v = parse_loc(name)
    assert v.meta.type == type_name
    if value is None:
        assert isinstance(v.value, np.ndarray) and v.value.size == 0
    else:
        assert v.value == value and type(v.value) is type(value)


async def test_enum_takes_index_or_label_and_refuses_others() -> None:
    loc = LocBackend()
    await loc.put('e<VEnum>(0, "A", "B")', "B", True, 1.0)
    assert (await loc.get("e", 1.0)).value == 1
    with pytest.raises(TypeMismatch, match="valid"):
        await loc.put("e", 5, True, 1.0)


@pytest.mark.parametrize(
    ("write", "value", "type_name"),
    [
        ("hello", "hello", "string"),
        ([1, 2], [1.0, 2.0], "float64"),
        (["a", "b"], ["a", "b"], "string"),
    ],
)
async def test_a_never_written_bare_pv_takes_its_type_from_the_first_write(
    write: object, value: object, type_name: str
) -> None:
    loc = LocBackend()
    sink = RecordingSink()
    mon = loc.monitor("fresh", sink)
    await sink.wait(lambda: sink.updates)
    await loc.put("fresh", write, True, 1.0)
    got = sink.updates[-1].value
    assert (got.tolist() if isinstance(got, np.ndarray) else got) == value
    assert sink.metas[-1].type == type_name
    # The first write decided: a number no longer fits a string PV, and the reverse.
    await loc.put("fresh", write, True, 1.0)
    mon.close()


async def test_a_typed_or_written_pv_keeps_its_type() -> None:
    loc = LocBackend()
    with pytest.raises(TypeMismatch):
        await loc.put("n(1)", "text", True, 1.0)  # an initial value fixes the type
    await loc.put("m", 2, True, 1.0)
    with pytest.raises(TypeMismatch):
        await loc.put("m", "text", True, 1.0)  # so does a first write of a number
