"""A read that spans the facility's archive and the recent past, through pvwire with an archiver
behind it, against the archive alone and pvwire alone, in one run, over real HTTP.

Two real servers: the archive, a pvwire whose history holds a day of a 1 Hz channel (its Archiver
Appliance API answers it; the store filled through its own path before it serves, as
bench/aa_http.py does), and the front, a pvwire holding the last hour of the same channel, with
`--archiver` the first. A day's read through the front is the archive's part (older than the
front's oldest point) joined to the front's own: GraphQL `history` (maxPoints 1,000: 5 min bins),
`getData.raw` and `getData.json`, raw and `mean_60`. Each is measured cold (its range moved by a
bin each time, so the archive is read again) and cached (the same read again: the front's cache
answers the archive's part); beside them the same read of the archive alone (what a client
reading it directly pays) and of the front's recent hour alone. The ratio: the joined read's
median over the sum of the two it replaces.

    .venv/bin/python -m bench.archive_span [--repeat 20]
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pvwire.core.history import NS

from tests.server_process import ServerProcess

from .aa_http import day_times
from .history_http import QUERY, fill

DAY = "ca://BENCH:DAY"
RECENT_S = 3600  # what the front holds of its own


def serve(now_ns: int, recent: bool, args: list[str]) -> None:
    """The child: the real server, its history holding the day before `now_ns` (the archive)
    or its last hour (the front)."""
    import pvwire.app
    from pvwire import cli
    from pvwire.config import Settings
    from pvwire.upstream.base import Backend

    create_app = pvwire.app.create_app

    def prefilled(
        settings: Settings, backends: Mapping[str, Backend] | None = None, workers: int = 1
    ) -> FastAPI:
        app = create_app(settings, backends, workers)
        h = app.state.hub.history_store.attach(DAY)
        assert h is not None, "the history budget holds no channel"
        times = day_times(now_ns)
        fill(h, times[-RECENT_S:] if recent else times)
        return app

    pvwire.app.create_app = prefilled
    cli.main([*args, "--log-level", "warning"])


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // NS)) + f".{ns % NS // 10**6:03d}Z"


def _timed(conn: http.client.HTTPConnection, method: str, path: str,
           body: bytes | None = None) -> tuple[float, bytes]:  # fmt: skip
    headers = {"Content-Type": "application/json"} if body else {}
    t0 = time.perf_counter()
    conn.request(method, path, body, headers)
    resp = conn.getresponse()
    data = resp.read()
    elapsed = time.perf_counter() - t0
    if resp.status != 200 or b'"errors"' in data[:200] or resp.getheader("Pvwire-Archive"):
        raise RuntimeError(f"HTTP {resp.status} {resp.getheader('Pvwire-Archive')}: {data[:300]!r}")
    return elapsed, data


def _graphql(since_ns: int, now_ns: int) -> tuple[str, bytes]:
    variables = {"id": DAY, "since": since_ns / NS, "until": now_ns / NS, "max": 1000}
    return "/graphql", json.dumps({"query": QUERY, "variables": variables}).encode()


def _aa(ext: str, op: str, since_ns: int, now_ns: int) -> str:
    pv = f"{op}({DAY})" if op else DAY
    q = urllib.parse.urlencode({"pv": pv, "from": _iso(since_ns), "to": _iso(now_ns)})
    return f"/retrieval/data/getData.{ext}?{q}"


Read = Callable[[int], tuple[str, str, bytes | None]]  # k -> (server, path, body)


def measure(repeat: int = 20, verbose: bool = True) -> dict[str, Any]:
    now_ns = time.time_ns()
    # Within the archive's day, with room for the cold reads' shifts (5 min a read).
    day_ago = now_ns - 86_400 * NS + 600 * NS
    recent = now_ns - (RECENT_S - 600) * NS  # within the front's hour: no archive needed
    root = str(Path(__file__).resolve().parent.parent)
    env = {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    archive = ServerProcess("--now", str(now_ns), "--role", "archive", token_key=None,
                            module="bench.archive_span", env=env)  # fmt: skip
    archive.start(timeout=120)
    front = ServerProcess("--now", str(now_ns), "--role", "front", "--archiver",
                          f"{archive.url}/retrieval", token_key=None, module="bench.archive_span",
                          env=env)  # fmt: skip
    cases: dict[str, Read] = {}
    kinds = ("graphql", "raw", "json", "mean_60_raw", "mean_60_json")
    for i, kind in enumerate(kinds):
        ext = "json" if kind.endswith("json") else "raw"
        op = "mean_60" if kind.startswith("mean") else ""

        def path(
            since: int, kind: str = kind, ext: str = ext, op: str = op
        ) -> tuple[str, bytes | None]:
            if kind == "graphql":
                return _graphql(since, now_ns)
            return _aa(ext, op, since, now_ns), None

        # Cold: each read's range moved past any before, so the front reads the archive again
        # (raw and json of one range ask it the same thing); history's by a whole bin (5 min),
        # the API's by a second (its range is its key).
        step = (300 if kind == "graphql" else 1) * NS

        def cold(k: int, i: int = i, step: int = step) -> int:
            return day_ago + ((k + 1) * len(kinds) + i) * step

        cases[f"{kind}_span_cold"] = lambda k, p=path, c=cold: ("front", *p(c(k)))
        cases[f"{kind}_span_cached"] = lambda k, p=path: ("front", *p(day_ago))
        cases[f"{kind}_archive_alone"] = lambda k, p=path, c=cold: ("archive", *p(c(k)))
        cases[f"{kind}_recent_alone"] = lambda k, p=path: ("front", *p(recent))
    took: dict[str, list[float]] = {name: [] for name in cases}
    sizes: dict[str, int] = {}
    try:
        front.start(timeout=120)
        conns = {s.port: http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
                 for s in (archive, front)}  # fmt: skip
        by_role = {"archive": conns[archive.port], "front": conns[front.port]}
        try:
            for k in range(repeat + 1):
                for name, read in cases.items():
                    role, where, body = read(k)
                    elapsed, data = _timed(by_role[role], "POST" if body else "GET", where, body)
                    if k:
                        took[name].append(elapsed)
                    else:
                        sizes[name] = len(data)
        finally:
            for c in conns.values():
                c.close()
    finally:
        front.stop()
        archive.stop()
    out: dict[str, Any] = {"repeat": repeat}
    for name in cases:
        out[name] = {"bytes": sizes[name], "ms_best": round(min(took[name]) * 1e3, 3),
                     "ms_median": round(statistics.median(took[name]) * 1e3, 3)}  # fmt: skip
    for kind in kinds:
        alone = out[f"{kind}_archive_alone"]["ms_median"] + out[f"{kind}_recent_alone"]["ms_median"]
        for how in ("cold", "cached"):
            fig = out[f"{kind}_span_{how}"]
            fig["vs_both_alone"] = round(fig["ms_median"] / alone, 2)
    if verbose:
        for name in cases:
            fig = out[name]
            ratio = f"  {fig['vs_both_alone']:.2f}x both alone" if "vs_both_alone" in fig else ""
            print(f"  {name:<26} {fig['bytes']:>9,} B  {fig['ms_best']:8.2f} / "
                  f"{fig['ms_median']:8.2f} ms{ratio}", flush=True)  # fmt: skip
    return out


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        at = argv.index("--now")
        now = int(argv[at + 1])
        role = argv[argv.index("--role") + 1]
        rest = [a for i, a in enumerate(argv) if i not in (at, at + 1) and a != "--role"
                and a != role]  # fmt: skip
        serve(now, role == "front", rest)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"a day across the archive and the recent hour, of {args.repeat} (best / median):")
    measure(args.repeat)


if __name__ == "__main__":
    main()
