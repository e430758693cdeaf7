"""PvaBackend against the real test IOC (tests/dbs/test.db) over PVAccess (QSRV): what only PVA
does. What every backend does is in tests/test_backend_contract.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pvwire.upstream import pva as pva_module
from pvwire.upstream.pva import PvaBackend

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]


@pytest.fixture
async def pva() -> AsyncIterator[PvaBackend]:
    backend = PvaBackend()
    yield backend
    await backend.close()


async def test_put_types_past_the_bound_forget_the_least_recently_used(
    pva: PvaBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pva_module, "MAX_TYPES", 2)
    for name in ("PVW:LONG", "PVW:MBBO", "PVW:LONG", "PVW:AO"):
        await pva.get(name, 5.0)  # a get remembers the channel's put type
    assert list(pva._types) == ["PVW:LONG", "PVW:AO"]  # MBBO was the least recent
    try:
        await pva.put("PVW:MBBO", "Fault", True, 5.0)  # a forgotten type is learned again
        assert (await pva.get("PVW:MBBO", 5.0)).value == 2
        assert list(pva._types) == ["PVW:AO", "PVW:MBBO"]
    finally:
        await pva.put("PVW:MBBO", "On", True, 5.0)
