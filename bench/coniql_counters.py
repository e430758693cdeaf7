"""Coniql's client for the scale scenarios: one WebSocket, one `subscribeChannel` per counter PV.

Run as a bench.harness.Child (`python -m bench.coniql_client SPEC.json` with `kind: counters`).
It subscribes to every id in the spec, prints READY once every PV delivered a first value or
`ready_s` passed (Coniql may never get through 2,000 at 10 Hz: that is measured, not waited for),
then counts the updates that arrive inside the GO window. Coniql keeps only the latest update of a
subscription (a queue of one), so what it cannot send in time is lost for good; the client counts
per PV the counter's advance over the updates it saw, and the harness compares the total with the
IOC's nominal rate (PVs x 10 Hz x window), since a PV Coniql starves shows no advance at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
from typing import Any

import numpy as np
import orjson
import websockets

QUERY = 'subscription { subscribeChannel(id: "%s") { value { float } time { seconds } } }'


class Tally:
    """Per-PV first and last counter values inside the window, and the latencies."""

    def __init__(self, n: int) -> None:
        self.window = (math.inf, math.inf)
        self.before: list[float | None] = [None] * n  # last value seen before the window
        self.first: list[float | None] = [None] * n  # value before the window's first update
        self.last: list[float | None] = [None] * n
        self.received = 0
        self.seen = 0
        self.all_seen = asyncio.Event()
        self.latency_ms: list[float] = []
        self.errors: list[str] = []

    def update(self, i: int, value: float, stamp: float, now: float) -> None:
        t0, t1 = self.window
        if now < t0:
            if self.before[i] is None:
                self.seen += 1
                if self.seen == len(self.before):
                    self.all_seen.set()
            self.before[i] = value
        elif now <= t1:
            self.received += 1
            if self.first[i] is None:
                # No value before the window: count its first update as one step.
                prior = self.before[i]
                self.first[i] = prior if prior is not None else value - 1
            self.last[i] = value
            self.latency_ms.append((now - stamp) * 1e3)

    def result(self) -> dict[str, Any]:
        advance = sum(
            round(last - first)
            for first, last in zip(self.first, self.last, strict=True)
            if first is not None and last is not None
        )
        lat = np.array(self.latency_ms) if self.latency_ms else None
        return {
            "received": self.received,
            "counter_advance": advance,
            "pvs_connected": self.seen,
            "pvs_updated_in_window": sum(f is not None for f in self.first),
            "lat_p50_ms": float(np.percentile(lat, 50)) if lat is not None else None,
            "lat_p99_ms": float(np.percentile(lat, 99)) if lat is not None else None,
            "errors": self.errors[:3],
        }


async def _read(ws: Any, tally: Tally) -> None:
    try:
        async for raw in ws:
            now = time.time()
            msg = orjson.loads(raw)
            kind = msg.get("type")
            if kind == "next":
                ch = msg["payload"]["data"]["subscribeChannel"]
                value = (ch.get("value") or {}).get("float")
                stamp = (ch.get("time") or {}).get("seconds")
                if value is not None and stamp is not None:
                    tally.update(int(msg["id"]), value, stamp, now)
            elif kind == "error":
                tally.errors.append(str(msg.get("payload"))[:200])
            if now > tally.window[1]:
                return
    except websockets.ConnectionClosed as exc:
        tally.errors.append(f"connection lost: {exc}"[:200])


async def counters(spec: dict[str, Any]) -> dict[str, Any]:
    ids: list[str] = spec["ids"]
    tally = Tally(len(ids))
    deadline = float(spec["deadline"])
    ws_url = spec["url"].replace("http", "ws", 1) + "/ws"
    # No keepalive pings: a browser, Coniql's usual client, sends none, and a Coniql that is
    # behind answers them late (the client would drop the connection, 1011, at 2,000 PVs).
    ws = await websockets.connect(
        ws_url,
        subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
        max_size=None,
        ping_interval=None,
    )
    try:
        await ws.send(json.dumps({"type": "connection_init"}))
        await ws.recv()  # connection_ack
        for i, pv in enumerate(ids):
            sub = {"id": str(i), "type": "subscribe", "payload": {"query": QUERY % pv}}
            await ws.send(json.dumps(sub))
        reader = asyncio.create_task(_read(ws, tally))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tally.all_seen.wait(), float(spec["ready_s"]))
        print("READY", flush=True)
        line = (await asyncio.to_thread(sys.stdin.readline)).split()
        tally.window = (float(line[1]), float(line[2]))
        # The reader returns at the first message after the window; a Coniql that sends
        # nothing more is not waited for beyond the window.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader, max(0.5, min(deadline, tally.window[1]) - time.time()))
        reader.cancel()
    finally:
        # No closing handshake: a Coniql that is behind would answer it after its backlog.
        ws.transport.abort()
    return tally.result()


def run_counters(spec: dict[str, Any]) -> None:
    res = asyncio.run(counters(spec))
    with open(spec["out"], "w") as f:
        json.dump(res, f)
