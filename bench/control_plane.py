"""Does the control plane stall the data plane? `python -m bench.control_plane [--duration S]`.

A plain client streams `sim://counter?rate=50` from the real server and records the time between
its DATA frames, first with no other load (the baseline), then while GraphQL clients send the
heaviest requests the server accepts, back to back:
- `large`: five aliases of a 1,000,001-point waveform (refused: TOO_LARGE);
- `budget`: a 100,000-element waveform, the most one response may carry;
- `unknown`: `channels` of 2,000 names no IOC serves, 1 s timeout;
- `costly`: a query over the cost limit (refused before it runs).
Reports the worst and p99 gap of each window and the request count and latency per kind. The
goal (issue: control plane never stalls the data plane) is a worst gap during load of about one
tick (20 ms) above the baseline's. No IOC is needed: unknown CA names are searched on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from pvwire.loopback import apply_loopback_env
from pvwire_client import wire

from tests.server_process import ServerProcess
from tests.stream_client import RawStream

RESULTS = Path(__file__).parent / "results"

REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "large": (
        "query { "
        + " ".join(
            f'a{i}: channel(id: "sim://waveform?length=1000001&rate=1") {{ id }}' for i in range(5)
        )
        + " }",
        {},
    ),
    "budget": ('query { channel(id: "sim://waveform/b?length=100000&rate=1") { value } }', {}),
    "unknown": (
        "query($ids: [String!]!) { channels(ids: $ids, timeout: 1) { id errorCode } }",
        {"ids": [f"ca://BENCH:NOPE:{i}" for i in range(2000)]},
    ),
    "costly": (
        "query($ids: [String!]!) { channels(ids: $ids) { id } }",
        {"ids": [f"sim://counter/{i}" for i in range(30_000)]},
    ),
}


async def gaps(server: ServerProcess, seconds: float) -> list[float]:
    """Milliseconds between consecutive DATA frames of a 50 Hz counter over `seconds`."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        doc = (
            await http.post(
                "/graphql",
                json={
                    "query": 'mutation { subscribe(ids: ["sim://counter/gap?rate=50"]) { token } }'
                },
            )
        ).json()
    stream = await RawStream.connect(server.ws_url)
    try:
        await stream.attach(doc["data"]["subscribe"]["token"])
        last = None
        out: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            msg = await stream.recv(timeout=30)
            if isinstance(msg, wire.Data):
                now = time.perf_counter()
                if last is not None:
                    out.append((now - last) * 1000.0)
                last = now
        return out
    finally:
        await stream.close()


async def load(server: ServerProcess, kind: str, stop: asyncio.Event, log: list[float]) -> None:
    query, variables = REQUESTS[kind]
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        while not stop.is_set():
            started = time.perf_counter()
            await http.post("/graphql", json={"query": query, "variables": variables})
            log.append((time.perf_counter() - started) * 1000.0)


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(values),
        "median_ms": round(statistics.median(ordered), 1),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        "max_ms": round(ordered[-1], 1),
    }


async def measure(duration: float, kinds: list[str]) -> dict[str, Any]:
    with ServerProcess() as server:
        baseline = await gaps(server, duration)
        stop = asyncio.Event()
        logs: dict[str, list[float]] = {k: [] for k in kinds}
        loaders = [asyncio.create_task(load(server, k, stop, logs[k])) for k in kinds]
        try:
            loaded = await gaps(server, duration)
        finally:
            stop.set()
            await asyncio.gather(*loaders, return_exceptions=True)
    return {
        "baseline_gaps": summary(baseline),
        "loaded_gaps": summary(loaded),
        "requests": {k: summary(v) for k, v in logs.items()},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.control_plane", description=__doc__)
    p.add_argument("--duration", type=float, default=15.0, help="seconds per window")
    p.add_argument("--save", action="store_true", help="write bench/results/control_plane.json")
    p.add_argument("--kinds", default=",".join(REQUESTS), help="request kinds to send")
    a = p.parse_args(argv)
    apply_loopback_env()
    result = asyncio.run(measure(a.duration, a.kinds.split(",")))
    print(json.dumps(result, indent=1))
    if a.save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "control_plane.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
