"""`loc://` local PVs (upstream/loc.py) as Phoebus' LocalPVFactory and LocalPV define them."""

from __future__ import annotations

import numpy as np
import pytest
from pvwire.errors import BadChannelId, TypeMismatch
from pvwire.limits import integer
from pvwire.upstream.loc import LocBackend, parse_loc

from tests.conftest import RecordingSink

LOC_MAX_PVS = integer("loc_max_pvs")


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


async def test_beyond_the_table_s_count_the_oldest_unwatched_pvs_are_forgotten() -> None:
    """`loc_max_pvs`: one PV more forgets the oldest nobody watches; when all are watched, a new
    one is refused with the bound in its words."""
    loc = LocBackend()
    assert loc.max_pvs == LOC_MAX_PVS
    sink = RecordingSink()
    watched = loc.monitor("watched", sink)
    await sink.wait(lambda: sink.updates)  # the monitor has started: the PV is watched
    await loc.put("watched", 7.0, True, 1.0)
    await loc.put("oldest", 5.0, True, 1.0)
    for i in range(LOC_MAX_PVS - 2):
        loc.local(f"p{i}")
    assert (await loc.get("oldest", 1.0)).value == 5.0  # still within the bound
    loc.local("one-more")
    assert len(loc.locals) <= LOC_MAX_PVS
    assert (await loc.get("oldest", 1.0)).value == 0.0  # forgotten: made anew
    assert (await loc.get("watched", 1.0)).value == 7.0
    watched.close()

    small = LocBackend(max_pvs=1)
    held = RecordingSink()
    mon = small.monitor("held", held)
    await held.wait(lambda: held.updates)
    with pytest.raises(BadChannelId, match="at most 1 local PVs and all of them are watched"):
        await small.get("another", 1.0)
    mon.close()
