"""The largest float64 waveform and uint16 image at 10 Hz with zero missing frames, 1 and 10
clients.

    python -m bench.big_arrays [--duration 10] [--clients 1,10] [--save]

Sources are `sim://waveform?length=N` and `sim://image?width=S&height=S&dtype=uint16` at 10 Hz
in the server under test (the sim limits raised through PVWIRE_SIM_* so every size is allowed).
For each size, growing, K clients (raw `websockets` + `msgpack`, each in its own process up to
`--procs`, the ndarray ext viewed in place with `np.frombuffer`) attach one token and count,
over the window: frames received, frames the server conflated (`serial` jumps), bytes. A size
passes when no client lost a frame (received >= 10 Hz x window - 1 and nothing conflated).
Server CPU is psutil process time over the window; CPU per MB divides it by the bytes all
clients received. The clients share the 2 cores with the server: their CPU is reported too.

`bench/big_arrays_client.py` runs `client_main` in each client process (the READY / GO protocol
of bench.harness.Child).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

RATE = 10.0
WAVEFORM_SIZES = (1_000_000, 2_000_000, 4_000_000, 8_000_000)
IMAGE_SIDES = (1024, 2048, 2896, 4096)  # 1, 4, 8.4, 16.8 megapixels
RESULTS = Path(__file__).parent / "results"


def source(kind: str, size: int) -> str:
    if kind == "waveform":
        return f"sim://waveform?length={size}&rate={RATE:g}"
    return f"sim://image?width={size}&height={size}&dtype=uint16&rate={RATE:g}"


def frame_bytes(kind: str, size: int) -> int:
    return size * 8 if kind == "waveform" else size * size * 2


# ---- client process


def _ext_hook(code: int, data: bytes) -> Any:
    if code != 1:
        return msgpack.ExtType(code, data)
    dt = ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8")[data[0]]
    return np.frombuffer(data, dtype="<" + dt, offset=2 + 4 * data[1])


async def _one(url: str, token: str, window: tuple[float, float], out: dict[str, Any]) -> None:
    import websockets

    ws_url = url.replace("http", "ws", 1) + "/stream"
    serial_prev = None
    stamp_prev = None
    async with websockets.connect(ws_url, subprotocols=["pvwire.v1"], max_size=None) as ws:  # type: ignore[list-item]
        await ws.send(msgpack.packb([16, 1, token]))
        t0, t1 = window
        while time.time() < t1:
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=max(0.1, t1 - time.time()))
            except TimeoutError:
                break
            now = time.time()
            msg = msgpack.unpackb(raw, ext_hook=_ext_hook)
            if msg[0] not in (2, 3):
                continue
            groups = [[msg[2], msg[3]]] if msg[0] == 2 else msg[2]
            for _att, entries in groups:
                for e in entries:
                    # None: nil padding before an array entry (PROTOCOL.md section 3).
                    if e is None or not e[1] & 1 or not isinstance(e[2], np.ndarray):
                        continue
                    serial = e[3]
                    stamp = e[4] + e[5] * 1e-9
                    if now >= t0:
                        count_stamp_gap(out, stamp_prev, stamp)
                        out["frames"] += 1
                        out["bytes"] += e[2].nbytes
                        if serial_prev is not None and serial > serial_prev + 1:
                            out["conflated"] += serial - serial_prev - 1
                        out["latency_ms"].append((now - e[4] - e[5] * 1e-9) * 1e3)
                    serial_prev = serial
                    stamp_prev = stamp


def count_stamp_gap(out: dict[str, Any], previous: float | None, stamp: float) -> None:
    """Frames missing between two source timestamps 1/RATE apart (a gap over 1.7 periods)."""
    if previous is not None and stamp - previous > 1.7 / RATE:
        out["stamp_gaps"] += round((stamp - previous) * RATE) - 1


def client_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    print("READY", flush=True)
    line = sys.stdin.readline().split()
    window = (float(line[1]), float(line[2]))
    outs = [
        {"frames": 0, "bytes": 0, "conflated": 0, "stamp_gaps": 0, "latency_ms": []}
        for _ in range(spec["n"])
    ]

    async def run() -> None:
        await asyncio.gather(*(_one(spec["url"], spec["token"], window, o) for o in outs))

    asyncio.run(run())
    for o in outs:
        lat = o.pop("latency_ms")
        o["latency_p50_ms"] = float(np.median(lat)) if lat else None
    Path(spec["out"]).write_text(json.dumps(outs))


# ---- driver


def run_case(
    kind: str, size: int, clients: int, duration: float, procs: int, tmp: Path, warmup: float = 3.0
) -> dict[str, Any]:
    from bench.harness import Child, ProcWatch, Server

    env = {
        **os.environ,
        "PVWIRE_SIM_MAX_LENGTH": str(64 * 1024 * 1024),
        "PVWIRE_SIM_MAX_BYTES_PER_S": "1e10",
    }
    server = Server(env, ["--send-budget", str(64 << 20)])  # as bench.harness for 8 MB frames
    children: list[Child] = []
    try:
        token = server.subscribe([source(kind, size)])
        per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
        for n in (n for n in per if n):
            spec = {"url": server.url, "token": token, "n": n}
            children.append(Child("bench.big_arrays_client", spec, env, tmp))
        deadline = time.time() + 60
        for c in children:
            c.wait_ready(deadline)
        t0 = time.time() + warmup
        t1 = t0 + duration
        for c in children:
            c.go(t0, t1)
        pid = server.pid
        assert pid is not None
        watch = ProcWatch({"server": [pid], "clients": [c.proc.pid for c in children]})
        time.sleep(max(0.0, t0 - time.time()))
        watch.start_window()
        time.sleep(max(0.0, t1 - time.time()))
        wall = watch.end_window()
        watch.stop()
        conns = [r for c in children for r in c.result(time.time() + 60)]
    finally:
        for c in children:
            c.kill()
        server.stop()
    expected = int(RATE * duration)
    mb = sum(c["bytes"] for c in conns) / 1e6
    server_cpu_s = watch.cpu_pct["server"] / 100 * wall
    worst = min((c["frames"] for c in conns), default=0)
    lat = [c["latency_p50_ms"] for c in conns if c["latency_p50_ms"] is not None]
    return {
        "kind": kind,
        "size": size,
        "frame_MB": frame_bytes(kind, size) / 1e6,
        "clients": clients,
        "expected_frames_per_client": expected,
        "min_frames_per_client": worst,
        "conflated": sum(c["conflated"] for c in conns),
        "zero_missing": worst >= expected - 1 and all(c["conflated"] == 0 for c in conns),
        "MB_per_s": mb / wall,
        "server_cpu_pct": watch.cpu_pct["server"],
        "clients_cpu_pct": watch.cpu_pct["clients"],
        "server_cpu_ms_per_MB": 1e3 * server_cpu_s / mb if mb else None,
        "latency_p50_ms": float(np.median(lat)) if lat else None,
        "loadavg_1m": os.getloadavg()[0],  # other work on the machine during the run
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--clients", default="1,10")
    ap.add_argument("--kinds", default="waveform,image")
    ap.add_argument("--procs", type=int, default=2, help="client processes (at most)")
    ap.add_argument("--max-index", type=int, default=99, help="stop the size sweep after this")
    ap.add_argument("--waveform-sizes", default=",".join(map(str, WAVEFORM_SIZES)))
    ap.add_argument("--image-sides", default=",".join(map(str, IMAGE_SIDES)))
    ap.add_argument("--save", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    rows = sweep(args)
    if args.save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "big_arrays.json").write_text(json.dumps(rows, indent=1))


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each kind, each client count: sizes growing until one loses frames."""
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for kind in args.kinds.split(","):
            listed = args.waveform_sizes if kind == "waveform" else args.image_sides
            sizes = [int(x) for x in listed.split(",")]
            for clients in (int(c) for c in args.clients.split(",")):
                for i, size in enumerate(sizes[: args.max_index + 1]):
                    procs = min(args.procs, clients)
                    row = run_case(kind, size, clients, args.duration, procs, Path(d), args.warmup)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if not row["zero_missing"] and i > 0:
                        break  # the largest passing size is found
    return rows


if __name__ == "__main__":
    main()
