"""pvwire_client against a real pvwire server and the test IOC (tests/dbs/test.db).

Needs the ``server_url`` fixture (tests/conftest.py): a running server with writes enabled.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator

import numpy as np
import pytest
from pvwire_client import Client, NotFound, PvwireError, Update
from pvwire_client.sync import SyncClient

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]


async def take(it: AsyncIterator[Update], n: int, timeout: float = 10) -> list[Update]:
    out: list[Update] = []
    async with asyncio.timeout(timeout):
        async for u in it:
            out.append(u)
            if len(out) == n:
                break
    return out


async def test_get_float_with_metadata(client: Client) -> None:
    s = await client.get("ca://PVW:AO")
    assert s.id == "ca://PVW:AO" and s.connected
    assert isinstance(s.value, float)
    assert s.units == "mm" and s.metadata["precision"] == 3
    assert s.time is not None and s.datetime is not None
    assert s.format().endswith(" mm")


async def test_get_several_types(client: Client) -> None:
    ao, long, enum, text, wf = await client.get(
        "ca://PVW:AO", "ca://PVW:LONG", "ca://PVW:MBBO", "ca://PVW:STR", "ca://PVW:WF"
    )
    assert ao.id == "ca://PVW:AO"
    assert isinstance(long.value, int)
    assert enum.metadata["choices"][:3] == ["Off", "On", "Fault"] and enum.label is not None
    assert isinstance(text.value, str)
    assert isinstance(wf.value, np.ndarray) and wf.value.dtype == np.float64


async def test_put_then_get(client: Client) -> None:
    v = round(random.uniform(-50, 50), 3)
    res = await client.put("ca://PVW:AO", v, wait=True)
    assert res.ok
    s = await client.get("ca://PVW:AO")
    assert s.value == pytest.approx(v)
    await client.put("ca://PVW:MBBO", "Fault", wait=True)
    assert (await client.get("ca://PVW:MBBO")).label == "Fault"
    await client.put("ca://PVW:WF", np.array([4.0, 5.0]), wait=True)
    assert (await client.get("ca://PVW:WF")).value.tolist()[:2] == [4.0, 5.0]


async def test_put_many(client: Client) -> None:
    results = await client.put_many({"ca://PVW:LONG": 7, "ca://PVW:STR": "pvwire"}, wait=True)
    assert [r.ok for r in results] == [True, True]
    long, text = await client.get("ca://PVW:LONG", "ca://PVW:STR")
    assert (long.value, text.value) == (7, "pvwire")


async def test_monitor_snapshot_then_changes(client: Client) -> None:
    ups = await take(client.monitor(["ca://PVW:COUNTER", "ca://PVW:AO"]), 12)
    # Each channel's first update carries its value, whether or not the server had it warm.
    for pv in ("ca://PVW:COUNTER", "ca://PVW:AO"):
        first = next(u for u in ups if u.channel.id == pv)
        assert first.channel.connected and first.channel.value is not None
        assert {"value", "time", "alarm", "metadata", "connection"} <= first.changed
    counter = [u.channel.value for u in ups if u.channel.id == "ca://PVW:COUNTER"
               and "value" in u.changed]  # fmt: skip
    assert len(counter) >= 3 and counter == sorted(counter) and len(set(counter)) == len(counter)


async def test_monitor_of_a_cold_channel_starts_with_its_value(client: Client) -> None:
    # A sim channel no one watches is cold: the server's snapshot has no value yet.
    pv = f"sim://value/cold{random.randrange(10**9)}"
    (first,) = await take(client.monitor(pv), 1)
    assert first.channel.id == pv and first.channel.connected
    assert first.channel.value is not None and "value" in first.changed


async def test_monitor_sees_puts(client: Client) -> None:
    it = client.monitor("ca://PVW:LONG")
    (snap,) = await take(it, 1)
    new = (snap.channel.value or 0) % 900 + 13
    await client.put("ca://PVW:LONG", new)
    async with asyncio.timeout(5):
        async for u in it:
            if u.channel.value == new:
                assert "value" in u.changed
                break
    await it.aclose()


async def test_info(client: Client) -> None:
    meta = await client.info("ca://PVW:AO")
    assert meta["units"] == "mm" and meta["precision"] == 3
    assert meta["control"] == [-100.0, 100.0]
    assert meta["alarm"] == [-90.0, 90.0] and meta["warning"] == [-70.0, 70.0]
    assert meta["description"] == "Test output"
    assert isinstance(meta["writable"], bool)


async def test_search(client: Client) -> None:
    await client.get("ca://PVW:AO")  # active channels are searchable
    ids = await client.search("*PVW:A*")
    assert "ca://PVW:AO" in ids and ids == sorted(ids)


async def test_unknown_pv(client: Client) -> None:
    with pytest.raises(NotFound) as e:
        await client.get("ca://PVW:NOPE", timeout=1)
    assert e.value.id == "ca://PVW:NOPE" and e.value.code == "NOT_FOUND"
    results = await client.get_many(["ca://PVW:AO", "ca://PVW:NOPE"], timeout=3)  # AO must connect
    assert not isinstance(results[0], PvwireError) and isinstance(results[1], NotFound)


async def test_server_info(client: Client) -> None:
    info = await client.server_info()
    assert isinstance(info["version"], str) and info["uptime"] >= 0


def test_sync_facade(server_url: str) -> None:
    with SyncClient(server_url) as c:
        s = c.get("ca://PVW:AO")
        assert not isinstance(s, list) and s.id == "ca://PVW:AO"
        ups = list(c.monitor("ca://PVW:COUNTER", count=3))
        assert len(ups) == 3
        assert {u.channel.id for u in c.monitor("ca://PVW:STR", duration=5)} == {"ca://PVW:STR"}
        image = "sim://image?width=128&height=128&dtype=uint8"
        (shown,) = c.monitor(image, count=1, max_pixels=1024)
        assert shown.channel.value.size <= 1024 < 128 * 128
        reduced = shown.channel.metadata["reduced"]
        assert reduced["method"] == "subsample" and reduced["from"] == [128, 128]
        assert "ca://PVW:AO" in c.search("*PVW:AO")
        assert not math.isnan(c.info("ca://PVW:AO")["control"][1])
