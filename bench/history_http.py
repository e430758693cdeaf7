"""The GraphQL `history` query over real HTTP, against a real server holding an hour of one
channel's 10 Hz data (36,000 updates, IOC-like timestamps over the past hour), beside the same
reads in-process (`ChannelHistory.query` on the same data), so what HTTP and GraphQL add shows:
each read once between two requests, as the server reads, and back to back, as bench/history.py
times them.

The server is the real one (`pvwire.cli serve --loopback`, its uvicorn settings and its app) in
a process of its own (tests/server_process.py's, started as `python -m bench.history_http serve
... --now NS`), whose app gets its history store filled before it serves: the app is made
by `pvwire.app.create_app` as always, then the hour is written into `hub.history_store` through
the store's own path (`attach`, then `record` per update), as a monitor would have written it.
Nothing in the server exists for this bench. The channel (`ca://BENCH:HOUR`) is not monitored:
the hour stands still while it is read.

Each query asks for every column a plot can use, on one keep-alive connection (as a page's
fetches), one request before the timed ones; best and median of `repeat`, the cases
interleaved, with `{ __typename }` among them: what any GraphQL request over HTTP costs here.
Also the response's size in bytes.

    .venv/bin/python -m bench.history_http [--repeat 20]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from fastapi import FastAPI
from pvwire.core.history import NS, ChannelHistory

from tests.server_process import ServerProcess

from .history import timed

CHANNEL = "ca://BENCH:HOUR"
UPDATES = 36_000  # an hour at 10 Hz
PERIOD = NS // 10
QUERY = """query($id: String!, $since: Float, $until: Float, $max: Int!) {
  history(id: $id, since: $since, until: $until, maxPoints: $max) {
    id resolution truncated recordedSince
    seconds nanoseconds value min max mean count severity status gap
  }
}"""


def hour_times(now_ns: int) -> npt.NDArray[np.int64]:
    """IOC timestamps of a `SCAN ".1 second"` record over the hour before `now_ns`: every 100 ms,
    each a little late (the scan thread's 0-3 ms), seeded so both sides get the same hour."""
    first = now_ns - UPDATES * PERIOD
    late = np.random.default_rng(23).integers(0, 3_000_000, UPDATES)
    return first + np.arange(UPDATES, dtype=np.int64) * PERIOD + late


def fill(h: ChannelHistory, times: npt.NDArray[np.int64]) -> None:
    """The hour, update by update, through `record` (a counter: value i at time i)."""
    record = h.record
    for i, t in enumerate(times.tolist()):
        record(float(i), t // NS, t % NS, 0, 0)


def serve(now_ns: int, args: list[str]) -> None:
    """The child: the real server (`pvwire serve` with `args`), its history store holding the
    hour before `now_ns` before it serves."""
    import pvwire.app
    from pvwire import cli
    from pvwire.config import Settings
    from pvwire.upstream.base import Backend

    create_app = pvwire.app.create_app

    def prefilled(
        settings: Settings, backends: Mapping[str, Backend] | None = None, workers: int = 1
    ) -> FastAPI:
        app = create_app(settings, backends, workers)
        h = app.state.hub.history_store.attach(CHANNEL)
        assert h is not None, "the history budget holds no channel"
        fill(h, hour_times(now_ns))
        return app

    pvwire.app.create_app = prefilled  # cli.serve imports it when it builds the app
    cli.main([*args, "--log-level", "warning"])


def post(
    conn: http.client.HTTPConnection, variables: dict[str, Any], query: str = QUERY
) -> tuple[float, bytes]:
    """One request: seconds from sending it to its whole body read, and the body."""
    body = json.dumps({"query": query, "variables": variables}).encode()
    headers = {"Content-Type": "application/json"}
    t0 = time.perf_counter()
    conn.request("POST", "/graphql", body, headers)
    resp = conn.getresponse()
    data = resp.read()
    elapsed = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data[:500]!r}")
    return elapsed, data


def measure(repeat: int = 20, verbose: bool = True) -> dict[str, Any]:
    now_ns = time.time_ns()
    times = hour_times(now_ns)
    first = int(times[0])
    # (name, since, until in POSIX seconds, maxPoints): the hour at two sizes, the last minute.
    cases = [
        ("hour_max1000", first / NS, now_ns / NS, 1000),
        ("hour_max20", first / NS, now_ns / NS, 20),
        ("last60s", (now_ns - 60 * NS) / NS, now_ns / NS, 1000),
    ]
    local = ChannelHistory(CHANNEL)
    fill(local, times)
    http_s: dict[str, list[float]] = {c[0]: [] for c in cases}
    local_s: dict[str, list[float]] = {c[0]: [] for c in cases}
    trivial: list[float] = []  # `{ __typename }`: what any request costs, the floor of the above
    answers: dict[str, dict[str, Any]] = {}
    sizes: dict[str, int] = {}
    root = str(Path(__file__).resolve().parent.parent)  # where `python -m bench...` is found
    server = ServerProcess(
        "--now", str(now_ns), token_key=None, module="bench.history_http",
        env={"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )  # fmt: skip
    server.start(timeout=60)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        try:
            for k in range(repeat + 1):  # the first round warms both up and is not counted
                elapsed, data = post(conn, {}, "{ __typename }")
                if k:
                    trivial.append(elapsed)
                for name, since, until, max_points in cases:
                    variables = {"id": CHANNEL, "since": since, "until": until, "max": max_points}
                    elapsed, data = post(conn, variables)
                    lo, hi = int(since * 1e9), int(until * 1e9)  # as the server converts them
                    t0 = time.perf_counter()
                    rows = local.query(lo, hi, max_points)
                    inproc = time.perf_counter() - t0
                    if k == 0:
                        doc = json.loads(data)
                        if doc.get("errors"):
                            raise RuntimeError(f"{name}: {doc['errors']}")
                        answers[name] = doc["data"]["history"]
                        sizes[name] = len(data)
                        if len(answers[name]["seconds"]) != len(rows):
                            raise RuntimeError(f"{name}: HTTP and in-process rows differ")
                        continue
                    http_s[name].append(elapsed)
                    local_s[name].append(inproc)
        finally:
            conn.close()
    finally:
        server.stop()
    # The same reads back to back, as bench/history.py times them: ~3x faster than one read
    # between two requests (40 against 110-150 µs for the last minute, 2026-11-24), the caches
    # being warm; the interleaved figure is the one the server's read is comparable with.
    warm = {
        name: timed(partial(local.query, int(since * 1e9), int(until * 1e9), max_points), repeat)
        for name, since, until, max_points in cases
    }
    out: dict[str, Any] = {
        "updates": UPDATES,
        "repeat": repeat,
        "typename_ms_best": round(min(trivial) * 1e3, 3),
        "typename_ms_median": round(statistics.median(trivial) * 1e3, 3),
    }
    if verbose:
        print(
            f"  {'{ __typename }':<42} HTTP {out['typename_ms_best']:7.2f} / "
            f"{out['typename_ms_median']:7.2f} ms",
            flush=True,
        )
    for name, *_ in cases:
        got = answers[name]
        h, i = http_s[name], local_s[name]
        fig = {
            "rows": len(got["seconds"]),
            "resolution_s": got["resolution"],
            "response_bytes": sizes[name],
            "http_ms_best": round(min(h) * 1e3, 3),
            "http_ms_median": round(statistics.median(h) * 1e3, 3),
            "inprocess_us_best": round(min(i) * 1e6, 1),
            "inprocess_us_median": round(statistics.median(i) * 1e6, 1),
            "inprocess_warm_us_best": round(warm[name] * 1e6, 1),
        }
        fig["added_ms_median"] = round(fig["http_ms_median"] - fig["inprocess_us_median"] / 1e3, 3)
        out[name] = fig
        if verbose:
            kind = f"{got['resolution']:g} s buckets" if got["resolution"] else "points"
            print(
                f"  {name:<13} {fig['rows']:>5} rows ({kind:>12}), {sizes[name]:>8,} B: HTTP "
                f"{fig['http_ms_best']:7.2f} / {fig['http_ms_median']:7.2f} ms, in-process "
                f"{fig['inprocess_us_best']:6.0f} / {fig['inprocess_us_median']:6.0f} µs "
                f"(best / median; back to back {fig['inprocess_warm_us_best']:.0f} µs)",
                flush=True,
            )
    return out


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:  # the server's process: `serve`'s arguments and `--now NS`
        at = argv.index("--now")
        serve(int(argv[at + 1]), argv[:at] + argv[at + 2 :])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"history over HTTP, an hour of 10 Hz data ({UPDATES:,} updates), of {args.repeat}:")
    measure(args.repeat)


if __name__ == "__main__":
    main()
