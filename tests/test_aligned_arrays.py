"""ndarray data arrives aligned (PROTOCOL.md section 3, Padding): through the real server over a
real WebSocket, a float64 waveform and int32, float32 and uint16 images reach the Python client
as numpy views of the received message whose data starts on a multiple of 8 bytes, both from the
message's start and in memory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import websockets
from pvwire_client import Client
from websockets import Subprotocol

from tests.alignment import message_of
from tests.server_process import ServerProcess, server_args_for_tests
from tests.server_process import stream_token as token

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
def client_url(sim_server: ServerProcess) -> str:
    return sim_server.url


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
            message = message_of(a)
            start = np.frombuffer(message, np.uint8).ctypes.data
            assert np.shares_memory(a, np.frombuffer(message, np.uint8))
            assert (a.ctypes.data - start) % 8 == 0, channel
            assert a.ctypes.data % 8 == 0 and a.flags.aligned, channel


async def _raw_entries(
    server: ServerProcess, offer: list[str], frames: int
) -> tuple[str, list[list[Any]]]:
    """The subprotocol selected for `offer`, and the raw `entries` arrays of the SNAPSHOT and the
    next DATA messages of a subscription to a waveform and a counter."""
    ids = ["sim://counter?rate=10", "sim://waveform?length=1001&rate=10"]
    got: list[list[Any]] = []
    async with websockets.connect(
        server.ws_url, subprotocols=[Subprotocol(p) for p in offer], max_size=None
    ) as ws:
        selected = str(ws.subprotocol)
        await asyncio.wait_for(ws.recv(), 10)  # HELLO
        await ws.send(msgpack.packb([16, 1, token(server, ids)]))
        async with asyncio.timeout(60):
            while len(got) < frames:
                message = msgpack.unpackb(await ws.recv(), strict_map_key=False)
                if message[0] == 2:  # SNAPSHOT [2, seq, att, entries]
                    got.append(message[3])
                elif message[0] == 3:  # DATA [3, seq, [[att, entries], ...]]
                    got.extend(entries for _att, entries in message[2])
    return selected, got


async def test_padding_only_for_clients_that_offer_it(sim_server: ServerProcess) -> None:
    # A client built before the padding offers pvwire.v1 alone and would take a nil item for a
    # malformed entry: it gets none. One that offers pvwire.v1.aligned gets its arrays aligned,
    # which over 20 messages of varying seq takes nil items in some of them.
    old, plain = await _raw_entries(sim_server, ["pvwire.v1"], 20)
    assert old == "pvwire.v1"
    assert all(e is not None for entries in plain for e in entries)
    new, padded = await _raw_entries(sim_server, ["pvwire.v1.aligned", "pvwire.v1"], 20)
    assert new == "pvwire.v1.aligned"
    assert any(e is None for entries in padded for e in entries)
