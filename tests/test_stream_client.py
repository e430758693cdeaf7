"""The test suite's bare stream client (tests/stream_client.py): a task reading with it ends when
cancelled, even when a message arrives in the same loop pass as the cancel. Python 3.11's
`asyncio.wait_for` returned that message instead, the cancel lost: a draining reader then read
on for as long as the server kept sending (the attack suite's recorder, which hung its test)."""

from __future__ import annotations

import asyncio

import pytest
from pvwire.wire.codec import HEARTBEAT

from tests.stream_client import RawStream


class _Socket:
    """A WebSocket whose `recv` the test completes by hand."""

    def __init__(self) -> None:
        self.pending: asyncio.Future[bytes] | None = None
        self.waiting = asyncio.Event()

    async def recv(self) -> bytes:
        self.pending = asyncio.get_running_loop().create_future()
        self.waiting.set()
        return await self.pending


async def test_a_cancelled_reader_ends_when_a_message_lands_with_the_cancel() -> None:
    ws = _Socket()
    stream = RawStream(ws)
    received = 0

    async def drain() -> None:
        nonlocal received
        while True:
            await stream.recv(timeout=120)
            received += 1

    task = asyncio.create_task(drain())
    await ws.waiting.wait()
    ws.waiting.clear()
    assert ws.pending is not None
    # The message and the cancel in the same pass of the loop, as for a reader of a busy stream.
    ws.pending.set_result(HEARTBEAT)
    task.cancel()
    ended = asyncio.create_task(asyncio.wait({task}))
    asked_again = asyncio.create_task(ws.waiting.wait())
    try:
        done, _ = await asyncio.wait({ended, asked_again}, return_when=asyncio.FIRST_COMPLETED)
        assert ended in done, f"the reader went on reading after its cancel ({received} read)"
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        asked_again.cancel()
        task.cancel()  # the reader that lost its cancel, so the loop closes clean
        await asyncio.gather(task, ended, asked_again, return_exceptions=True)
