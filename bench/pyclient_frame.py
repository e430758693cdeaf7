"""How a 4-megapixel uint16 frame reaches a Python client script: copies and time per frame.

    python -m bench.pyclient_frame [--frames 20] [--side 2048]

The real server serves `sim://image?width=2048&height=2048&dtype=uint16&rate=10`; the real
`pvwire_client.Client` monitors it. For each frame:
- which buffer the numpy array views (walking `.base`): the WebSocket message itself, or a
  separate bytes object the MessagePack decoder made for the ext payload (one more copy);
- tracemalloc's peak of Python-allocated memory between two frames, in frames: how many
  frame-sized buffers existed at once while one frame was received and decoded (the socket's
  chunks, the WebSocket reader's buffer, the message, the ext payload);
- `decode_message` time on a captured message against one 8 MB memcpy on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import tracemalloc
from typing import Any

import numpy as np
import websockets
from pvwire_client import Client
from pvwire_client.wire import decode_message

from bench.harness import Server


def _owner(a: np.ndarray[Any, Any]) -> object:
    base: object = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        return base.obj
    return base


async def _frames(url: str, sid: str, frames: int) -> dict[str, Any]:
    owners: list[int] = []
    peaks: list[int] = []
    frame_bytes = 0
    tracemalloc.start()
    async with Client(url, timeout=30) as client:
        stream = client.monitor([sid])
        seen = 0
        async for u in stream:
            v = u.channel.value
            if not isinstance(v, np.ndarray):
                continue
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            frame_bytes = v.nbytes
            owner = _owner(v)
            owners.append(len(owner) if isinstance(owner, bytes | bytearray) else -1)
            if seen > 0:  # the first peak includes connecting
                peaks.append(peak)
            seen += 1
            if seen > frames:
                break
        await stream.aclose()
    tracemalloc.stop()
    return {"frame_bytes": frame_bytes, "owner_lens": owners, "peaks": peaks}


async def _one_message(url: str, token: str, frame_bytes: int) -> bytes:
    ws_url = url.replace("http", "ws", 1) + "/stream"
    import msgpack

    async with websockets.connect(ws_url, subprotocols=["pvwire.v1"], max_size=None) as ws:  # type: ignore[list-item]
        await ws.send(msgpack.packb([16, 1, token]))
        while True:
            raw = await ws.recv()
            if isinstance(raw, bytes) and len(raw) > frame_bytes:
                return raw


def measure(side: int, frames: int) -> dict[str, Any]:
    sid = f"sim://image?width={side}&height={side}&dtype=uint16&rate=10"
    server = Server(dict(os.environ), ["--send-budget", str(64 << 20)])
    try:
        got = asyncio.run(_frames(server.url, sid, frames))
        raw = asyncio.run(_one_message(server.url, server.subscribe([sid]), side * side * 2))
    finally:
        server.stop()
    fb = got["frame_bytes"]
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        decode_message(raw)
    decode_ms = (time.perf_counter() - t0) / n * 1e3
    t0 = time.perf_counter()
    for _ in range(n):
        bytearray(raw)
    copy_ms = (time.perf_counter() - t0) / n * 1e3
    owner_is_ext = all(0 < x < len(raw) for x in got["owner_lens"])
    return {
        "frame_MB": fb / 1e6,
        "message_MB": len(raw) / 1e6,
        "frames": len(got["owner_lens"]),
        "array_views": "the ext payload bytes (a copy made by msgpack)"
        if owner_is_ext
        else "the WebSocket message",
        "peak_python_memory_per_frame_in_frames": [round(p / fb, 2) for p in got["peaks"]],
        "decode_message_ms": round(decode_ms, 2),
        "one_memcpy_of_the_message_ms": round(copy_ms, 2),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--side", type=int, default=2048)
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.side, args.frames), indent=1))


if __name__ == "__main__":
    main()
