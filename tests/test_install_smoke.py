"""pvwire as installed, end to end on the interpreter that runs this: the server serves CA, PVA
(through the compiled module) and sim, and this interpreter's client gets, puts and monitors each.

`make matrix` runs it in a virtual environment per supported Python with pvwire installed by
`pip install .`, not editable: the server then runs the wheel's code and compiled modules.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pvwire
import pytest
from pvwire.upstream import pva_ingest
from pvwire_client import Client

from tests.eventually import TIMEOUT

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]


def test_compiled_modules_load_with_the_package() -> None:
    import pvwire.core._journal as journal
    import pvwire.core._tick as tick
    import pvwire.upstream._pvaingest as pva

    package = Path(pvwire.__file__).parent
    assert Path(pva.__file__).parent == package / "upstream"
    assert Path(journal.__file__).parent == package / "core"
    assert Path(tick.__file__).parent == package / "core"
    # Without the module the server would report every pva:// channel as unavailable.
    assert pva_ingest.UNAVAILABLE is None


@pytest.mark.parametrize("id", ["ca://PVW:AO", "pva://PVW:AO", "sim://value/install-smoke"])
async def test_get_put_and_monitor(server_url: str, id: str) -> None:
    async with Client(server_url) as client:
        before = await client.get(id)
        assert before.connected, before
        value = round(random.uniform(-50, 50), 3)
        while value == before.value:
            value = round(random.uniform(-50, 50), 3)
        updates = client.monitor(id)
        try:
            async with asyncio.timeout(TIMEOUT):
                first = await anext(updates)
                assert first.channel.id == id and first.channel.connected
                await client.put(id, value, wait=True)
                async for update in updates:
                    if update.channel.value == value:
                        break
        finally:
            await updates.aclose()
        assert (await client.get(id)).value == value
