"""The Python client's WebSocket transport against `websockets`: frame-sized copies and client CPU
per 4-megapixel frame, same run, same real server.

    python -m bench.pyclient_transport [--frames 20] [--side 2048] [--rounds 2]

The real server serves `sim://image?width=2048&height=2048&dtype=uint16&rate=10`; the real
`pvwire_client.Client.monitor` receives it through `pvwire_client.transport` (now) and through
`websockets` 17 (before, behind the same interface), alternately. For each:
- with tracemalloc: the peak of Python memory between two frames, in frames. The monitor holds the
  previous frame (1); the rest, rounded, are the frame-sized buffers the receive path made.
  Under `websockets` the socket's reads land in asyncio's chunks (`data_received` bytes of up to
  256 KiB), so each frame-sized buffer is a copy of the frame beyond the socket's read; the
  transport's one buffer is where the socket reads (`recv_into`), so it is no extra copy;
- without tracemalloc: the client process's CPU time between two frames (`time.process_time`;
  it does nothing else), i.e. socket to numpy plus the client's merge of the entry.
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

import numpy as np
import pvwire_client.client as client_module
import websockets
from pvwire_client import Client, transport
from websockets.protocol import State

from bench.harness import Server
from bench.pyclient_frame import _viewed


class _Websockets:
    """What the client used before: a websockets connection behind transport's interface."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.subprotocol = ws, ws.subprotocol
        self.closing: asyncio.Future[None] | None = None

    async def recv(self) -> Any:
        try:
            return await self.ws.recv()
        except websockets.ConnectionClosed as e:
            raise _closed(e) from None

    async def send(self, data: bytes) -> None:
        try:
            await self.ws.send(data)
        except websockets.ConnectionClosed as e:
            raise _closed(e) from None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.ws.close(code, reason)

    def start_close(self, code: int = 1000, reason: str = "") -> None:
        # websockets' close always waits for the handshake: here it runs as a task of its own.
        self.closing = asyncio.ensure_future(self.ws.close(code, reason))

    def abort(self) -> None:
        self.ws.transport.abort()

    @property
    def closed(self) -> bool:
        return bool(self.ws.state is State.CLOSED)


def _closed(e: websockets.ConnectionClosed) -> transport.ConnectionClosed:
    frame = e.rcvd or e.sent
    return transport.ConnectionClosed(frame.code if frame else 1006, frame.reason if frame else "")


async def _websockets_connect(
    url: str,
    *,
    subprotocols: list[str],
    max_size: int,
    open_timeout: float = 10.0,
    ssl: Any = None,
) -> Any:
    ws = await websockets.connect(
        url,
        subprotocols=subprotocols,  # type: ignore[arg-type]
        compression=None,
        max_size=max_size,
        open_timeout=open_timeout,
        **({"ssl": ssl} if url.startswith("wss:") else {}),  # as transport.connect reads it
    )
    return _Websockets(ws)


TRANSPORTS: dict[str, Any] = {"websockets": _websockets_connect, "transport": transport.connect}
# Whether the socket reads into the message's own buffer (see the module's docstring).
READS_INTO_MESSAGE = {"websockets": False, "transport": True}


async def _pass(url: str, sid: str, frames: int, trace: bool) -> dict[str, Any]:
    peaks: list[int] = []
    cpu: list[float] = []
    viewed: set[str] = set()
    frame_bytes = 0
    if trace:
        tracemalloc.start()
    async with Client(url, timeout=30) as client:
        stream = client.monitor([sid])
        seen = 0
        last = time.process_time()
        async for u in stream:
            v = u.channel.value
            if not isinstance(v, np.ndarray):
                continue
            now = time.process_time()
            if trace:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.reset_peak()
            frame_bytes = v.nbytes
            viewed.add(_viewed(v))
            if seen > 0:  # the first frame includes connecting
                (peaks.append(peak) if trace else cpu.append((now - last) * 1e3))
            seen += 1
            last = time.process_time()
            if seen > frames:
                break
        await stream.aclose()
    if trace:
        tracemalloc.stop()
    return {"frame_bytes": frame_bytes, "peaks": peaks, "cpu_ms": cpu, "viewed": viewed}


def _run(url: str, sid: str, name: str, frames: int, trace: bool) -> dict[str, Any]:
    # The client module's own name for the transport's connect, swapped for this pass.
    names = vars(client_module)
    saved, names["connect"] = names["connect"], TRANSPORTS[name]
    try:
        return asyncio.run(_pass(url, sid, frames, trace))
    finally:
        names["connect"] = saved


def measure(side: int, frames: int, rounds: int = 2) -> dict[str, Any]:
    sid = f"sim://image?width={side}&height={side}&dtype=uint16&rate=10"
    server = Server(dict(os.environ), ["--send-budget", str(64 << 20)])
    load_start = os.getloadavg()[0]
    got: dict[str, dict[str, Any]] = {
        n: {"peaks": [], "cpu_ms": [], "viewed": set()} for n in TRANSPORTS
    }
    frame_bytes = 0
    try:
        for _ in range(rounds):
            for name in TRANSPORTS:  # alternated, so drifting load touches both alike
                for trace in (True, False):
                    r = _run(server.url, sid, name, frames, trace)
                    frame_bytes = r["frame_bytes"]
                    for k in ("peaks", "cpu_ms"):
                        got[name][k] += r[k]
                    got[name]["viewed"] |= r["viewed"]
    finally:
        server.stop()
    out: dict[str, Any] = {}
    for name, g in got.items():
        peak = statistics.median(g["peaks"]) / frame_bytes
        out[name] = {
            "frames": len(g["cpu_ms"]),
            "array_views": sorted(g["viewed"]),
            "peak_median_in_frames": round(peak, 2),
            "frame_sized_buffers_per_frame": round(peak - 1),
            "copies_of_the_frame_beyond_the_socket": round(peak - 1) - READS_INTO_MESSAGE[name],
            "client_cpu_ms_per_frame_median": round(statistics.median(g["cpu_ms"]), 2),
            "client_cpu_ms_per_frame_best": round(min(g["cpu_ms"]), 2),
        }
    before, after = out["websockets"], out["transport"]
    return {
        "frame_MB": frame_bytes / 1e6,
        "transports": out,
        "cpu_ratio_websockets_to_transport": round(
            before["client_cpu_ms_per_frame_median"] / after["client_cpu_ms_per_frame_median"], 2
        ),
        "load_average": [load_start, os.getloadavg()[0]],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--side", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.side, args.frames, args.rounds), indent=1))


if __name__ == "__main__":
    main()
