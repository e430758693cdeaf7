"""A Coniql client process, Coniql's own method: GraphQL subscriptions over WebSocket
(graphql-transport-ws), each update a JSON message. `python -m bench.coniql_client SPEC.json`
(READY / GO as bench.harness.Child).

Two kinds: `array` (bench.coniql_compare: `n` connections to one PV, the array in base64 decoded
to numpy) and `counters` (bench.harness, the scale scenarios: one connection with one
subscription per counter PV, as a Coniql web page does; see bench.coniql_counters).
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import websockets

from bench.big_arrays import count_stamp_gap

QUERY = (
    'subscription { subscribeChannel(id: "%s") '
    "{ value { base64Array { numberType base64 } } time { seconds } } }"
)


async def _one(url: str, pv: str, window: tuple[float, float], out: dict[str, Any]) -> None:
    ws_url = url.replace("http", "ws", 1) + "/ws"
    stamp_prev = None
    async with websockets.connect(
        ws_url,
        subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
        max_size=None,
    ) as ws:
        await ws.send(json.dumps({"type": "connection_init"}))
        await ws.recv()  # connection_ack
        sub = {"id": "1", "type": "subscribe", "payload": {"query": QUERY % pv}}
        await ws.send(json.dumps(sub))
        t0, t1 = window
        while time.time() < t1:
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=max(0.1, t1 - time.time()))
            except TimeoutError:
                break
            now = time.time()
            msg = json.loads(raw)
            if msg.get("type") != "next":
                if msg.get("type") == "error":
                    out["errors"].append(str(msg.get("payload"))[:200])
                continue
            ch = msg["payload"]["data"]["subscribeChannel"]
            arr = (ch.get("value") or {}).get("base64Array")
            if arr is None:
                continue
            value = np.frombuffer(base64.b64decode(arr["base64"]), arr["numberType"].lower())
            stamp = float(ch["time"]["seconds"])
            if now >= t0:
                count_stamp_gap(out, stamp_prev, stamp)
                out["frames"] += 1
                out["bytes"] += value.nbytes
                out["wire_bytes"] += len(raw)
                out["latency_ms"].append((now - stamp) * 1e3)
            stamp_prev = stamp


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("kind") == "counters":
        from bench.coniql_counters import run_counters

        run_counters(spec)
        return
    print("READY", flush=True)
    line = sys.stdin.readline().split()
    window = (float(line[1]), float(line[2]))
    outs: list[dict[str, Any]] = [
        {"frames": 0, "bytes": 0, "wire_bytes": 0, "conflated": 0, "stamp_gaps": 0,
         "latency_ms": [], "errors": []}
        for _ in range(spec["n"])
    ]  # fmt: skip

    async def run() -> None:
        await asyncio.gather(*(_one(spec["url"], spec["pv"], window, o) for o in outs))

    asyncio.run(run())
    for o in outs:
        lat = o.pop("latency_ms")
        o["latency_p50_ms"] = float(np.median(lat)) if lat else None
    Path(spec["out"]).write_text(json.dumps(outs))


if __name__ == "__main__":
    main(sys.argv[1])
