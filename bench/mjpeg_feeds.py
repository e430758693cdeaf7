"""MJPEG: server CPU of 30 viewers of one 1024 x 1024 image at 30 distinct `fps` values
(20.00, 20.01, ...) against 30 viewers at one `fps`.

Each server tree given (`--tree DIR`, a checkout's root; default this one) is started in turn, in
one run, so that the figures compare on this machine's speed of the moment:

    python bench/mjpeg_feeds.py --tree /path/to/old --tree .
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import httpx

IMAGE = "sim://image?width=1024&height=1024&dtype=uint8&rate=20"
VIEWERS = 30


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def view(client: httpx.AsyncClient, url: str, got: list[int], stop: asyncio.Event) -> None:
    async with client.stream("GET", url) as r:
        assert r.status_code == 200, await r.aread()
        async for chunk in r.aiter_raw():
            got[0] += len(chunk)
            got[1] += chunk.count(b"--BOUNDARY")  # parts (a boundary split by a chunk: missed)
            if stop.is_set():
                return


async def measure(base: str, pid: int, fps: list[str], seconds: float) -> tuple[float, int, int]:
    path = urllib.parse.quote(IMAGE, safe="")
    stop, got = asyncio.Event(), [0, 0]
    limits = httpx.Limits(max_connections=VIEWERS + 5)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        tasks = [
            asyncio.create_task(view(client, f"{base}/mjpeg/{path}?fps={f}", got, stop))
            for f in fps
        ]
        await asyncio.sleep(3.0)  # every viewer has its first frame: measure the steady state
        got[:], before = [0, 0], cpu_seconds(pid)
        await asyncio.sleep(seconds)
        cpu, (sent, parts) = cpu_seconds(pid) - before, got
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return cpu / seconds, sent, parts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_tree(tree: Path, seconds: float) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{tree}/server:{tree}/clients/py"}
    cmd = [sys.executable, "-m", "pvwire.cli", "serve", "--loopback", "--port", str(port),
           "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/healthz", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for label, fps in [
            ("30 distinct fps", [f"{20 + i / 100:.2f}" for i in range(VIEWERS)]),
            ("one fps", ["20"] * VIEWERS),
        ]:
            cores, sent, parts = asyncio.run(measure(base, proc.pid, fps, seconds))
            print(f"{tree}: {VIEWERS} viewers, {label}: server CPU {cores:.2f} cores, "
                  f"{parts / seconds:.0f} frames/s, {sent / seconds / 1e6:.1f} MB/s to the "
                  f"viewers, {cores * seconds / max(parts, 1) * 1e3:.1f} ms of CPU per frame "
                  "delivered")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.returncode not in (0, -15):
            print(f"{tree}: the server exited with {proc.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", type=Path)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    for tree in args.tree or [Path(__file__).resolve().parent.parent]:
        run_tree(tree.resolve(), args.seconds)


if __name__ == "__main__":
    main()
