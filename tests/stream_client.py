"""A bare protocol client for server tests: real WebSocket, the Python client's decoder, no
reconnect logic, so each test sees exactly what the server sends."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import websockets
from pvwire_client import wire

__all__ = ["RawStream"]


class RawStream:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.req = 0

    @classmethod
    async def connect(cls, ws_url: str, **kwargs: Any) -> RawStream:
        ws = await websockets.connect(
            ws_url,
            subprotocols=[websockets.Subprotocol("pvwire.v1")],
            compression=None,
            max_size=None,
            **kwargs,
        )
        stream = cls(ws)
        hello = await stream.recv()
        assert isinstance(hello, wire.Hello), hello
        return stream

    async def recv(self, timeout: float = 10.0) -> Any:
        # Not `wait_for`: on 3.11 it loses a cancel that lands with a message, and a reader
        # draining a busy stream then never ends (tests/test_stream_client.py).
        async with asyncio.timeout(timeout):
            data = await self.ws.recv()
        return wire.decode_message(data)

    async def send(self, *message: Any) -> None:
        await self.ws.send(msgpack.packb(list(message)))

    async def attach(self, token: str) -> tuple[wire.Attached, wire.Snapshot]:
        self.req += 1
        await self.send(16, self.req, token)
        attached = await self.recv()
        assert isinstance(attached, wire.Attached), attached
        snapshot = await self.recv()
        assert isinstance(snapshot, wire.Snapshot), snapshot
        return attached, snapshot

    async def next_data(self, timeout: float = 10.0) -> wire.Data:
        while True:
            msg = await self.recv(timeout)
            if isinstance(msg, wire.Data):
                return msg

    async def close(self) -> None:
        await self.ws.close()
