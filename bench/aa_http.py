"""The Archiver Appliance API (`getData.raw`, `getData.json`) against the same read through
GraphQL `history`, over real HTTP, in one run: an hour of a 10 Hz channel and a day of a 1 Hz
one, raw and `mean_60`, against a real server whose history holds them (bench/history_http.py's
way: the real app, its store filled through the store's own path before it serves).

`raw` over an hour answers the 10 s tier (the raw ring holds 100 s), as GraphQL `history` with
maxPoints 1000 does; `mean_60` bins that tier (an hour: 60 bins; a day: the 5 min tier in 1,440
filled bins). Each figure: best and median of `repeat` on one keep-alive connection, the cases
interleaved; the ratio is the Archiver Appliance API's median over GraphQL's.

    .venv/bin/python -m bench.aa_http [--repeat 20]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from fastapi import FastAPI
from pvwire.core.history import NS

from tests.server_process import ServerProcess

from .history_http import QUERY, fill, hour_times

HOUR = "ca://BENCH:HOUR"
DAY = "ca://BENCH:DAY"


def day_times(now_ns: int) -> npt.NDArray[np.int64]:
    """A 1 Hz record's timestamps over the day before `now_ns`."""
    late = np.random.default_rng(29).integers(0, 3_000_000, 86_400)
    return now_ns - 86_400 * NS + np.arange(86_400, dtype=np.int64) * NS + late


def serve(now_ns: int, args: list[str]) -> None:
    import pvwire.app
    from pvwire import cli
    from pvwire.config import Settings
    from pvwire.upstream.base import Backend

    create_app = pvwire.app.create_app

    def prefilled(
        settings: Settings, backends: Mapping[str, Backend] | None = None, workers: int = 1
    ) -> FastAPI:
        app = create_app(settings, backends, workers)
        for cid, times in ((HOUR, hour_times(now_ns)), (DAY, day_times(now_ns))):
            h = app.state.hub.history_store.attach(cid)
            assert h is not None, "the history budget holds no channel"
            fill(h, times)
        return app

    pvwire.app.create_app = prefilled
    cli.main([*args, "--log-level", "warning"])


def get(conn: http.client.HTTPConnection, path: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    conn.request("GET", path)
    resp = conn.getresponse()
    data = resp.read()
    elapsed = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")
    return elapsed, data


def post(conn: http.client.HTTPConnection, variables: dict[str, Any]) -> tuple[float, bytes]:
    body = json.dumps({"query": QUERY, "variables": variables}).encode()
    t0 = time.perf_counter()
    conn.request("POST", "/graphql", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    elapsed = time.perf_counter() - t0
    if resp.status != 200 or b'"errors"' in data:
        raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")
    return elapsed, data


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // NS)) + f".{ns % NS // 10**6:03d}Z"


def measure(repeat: int = 20, verbose: bool = True) -> dict[str, Any]:
    now_ns = time.time_ns()
    spans = {"hour_10hz": (HOUR, now_ns - 3600 * NS), "day_1hz": (DAY, now_ns - 86_400 * NS)}
    root = str(Path(__file__).resolve().parent.parent)
    server = ServerProcess(
        "--now", str(now_ns), token_key=None, module="bench.aa_http",
        env={"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )  # fmt: skip
    cases: list[tuple[str, str, Any]] = []
    for span, (cid, since) in spans.items():
        for op in ("", "mean_60"):
            pv = f"{op}({cid})" if op else cid
            q = urllib.parse.urlencode({"pv": pv, "from": _iso(since), "to": _iso(now_ns)})
            kind = op or "raw"
            cases.append((f"{span}_{kind}_raw", "get", f"/retrieval/data/getData.raw?{q}"))
            cases.append((f"{span}_{kind}_json", "get", f"/retrieval/data/getData.json?{q}"))
        variables = {"id": cid, "since": since / NS, "until": now_ns / NS, "max": 1000}
        cases.append((f"{span}_graphql", "post", variables))
    took: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    sizes: dict[str, int] = {}
    server.start(timeout=120)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        try:
            for k in range(repeat + 1):
                for name, how, what in cases:
                    elapsed, data = get(conn, what) if how == "get" else post(conn, what)
                    if k:
                        took[name].append(elapsed)
                    else:
                        sizes[name] = len(data)
        finally:
            conn.close()
    finally:
        server.stop()
    out: dict[str, Any] = {"repeat": repeat}
    for name, _, _ in cases:
        out[name] = {
            "bytes": sizes[name],
            "ms_best": round(min(took[name]) * 1e3, 3),
            "ms_median": round(statistics.median(took[name]) * 1e3, 3),
        }
    for span in spans:
        base = out[f"{span}_graphql"]["ms_median"]
        for name in [n for n, _, _ in cases if n.startswith(span) and not n.endswith("graphql")]:
            out[name]["vs_graphql"] = round(out[name]["ms_median"] / base, 2)
    if verbose:
        for name, _, _ in cases:
            fig = out[name]
            ratio = f"  {fig['vs_graphql']:.2f}x GraphQL" if "vs_graphql" in fig else ""
            print(f"  {name:<24} {fig['bytes']:>9,} B  {fig['ms_best']:8.2f} / "
                  f"{fig['ms_median']:8.2f} ms{ratio}", flush=True)  # fmt: skip
    return out


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        at = argv.index("--now")
        serve(int(argv[at + 1]), argv[:at] + argv[at + 2 :])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"the Archiver Appliance API against GraphQL history, of {args.repeat} (best / median):")
    measure(args.repeat)


if __name__ == "__main__":
    main()
