"""ndarray data arrives aligned (PROTOCOL.md section 3, Padding): through the real server over a
real WebSocket, a float64 waveform and int32, float32 and uint16 images reach the Python client
as numpy views of the received message whose data starts on a multiple of 8 bytes, both from the
message's start and in memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
from pvwire_client import Client

from tests.server_process import ServerProcess, server_args_for_tests

# Every array is at least 64 KiB in a message of at least 256 KiB, so the client views the
# message (pvwire_client.wire.VIEWS_FROM, VIEW_ARRAYS_FROM) rather than a copy of the ext.
IDS = {
    "sim://waveform?length=100000&rate=5": np.dtype("<f8"),
    "sim://image?width=300&height=300&dtype=int32&rate=5": np.dtype("<i4"),
    "sim://image?width=300&height=300&dtype=float32&rate=5": np.dtype("<f4"),
    "sim://image?width=512&height=512&dtype=uint16&rate=5": np.dtype("<u2"),
}


@pytest.fixture(scope="module")
def sim_server() -> Iterator[ServerProcess]:
    with ServerProcess(*server_args_for_tests()) as proc:
        yield proc


@pytest.fixture
async def client(sim_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client(sim_server.url, timeout=10) as c:
        yield c


def _message_of(a: np.ndarray[Any, Any]) -> bytearray:
    base: object = a
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview), f"the array owns its memory ({type(base).__name__})"
    assert isinstance(base.obj, bytearray)
    return base.obj


async def test_arrays_view_the_message_at_multiples_of_8(client: Client) -> None:
    seen: dict[str, list[np.ndarray[Any, Any]]] = {i: [] for i in IDS}
    # One subscription with a scalar too: groups mix scalar and array entries, and the snapshot
    # and the DATA messages after it (other seq widths) are all checked.
    stream = client.monitor(["sim://counter?rate=10", *IDS])
    try:
        async with asyncio.timeout(60):
            async for u in stream:
                if u.channel.id in seen and isinstance(u.channel.value, np.ndarray):
                    seen[u.channel.id].append(u.channel.value)
                if all(len(v) >= 4 for v in seen.values()):
                    break
    finally:
        await stream.aclose()
    for channel, arrays in seen.items():
        for a in arrays:
            assert a.dtype == IDS[channel] and a.size > 0
            message = _message_of(a)
            start = np.frombuffer(message, np.uint8).ctypes.data
            assert np.shares_memory(a, np.frombuffer(message, np.uint8))
            assert (a.ctypes.data - start) % 8 == 0, channel
            assert a.ctypes.data % 8 == 0 and a.flags.aligned, channel
