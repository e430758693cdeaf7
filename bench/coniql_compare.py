"""pvwire and Coniql 0.4.2 side by side, same IOC arrays, same run: big waveforms and images at
10 Hz.

    python -m bench.coniql_compare [--duration 10]

The IOC (EPICS base, CA) serves `BENCH:WF` (waveform, FTVL DOUBLE, NELM = --waveform) and
`BENCH:IMG` (waveform, FTVL USHORT, NELM = --image squared: an image's pixels, the only way
Coniql can carry one) scanned at 10 Hz, filled once by a PVA put. Both servers watch them over
CA. pvwire's clients: bench.big_arrays_client (MessagePack ndarray over /stream); Coniql's:
bench.coniql_client (its own method, a GraphQL subscription with base64 arrays). For 1 and 10
clients of each array: frames per client against 10 Hz x window, frames missing by source
timestamp gaps, each server's CPU and CPU per MB delivered.

Coniql is not a dependency of pvwire: `make coniql` installs it in `.venv-coniql`
(bench/coniql.py; `CONIQL_PYTHON` points at another install).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from pvwire_dev.ioc import IocProcess

from bench.big_arrays import RATE, RESULTS
from bench.coniql import ConiqlServer, coniql_python
from bench.harness import Child, ProcWatch, Server

PVWIRE_CLIENT = "bench.big_arrays_client"
CONIQL_CLIENT = "bench.coniql_client"
SEND_BUDGET = 64 << 20  # as bench.harness for 8 MB frames


def _split(clients: int, procs: int) -> list[int]:
    return [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]


def _db(path: Path, wf: int, side: int) -> None:
    path.write_text(
        'record(waveform, "BENCH:WF") {\n  field(SCAN, ".1 second")\n'
        f'  field(FTVL, "DOUBLE")\n  field(NELM, "{wf}")\n}}\n'
        'record(waveform, "BENCH:IMG") {\n  field(SCAN, ".1 second")\n'
        f'  field(FTVL, "USHORT")\n  field(NELM, "{side * side}")\n}}\n'
    )


def _fill(env: dict[str, str], wf: int, side: int) -> None:
    code = (
        "import numpy as np; from p4p.client.thread import Context\n"
        "c = Context('pva')\n"
        f"c.put('BENCH:WF', np.sin(np.arange({wf}) / 1000.0), timeout=30)\n"
        f"c.put('BENCH:IMG', (np.arange({side * side}) % 65536).astype(np.uint16), timeout=30)\n"
        "c.close()"
    )
    subprocess.run([os.sys.executable, "-c", code], env=env, check=True, timeout=60)


def _measure(
    server_pid: int, children: list[Child], duration: float
) -> tuple[list[dict[str, Any]], dict[str, float], float]:
    deadline = time.time() + 60
    for c in children:
        c.wait_ready(deadline)
    t0 = time.time() + 4.0  # warm-up: connections, first frames
    t1 = t0 + duration
    for c in children:
        c.go(t0, t1)
    watch = ProcWatch({"server": [server_pid], "clients": [c.proc.pid for c in children]})
    time.sleep(max(0.0, t0 - time.time()))
    watch.start_window()
    time.sleep(max(0.0, t1 - time.time()))
    wall = watch.end_window()
    watch.stop()
    conns = [r for c in children for r in c.result(time.time() + 90)]
    return conns, watch.cpu_pct, wall


def _row(
    system: str, pv: str, clients: int, conns: list[dict[str, Any]], cpu: dict[str, float],
    wall: float, duration: float,
) -> dict[str, Any]:  # fmt: skip
    expected = int(RATE * duration)
    mb = sum(c["bytes"] for c in conns) / 1e6
    lat = [c["latency_p50_ms"] for c in conns if c["latency_p50_ms"] is not None]
    worst = min((c["frames"] for c in conns), default=0)
    missing = sum(c["stamp_gaps"] + c["conflated"] for c in conns)
    return {
        "system": system,
        "pv": pv,
        "clients": clients,
        "expected_frames_per_client": expected,
        "min_frames_per_client": worst,
        "missing_frames": missing,
        "zero_missing": missing == 0 and worst >= expected - 1,
        "MB_per_s": mb / wall,
        "wire_MB_per_s": sum(c.get("wire_bytes", c["bytes"]) for c in conns) / 1e6 / wall,
        "server_cpu_pct": cpu["server"],
        "clients_cpu_pct": cpu["clients"],
        "server_cpu_ms_per_MB": 1e3 * cpu["server"] / 100 * wall / mb if mb else None,
        "latency_p50_ms": float(np.median(lat)) if lat else None,
        "errors": sorted({e for c in conns for e in c.get("errors", [])})[:3],
        "loadavg_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--waveform", type=int, default=1_000_000)
    ap.add_argument("--image", type=int, default=1024, help="image side (uint16 pixels)")
    ap.add_argument("--clients", default="1,10")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args(argv)
    python = coniql_python()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        _db(tmp / "big.db", args.waveform, args.image)
        ioc = IocProcess([tmp / "big.db"])
        ioc.start()
        env = {**os.environ, **ioc.ports.client_env()}
        try:
            _fill(env, args.waveform, args.image)
            for pv in ("BENCH:WF", "BENCH:IMG"):
                for clients in (int(c) for c in args.clients.split(",")):
                    per = _split(clients, min(args.procs, clients))
                    server = Server(env, ["--send-budget", str(SEND_BUDGET)])
                    try:
                        token = server.subscribe([f"ca://{pv}"])
                        spec = {"url": server.url, "token": token}
                        kids = [Child(PVWIRE_CLIENT, {**spec, "n": n}, env, tmp) for n in per]
                        assert server.pid is not None
                        conns, cpu, wall = _measure(server.pid, kids, args.duration)
                    finally:
                        server.stop()
                    rows.append(_row("pvwire", pv, clients, conns, cpu, wall, args.duration))
                    print(json.dumps(rows[-1]), flush=True)
                    coniql = ConiqlServer(env, python)
                    try:
                        spec = {"url": coniql.url, "pv": f"ca://{pv}"}
                        kids = [Child(CONIQL_CLIENT, {**spec, "n": n}, env, tmp) for n in per]
                        conns, cpu, wall = _measure(coniql.proc.pid, kids, args.duration)
                    finally:
                        coniql.stop()
                    rows.append(_row("coniql-0.4.2", pv, clients, conns, cpu, wall, args.duration))
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            ioc.stop()
    if args.save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "coniql_compare.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
