"""Connection-churn soak: clients connect, attach, detach and disconnect for a long time while
the server's RSS and open file descriptors are sampled from /proc; both should stay flat.

    .venv/bin/python -m bench.churn --duration 1800          # the full 30-minute soak
    .venv/bin/python -m bench.churn --duration 300 --workers 8

Each worker loops: register a token through GraphQL (a fresh random subset of sim channels and
options each time, so views and channels are created and released), open a WebSocket, attach,
read a few frames, sometimes detach first, sometimes drop the socket without a close frame, then
start again. Sim channels only: the churn measures the server's own bookkeeping, not an IOC.
Writes bench/results/churn.{json,png} (RSS and fds against time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgpack
import websockets

from tests.server_process import ServerProcess

from .scenario import RESULTS

CHANNELS = [f"sim://counter/c{i}?rate=10" for i in range(200)] + [
    "sim://sine", "sim://ramp", "sim://waveform?length=1000", "sim://noise",
]  # fmt: skip


@dataclass
class ChurnStats:
    cycles: int = 0
    attaches: int = 0
    detaches: int = 0
    aborts: int = 0  # sockets dropped without a close frame
    frames: int = 0
    errors: list[str] = field(default_factory=list)


def proc_sample(pid: int) -> tuple[float, int]:
    """(RSS in MB, open file descriptors) of a process, from /proc."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def worker(url: str, ws_url: str, stop: float, stats: ChurnStats, seed: int) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while time.monotonic() < stop:
            try:
                await one_cycle(http, ws_url, rng, stats)
            except Exception as exc:  # counted and reported; the soak goes on
                stats.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                await asyncio.sleep(0.5)


async def one_cycle(
    http: httpx.AsyncClient, ws_url: str, rng: random.Random, s: ChurnStats
) -> None:
    ids = rng.sample(CHANNELS, rng.randint(1, 20))
    options = {"maxRate": rng.choice([0.0, 0.0, 2.0]), "mode": rng.choice(["LATEST", "ALL"])}
    r = await http.post(
        "/graphql",
        json={
            "query": "mutation($i: [String!]!, $o: SubscribeOptions)"
            " { subscribe(ids: $i, options: $o) { token } }",
            "variables": {"i": ids, "o": options},
        },
    )
    doc = r.json()
    if "errors" in doc:
        raise RuntimeError(f"subscribe: {doc['errors'][0]['message']}")
    token = doc["data"]["subscribe"]["token"]
    ws = await websockets.connect(
        ws_url, subprotocols=[websockets.Subprotocol("pvwire.v1")], compression=None,
        max_size=None, open_timeout=10,
    )  # fmt: skip
    try:
        await asyncio.wait_for(ws.recv(), 10)  # HELLO
        atts = []
        for req in range(1, rng.randint(1, 3) + 1):  # one to three attachments of the token
            await ws.send(msgpack.packb([16, req, token]))
            atts.append(req)
        live: list[int] = []
        for _ in range(rng.randint(2, 10) + 2 * len(atts)):
            msg = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10), strict_map_key=False)
            s.frames += 1
            if msg[0] == 1:
                s.attaches += 1
                live.append(msg[2])
                if len(live) > 1 and rng.random() < 0.5:  # the last one keeps data coming
                    await ws.send(msgpack.packb([17, 100 + msg[2], live.pop(0)]))
                    s.detaches += 1
            elif msg[0] == 5:
                raise RuntimeError(f"server ERROR {msg[2]}: {msg[3]}")
        if rng.random() < 0.5:  # detach the rest and wait for the answers, then close
            for att in live:
                await ws.send(msgpack.packb([17, 200 + att, att]))
            while live:
                msg = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10), strict_map_key=False)
                if msg[0] == 4 and msg[2] in live:
                    live.remove(msg[2])
                    s.detaches += 1
        if rng.random() < 0.2:
            ws.transport.abort()  # no close frame: the server must notice on its own
            s.aborts += 1
            return
    finally:
        await ws.close()
    s.cycles += 1


async def sampler(pid: int, stop: float, every: float, out: list[tuple[float, float, int]]) -> None:
    t0 = time.monotonic()
    while time.monotonic() < stop:
        rss, fds = proc_sample(pid)
        out.append((time.monotonic() - t0, rss, fds))
        await asyncio.sleep(every)


async def soak(duration: float, workers: int, sample_every: float) -> dict[str, Any]:
    with ServerProcess("--log-level", "warning") as server:
        pid = server.pid
        assert pid is not None
        stats = ChurnStats()
        samples: list[tuple[float, float, int]] = []
        stop = time.monotonic() + duration
        await asyncio.gather(
            sampler(pid, stop, sample_every, samples),
            *(worker(server.url, server.ws_url, stop, stats, seed) for seed in range(workers)),
        )
        await asyncio.sleep(2)  # let closed sockets and lingering channels go
        rss_end, fds_end = proc_sample(pid)
        clients = server.graphql("{ server { clients { address } } }")["data"]["server"]
    # The first samples include start-up allocation; "start" is after a short warm-up.
    warm = next((s for s in samples if s[0] >= min(30.0, duration / 10)), samples[0])
    return {
        "scenario": "churn",
        "duration_s": duration,
        "workers": workers,
        "cycles": stats.cycles,
        "attaches": stats.attaches,
        "detaches": stats.detaches,
        "aborts": stats.aborts,
        "frames": stats.frames,
        "errors": stats.errors[:20],
        "error_count": len(stats.errors),
        "rss_start_mb": round(warm[1], 1),
        "rss_end_mb": round(rss_end, 1),
        "rss_max_mb": round(max(s[1] for s in samples), 1),
        "fds_start": warm[2],
        "fds_end": fds_end,
        "fds_max": max(s[2] for s in samples),
        "clients_left": len(clients["clients"]),
        "samples": samples,
    }


def plot(res: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] / 60 for s in res["samples"]]
    fig, ax_rss = plt.subplots(figsize=(9, 4))
    ax_rss.plot(t, [s[1] for s in res["samples"]], color="tab:blue", label="RSS MB")
    ax_rss.set(xlabel="minutes", ylabel="server RSS, MB", ylim=(0, None))
    ax_fd = ax_rss.twinx()
    ax_fd.plot(t, [s[2] for s in res["samples"]], color="tab:orange", label="open fds")
    ax_fd.set(ylabel="server open file descriptors", ylim=(0, None))
    ax_rss.set_title(
        f"Connection churn: {res['workers']} workers, {res['cycles']:,} cycles, "
        f"{res['attaches']:,} attaches in {res['duration_s'] / 60:.0f} min"
    )
    fig.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def summary(res: dict[str, Any]) -> str:
    return (
        f"churn {res['duration_s']:.0f} s, {res['workers']} workers: {res['cycles']:,} cycles, "
        f"{res['attaches']:,} attaches, {res['detaches']:,} detaches, {res['aborts']:,} aborted "
        f"sockets, {res['error_count']} errors; server RSS {res['rss_start_mb']} -> "
        f"{res['rss_end_mb']} MB (max {res['rss_max_mb']}), fds {res['fds_start']} -> "
        f"{res['fds_end']} (max {res['fds_max']}), sessions left {res['clients_left']}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.churn", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--duration", type=float, default=1800.0, help="seconds (default 1800)")
    p.add_argument("--workers", type=int, default=8, help="concurrent churning clients")
    p.add_argument("--sample-every", type=float, default=1.0, help="seconds between samples")
    a = p.parse_args(argv)
    res = asyncio.run(soak(a.duration, a.workers, a.sample_every))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "churn.json").write_text(json.dumps(res, indent=1))
    png = plot(res, RESULTS / "churn.png")
    print(summary(res))
    print(f"wrote {RESULTS / 'churn.json'}, {png}")


if __name__ == "__main__":
    main()
