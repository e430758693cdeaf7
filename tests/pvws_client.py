"""A pvws protocol client for tests, written from pvws's own source (ornl-epics/pvws:
`WebSocket.java` for client messages, `Vtype2Json.java` for updates, `pvws.js` for how a client
merges them): JSON text frames at `/pvws/pv`, base64 arrays decoded as little-endian."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.frames import Frame, Opcode

ARRAY_FIELDS = {"b64dbl": "<f8", "b64flt": "<f4", "b64srt": "<i2", "b64byt": "u1", "b64int": "<i4"}


class PingRecorder(ClientConnection):
    """Records the server's WebSocket pings (the client answers them as usual)."""

    pings = 0

    def process_event(self, event: Any) -> None:
        if isinstance(event, Frame) and event.opcode is Opcode.PING:
            self.pings += 1
        super().process_event(event)


class PvwsClient:
    def __init__(self, ws: PingRecorder) -> None:
        self.ws = ws
        self.merged: dict[str, dict[str, Any]] = {}  # as pvws.js merges updates

    @classmethod
    async def connect(cls, base_url: str, **kwargs: Any) -> PvwsClient:
        url = base_url.replace("https://", "wss://").replace("http://", "ws://") + "/pvws/pv"
        ws = await connect(url, create_connection=PingRecorder, max_size=None, **kwargs)
        return cls(ws)  # type: ignore[arg-type]

    async def send(self, **message: Any) -> None:
        await self.ws.send(json.dumps(message))

    async def subscribe(self, *pvs: str) -> None:
        await self.send(type="subscribe", pvs=list(pvs))

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):  # not `wait_for`: see tests/stream_client.py
            text = await self.ws.recv()
        assert isinstance(text, str), "pvws sends text frames only"
        message: dict[str, Any] = json.loads(text)
        if message.get("type") == "update":
            merged = self.merged.setdefault(message["pv"], {"pv": message["pv"]})
            merged.update(message)
        return message

    async def next(self, kind: str, pv: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """The next message of `kind` (for `pv`), skipping others."""
        async with asyncio.timeout(timeout):
            while True:
                message = await self.recv(timeout)
                if message.get("type") == kind and (pv is None or message.get("pv") == pv):
                    return message

    async def close(self) -> None:
        await self.ws.close()


def array_of(message: dict[str, Any]) -> np.ndarray[Any, Any] | None:
    for field, dtype in ARRAY_FIELDS.items():
        if field in message:
            return np.frombuffer(base64.b64decode(message[field]), dtype=dtype)
    return None
