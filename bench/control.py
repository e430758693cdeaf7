"""The control room: N screens, each its own seeded random M of P channels, opened and closed.

`bench/harness.py` measures one subscription shared by every client, the cheapest case there is.
A control room is many screens with distinct, overlapping subscriptions: pages on `/stream`,
cs-web-lib on `/pvws/pv` (one `subscribe` per PV, so one view per PV per client), scripts,
screens opened and closed through the day. One run (`run(ControlScenario(...))`):
1. P sim counters at 10 Hz (or, `source="ca"`, an IOC of P calc counters, bench/harness.py's);
2. the server (`pvwire serve --loopback`), with room for every screen from one address;
3. load-client processes (bench/control_client.py) open their screens and report READY; during
   the window each replaces one screen at a time at a steady rate (`churn_per_s` in all);
4. over the window: server CPU and peak RSS (RSS per client: above the RSS before any screen),
   deliveries per endpoint, sequence gaps, latency (sim or IOC timestamp to receipt, sampled),
   screen open time (subscribe to every PV shown) of the screens opened during the window.
Run as `python -m bench.scenario control-stream` (bench/scenario.py); `--save` keeps the JSON
that `python -m bench.control_plot` draws.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from pvwire_dev.ioc import IocProcess

from .harness import (
    UPDATE_HZ,
    Child,
    ProcWatch,
    Server,
    _bench_env,
    _cpu_figures,
    _finish_py_spy,
    _latency_hist,
    _percentile,
    _stop_all,
    _window,
    write_db,
)

CLIENTS_PER_PROC = 250  # screens per load-client process (at most 2 processes by default)


@dataclass
class ControlScenario:
    name: str
    endpoint: str = "stream"  # stream | pvws | mix (every other screen pvws)
    clients: int = 500  # screens open at any time
    per_client: int = 200  # PVs per screen (M)
    pvs: int = 2000  # channels the screens draw from (P)
    source: str = "sim"  # sim | ca
    churn_per_s: float = 2.0  # screens replaced per second during the window, in all
    duration: float = 15.0
    warmup: float = 3.0
    client_procs: int = 0  # 0 = automatic
    seed: int = 1
    profile: bool = False
    tick_ms: float | None = None
    opening_at_once: int = 16  # screens of a load-client process opening together at start
    workers: int = 1  # `serve --workers N`

    def describe(self) -> str:
        where = {"stream": "/stream", "pvws": "/pvws/pv", "mix": "/stream + /pvws/pv"}
        together = f", {self.opening_at_once} opening at once" if self.opening_at_once > 16 else ""
        workers = f", {self.workers} workers" if self.workers > 1 else ""
        return (
            f"{self.source.upper()}: {self.clients} screens x {self.per_client} of {self.pvs} "
            f"PVs on {where[self.endpoint]}, {self.churn_per_s:g} screens/s replaced"
            f"{together}{workers}"
        )


def scenarios() -> dict[str, ControlScenario]:
    out = {
        "control-stream": ControlScenario("control-stream", "stream", 500),
        "control-pvws": ControlScenario("control-pvws", "pvws", 100),
        "control-mix": ControlScenario("control-mix", "mix", 200),
        # A real IOC here serves about 2,000 records: the same screens over CA from one IOC.
        "control-ca": ControlScenario("control-ca", "stream", 100, source="ca"),
    }
    # pvws as `control-stream` is for `/stream`: 1,000,000 deliveries/s to 500 screens.
    out["control-pvws-500"] = ControlScenario("control-pvws-500", "pvws", 500)
    # The sweep bench/README.md plots: server CPU and p99 against screens, per endpoint.
    for endpoint in ("stream", "pvws"):
        for n in (50, 100, 200, 500):
            name = f"control-{endpoint}-{n}"
            out.setdefault(name, ControlScenario(name, endpoint, n, churn_per_s=n / 250))
    # Every screen opening at once, as after a server restart or a failover: 100 screens of
    # 200 CA PVs of the bench's IOC (2,000 counters at 10 Hz), the first values of each timed.
    for endpoint in ("stream", "pvws"):
        name = f"open-ca-{endpoint}"
        out[name] = ControlScenario(
            name, endpoint, 100, source="ca", churn_per_s=0.0, opening_at_once=100, duration=5.0
        )
    # Across cores: distinct screens on `serve --workers 2` (each worker its own monitors).
    for endpoint in ("stream", "pvws"):
        name = f"control-{endpoint}-w2"
        out[name] = ControlScenario(name, endpoint, 200, churn_per_s=0.8, workers=2)
    return out


def _procs(sc: ControlScenario) -> int:
    if sc.client_procs:
        return sc.client_procs
    return max(1, min(2, math.ceil(sc.clients / CLIENTS_PER_PROC)))


def _ms(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return 1000.0 * s[min(len(s) - 1, int(q * len(s)))]


def run(sc: ControlScenario, verbose: bool = True, server_tree: str = "") -> dict[str, Any]:
    """One run; `server_tree` (a copy of `server/`) runs that server code instead of this one,
    for a before-and-after in one session (bench/control_compare.py)."""
    env = _bench_env()
    t_start = time.time()
    hard = t_start + sc.warmup + sc.duration + 900
    res: dict[str, Any] = {"scenario": sc.name, "describe": sc.describe(), **asdict(sc)}
    res["server_tree"] = server_tree or "this"
    ioc: IocProcess | None = None
    server: Server | None = None
    children: list[Child] = []
    watch: ProcWatch | None = None

    def say(msg: str) -> None:
        if verbose:
            print(f"[{sc.name} +{time.time() - t_start:5.1f}s] {msg}", flush=True)

    import tempfile

    with tempfile.TemporaryDirectory(prefix="pvwire-control-") as tmpdir:
        tmp = Path(tmpdir)
        try:
            if sc.source == "sim":
                ids = [f"sim://counter/c{i}?rate={UPDATE_HZ:g}" for i in range(sc.pvs)]
                server_env = dict(env)
            else:
                names = write_db(tmp / "bench.db", sc.pvs, False)
                ioc = IocProcess([tmp / "bench.db"])
                ioc.start()
                server_env = {**env, **ioc.ports.client_env()}
                ids = [f"ca://{n}" for n in names]
                say(f"IOC up with {len(names)} records")
            # Every screen comes from 127.0.0.1: room for all of them, and for the replacements.
            if server_tree:
                server_env["PYTHONPATH"] = server_tree + os.pathsep + server_env["PYTHONPATH"]
            server_env["PVWIRE_MAX_CONNECTIONS_PER_ADDRESS"] = str(4 * sc.clients + 100)
            args = ["--tick-ms", str(sc.tick_ms)] if sc.tick_ms else []
            if sc.workers > 1:
                args += ["--workers", str(sc.workers)]
            server = Server(server_env, args)
            assert server.pid is not None
            rss0 = psutil.Process(server.pid).memory_info().rss
            say(f"server up on port {server.port} (pid {server.pid})")
            nprocs = _procs(sc)
            endpoints = [
                "pvws" if sc.endpoint == "pvws" or (sc.endpoint == "mix" and k % 2) else "stream"
                for k in range(sc.clients)
            ]
            for p in range(nprocs):
                mine = endpoints[p::nprocs]
                spec = {
                    "host": "127.0.0.1",
                    "port": server.port,
                    "ids": ids,
                    "per_client": sc.per_client,
                    "endpoints": mine,
                    "seed": sc.seed * 1000 + p,
                    "churn_per_s": sc.churn_per_s * len(mine) / sc.clients,
                    "opening_at_once": sc.opening_at_once,
                    "deadline": hard - 30,
                }
                children.append(Child("bench.control_client", spec, env, tmp))
            for c in children:
                c.wait_ready(time.time() + 600)
            say(f"{sc.clients} screens in {len(children)} process(es) open")
            # Under --workers the server's CPU is its workers': every child process counts too.
            workers = [c.pid for c in psutil.Process(server.pid).children(recursive=True)]
            watch = ProcWatch(
                {
                    "server": [server.pid, *workers],
                    "clients": [c.proc.pid for c in children],
                    "ioc": [pid] if ioc and (pid := ioc.pid()) else [],
                }
            )
            wall, spy = _window(sc, server, children, watch, tmp)
            res["loop_lag_ms"] = server.loop_lag_ms()
            if spy is not None:
                _finish_py_spy(spy, sc)
            results = [c.result(hard) for c in children]
            watch.stop()
            res.update(_summarise(results, wall, sc))
            res.update(_cpu_figures(watch, children, ioc, wall, res["received"]))
            res["rss_per_client_kb"] = (watch.rss_peak["server"] - rss0) / 1e3 / sc.clients
            delivered = res["delivered_per_s"]
            say(
                f"server {res['server_cpu']:.1f}% cpu, {delivered:,.0f} delivered/s, "
                f"{res['server_us_per_update']:.2f} us/update, p99 {res['lat_p99_ms']:.1f} ms, "
                f"open p99 {res['open_p99_ms']:.0f} ms, clients {res['client_cpu']:.1f}%"
            )
        finally:
            _stop_all(children, watch, server, ioc)
    res["elapsed"] = time.time() - t_start
    res["loadavg_1m"] = os.getloadavg()[0]
    return res


def _summarise(results: list[dict[str, Any]], wall: float, sc: ControlScenario) -> dict[str, Any]:
    hist = _latency_hist(results)
    by: dict[str, dict[str, int]] = {}
    for r in results:
        for ep, d in r["by_endpoint"].items():
            acc = by.setdefault(ep, {})
            for k, v in d.items():
                acc[k] = acc.get(k, 0) + v
    churn = [t for r in results for t in r["churn_opens_s"]]
    initial = [t for r in results for t in r["initial_opens_s"]]
    out: dict[str, Any] = {
        "received": sum(r["received"] for r in results),
        "seq_gaps": sum(r["seq_gaps"] for r in results),
        "nominal": round(sc.clients * sc.per_client * UPDATE_HZ * wall),
        "lat_p50_ms": _percentile(hist, 0.50),
        "lat_p99_ms": _percentile(hist, 0.99),
        "lat_max_ms": max((r["lat_max_us"] for r in results), default=math.nan) / 1000.0,
        "latency_samples": sum(hist),
        "open_p50_ms": _ms(churn, 0.50),
        "open_p99_ms": _ms(churn, 0.99),
        "opens": len(churn),
        "initial_open_p50_ms": _ms(initial, 0.50),
        "initial_open_p99_ms": _ms(initial, 0.99),
        "initial_open_max_ms": 1000.0 * max(initial) if initial else math.nan,
        "screens_opened": sum(r["screens_opened"] for r in results),
        "errors": [e for r in results for e in r["errors"]],
    }
    for ep, d in by.items():
        out[f"{ep}_delivered_per_s"] = d["received"] / wall
    out["missing_share"] = 1.0 - out["received"] / out["nominal"] if out["nominal"] else math.nan
    return out
