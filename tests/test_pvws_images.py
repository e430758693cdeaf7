"""Images on `/pvws/pv` over the real server: frames paced to the connection's
`pvws_image_bytes_per_s`, each whole (the array dbwr's image widget draws: `value.length /
data_width` rows), and every frame with the setting at 0. The bytes per second are measured in
bench/pvws_bounds.py (docs/PVWS.md)."""

from __future__ import annotations

import asyncio

import numpy as np
from pvwire_dev.ioc import IocProcess

from tests.pvws_client import PvwsClient, array_of
from tests.server_process import ServerProcess, server_args_for_tests

WIDTH, HEIGHT = 512, 512
IMAGE = f"sim://image?width={WIDTH}&height={HEIGHT}"  # 10 Hz, uint16: the demo image's shape


def whole(message: dict[str, object]) -> bool:
    pixels = array_of(message)
    return pixels is not None and pixels.size == WIDTH * HEIGHT and bool(np.any(pixels))


async def frames(client: PvwsClient, count: int, others: str = "") -> tuple[int, int]:
    """Read until `count` frames of IMAGE, or `count` updates of `others`: how many of each."""
    images = updates = 0
    async with asyncio.timeout(120):
        while images < count and updates < count:
            m = await client.next("update", timeout=60)
            if m["pv"] == IMAGE:
                assert whole(m)
                images += 1
            elif m["pv"] == others:
                updates += 1
    return images, updates


async def test_image_frames_are_whole_and_live_by_default(epics_env: IocProcess) -> None:
    with ServerProcess(*server_args_for_tests()) as server:
        client = await PvwsClient.connect(server.url)
        try:
            await client.subscribe(IMAGE)
            first = await client.next("update", IMAGE, timeout=60)
            assert first["vtype"] == "VUShortArray" and whole(first)
            assert await frames(client, 3) == (3, 0)  # a live picture
        finally:
            await client.close()


async def test_past_the_budget_frames_wait_and_the_connection_s_other_pvs_go_on(
    epics_env: IocProcess,
) -> None:
    """With a budget of 1 byte/s the first frame (1.4 MB) is owed for days: no second frame
    comes while a counter on the same connection updates 20 times."""
    env = {"PVWIRE_PVWS_IMAGE_BYTES_PER_S": "1"}
    with ServerProcess(*server_args_for_tests(), env=env) as server:
        client = await PvwsClient.connect(server.url)
        try:
            await client.subscribe(IMAGE, "sim://counter/beside")
            assert whole(await client.next("update", IMAGE, timeout=60))
            assert await frames(client, 20, "sim://counter/beside") == (0, 20)
        finally:
            await client.close()


async def test_a_budget_of_0_sends_every_frame(epics_env: IocProcess) -> None:
    env = {"PVWIRE_PVWS_IMAGE_BYTES_PER_S": "0"}
    with ServerProcess(*server_args_for_tests(), env=env) as server:
        client = await PvwsClient.connect(server.url)
        try:
            await client.subscribe(IMAGE, "sim://counter/beside")
            await client.next("update", IMAGE, timeout=60)
            # The image (10 Hz) keeps pace with the counter (10 Hz): frames are not held.
            images, _ = await frames(client, 20, "sim://counter/beside")
            assert images >= 5
        finally:
            await client.close()
