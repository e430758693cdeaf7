"""CaBackend against the real test IOC (tests/dbs/test.db) over Channel Access: what only CA
does. What every backend does is in tests/test_backend_contract.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pvwire.errors import ReadOnlyChannel
from pvwire.upstream import ca as ca_module
from pvwire.upstream.ca import CaBackend

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]


@pytest.fixture
async def ca() -> AsyncIterator[CaBackend]:
    backend = CaBackend()
    yield backend
    await backend.close()


async def test_get_field_channel(ca: CaBackend) -> None:
    r = await ca.get("PVW:AO.DESC", 5.0)
    assert r.value == "Test output"
    assert r.meta.type == "string" and r.meta.description is None


async def test_put_to_a_read_only_field_is_refused(ca: CaBackend) -> None:
    # CA's access rights say so before the put (a PVA put to it waits out its timeout).
    with pytest.raises(ReadOnlyChannel):
        await ca.put("PVW:AO.NAME", "X", True, 5.0)


async def test_enum_labels_past_the_bound_forget_the_least_recently_used(
    ca: CaBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ca_module, "MAX_ENUM_CHOICES", 2)
    for name in ("PVW:AO.SCAN", "PVW:MBBO", "PVW:AO.SCAN", "PVW:LONG.SCAN"):
        await ca.get(name, 5.0)  # a get of an enum remembers its labels
    assert list(ca._choices) == ["PVW:AO.SCAN", "PVW:LONG.SCAN"]  # MBBO was the least recent
    try:
        await ca.put("PVW:MBBO", "Fault", True, 5.0)  # forgotten labels are read again
        assert (await ca.get("PVW:MBBO", 5.0)).value == 2
        assert list(ca._choices) == ["PVW:LONG.SCAN", "PVW:MBBO"]
    finally:
        await ca.put("PVW:MBBO", "On", True, 5.0)
