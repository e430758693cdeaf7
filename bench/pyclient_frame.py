"""How a 4-megapixel uint16 frame reaches a Python client script: copies and time per frame.

    python -m bench.pyclient_frame [--frames 20] [--side 2048] [--repeat 30]

The real server serves `sim://image?width=2048&height=2048&dtype=uint16&rate=10`; the real
`pvwire_client.Client` monitors it, once with each of the client's two MessagePack readers
(`msgpack`, what every message went through before, and `msgview`, what large messages go through
now), in the same run. For each:
- which buffer the numpy array views (walking `.base`): the WebSocket message itself, or a
  separate bytes object the MessagePack decoder made for the ext payload (one more copy);
- tracemalloc's peak of Python-allocated memory between two frames, in frames: how many
  frame-sized buffers existed at once while one frame was received and decoded (the previous
  frame still held, the socket's chunks, the WebSocket reader's buffer, the message, the ext
  payload);
- on a captured message: `decode_message` time (best and median of `--repeat`) and its own
  tracemalloc peak in frames, i.e. the frame-sized copies decoding makes; against one memcpy
  of the message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import tracemalloc
from typing import Any

import msgpack
import numpy as np
import websockets
from pvwire_client import Client, msgview, wire
from pvwire_client.wire import decode_message

from bench.harness import Server

READERS = {"msgpack": 1 << 62, "msgview": wire.VIEWS_FROM}  # wire.VIEWS_FROM for each reader


def _viewed(a: np.ndarray[Any, Any]) -> str:
    """What the array's memory is: the whole message, or the ext payload msgpack copied out."""
    base: object = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, bytes | bytearray):
        return type(base).__name__
    if base[:2] in (b"\x93\x03", b"\x94\x02"):  # DATA, SNAPSHOT
        return "the WebSocket message"
    if len(base) == a.nbytes + 2 + 4 * a.ndim:
        return "the ext payload bytes (a copy made by msgpack)"
    return "other bytes"


async def _frames(url: str, sid: str, frames: int) -> dict[str, Any]:
    owners: list[str] = []
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
            owners.append(_viewed(v))
            if seen > 0:  # the first peak includes connecting
                peaks.append(peak)
            seen += 1
            if seen > frames:
                break
        await stream.aclose()
    tracemalloc.stop()
    return {"frame_bytes": frame_bytes, "viewed": owners, "peaks": peaks}


async def _one_message(url: str, token: str, frame_bytes: int) -> bytes:
    ws_url = url.replace("http", "ws", 1) + "/stream"
    async with websockets.connect(ws_url, subprotocols=["pvwire.v1"], max_size=None) as ws:  # type: ignore[list-item]
        await ws.send(msgpack.packb([16, 1, token]))
        while True:
            raw = await ws.recv()
            if isinstance(raw, bytes) and len(raw) > frame_bytes:
                return raw


def _decode_figures(raw: bytes, views: bool, repeat: int, frame_bytes: int) -> dict[str, Any]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        decode_message(raw, views=views)
        times.append((time.perf_counter() - t0) * 1e3)
    tracemalloc.start()
    msg = decode_message(raw, views=views)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del msg
    return {
        "decode_ms_best": round(min(times), 3),
        "decode_ms_median": round(statistics.median(times), 3),
        "decode_peak_in_frames": round(peak / frame_bytes, 2),
    }


def _many_entries(repeat: int) -> dict[str, float]:
    """A large message of small entries (15,000 float channels, ~315 KB): msgview walks its
    first items (its budget), then msgpack reads it. Best of `repeat`, ms, with and without
    that walk."""
    data = msgpack.packb(
        [3, 2, [[1, [[sid, 3, sid + 0.5, 7, 1_700_000_000, 5] for sid in range(15_000)]]]]
    )
    out = {"message_kB": len(data) / 1e3}
    for name, views in (("decode_ms_by_size", None), ("decode_ms_msgpack_only", False)):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            decode_message(data, views=views)
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = round(min(times), 3)
    # What walking all of it would cost, against msgpack's unpacking alone (no validation).
    for name, unpack in (
        ("msgview_walk_all_ms", lambda: msgview.unpack(data, lambda c, p: None)),
        ("msgpack_unpackb_ms", lambda: msgpack.unpackb(data)),
    ):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            unpack()
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = round(min(times), 3)
    return out


def measure(side: int, frames: int, repeat: int = 30) -> dict[str, Any]:
    sid = f"sim://image?width={side}&height={side}&dtype=uint16&rate=10"
    server = Server(dict(os.environ), ["--send-budget", str(64 << 20)])
    through: dict[str, dict[str, Any]] = {}
    try:
        for reader, views_from in READERS.items():
            wire.VIEWS_FROM = views_from
            try:
                through[reader] = asyncio.run(_frames(server.url, sid, frames))
            finally:
                wire.VIEWS_FROM = READERS["msgview"]
        raw = asyncio.run(_one_message(server.url, server.subscribe([sid]), side * side * 2))
    finally:
        server.stop()
    fb = through["msgview"]["frame_bytes"]
    t0 = time.perf_counter()
    for _ in range(repeat):
        bytearray(raw)
    copy_ms = (time.perf_counter() - t0) / repeat * 1e3
    readers: dict[str, Any] = {}
    for reader, got in through.items():
        peaks = [round(p / fb, 2) for p in got["peaks"]]
        readers[reader] = {
            "frames": len(got["viewed"]),
            "array_views": sorted(set(got["viewed"])),
            "peak_python_memory_per_frame_in_frames": peaks,
            "peak_median_in_frames": statistics.median(peaks) if peaks else None,
            **_decode_figures(raw, reader == "msgview" and len(raw) >= wire.VIEWS_FROM, repeat, fb),
        }
    return {
        "frame_MB": fb / 1e6,
        "message_MB": len(raw) / 1e6,
        "frames": len(through["msgview"]["viewed"]),
        "peak_python_memory_per_frame_in_frames": readers["msgview"][
            "peak_python_memory_per_frame_in_frames"
        ],
        "one_memcpy_of_the_message_ms": round(copy_ms, 3),
        "load_average": os.getloadavg()[0],
        "readers": readers,
        "many_small_entries": _many_entries(repeat),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--side", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.side, args.frames, args.repeat), indent=1))


if __name__ == "__main__":
    main()
