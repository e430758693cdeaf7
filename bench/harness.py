"""The load harness: a real IOC, the real server, cheap load clients and the upstream floor.

One run (`run(Scenario(...))`):
1. writes an IOC database of N `calc` counters (`BENCH:C{i}`, SCAN ".1 second", A+1) or one
   waveform, and starts it with `python -m pvxslibs.ioc` on private loopback ports (no IOC for
   `sim` sources);
2. starts `python -m pvwire.cli serve --loopback` as a child process with the IOC's client env;
3. registers the subscriptions through GraphQL and starts the load-client processes
   (bench/loadclient.py), which attach and report READY;
4. after a warm-up, measures a fixed window: server, IOC and client CPU (process CPU time / wall
   time, % of one core) and peak RSS, while the clients count updates, conflation, missing
   updates and latency;
5. then, against the same IOC, runs the floor (bench/floor.py: aioca or p4p alone, trivial
   callback) over the same PVs for the same window, so pvwire's own cost per update is
   server CPU per delivered update minus the floor's CPU per update;
6. for the scenarios marked `coniql`, before the floor, Coniql 0.4.2 (bench/coniql.py) serves
   the same PVs to its own kind of client (bench/coniql_counters.py) for the same window.
Every process gets the loopback EPICS settings; everything stops by itself (hard deadlines).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil
from pvwire.loopback import apply_loopback_env
from pvwire_dev.ioc import IocProcess

from tests.server_process import ServerProcess

from .coniql import ConiqlServer
from .loadclient import HIST_BINS

WAVEFORM_LEN = 1_000_000
UPDATE_HZ = 10.0
TOKEN_IDS = 1000  # ids per subscription token
CONIQL_READY_S = 60.0  # the longest wait for Coniql's first value of every PV


class Timed(Protocol):
    """What the measured window needs of a scenario (this module's or bench/control.py's)."""

    name: str
    warmup: float
    duration: float
    profile: bool


@dataclass
class Scenario:
    name: str
    source: str = "ca"  # ca | pva | sim
    pvs: int = 100  # distinct PVs in the IOC (or sim counters)
    clients: int = 1  # WebSocket connections
    per_client: int = 0  # PVs per client; 0 = all `pvs`
    shared: bool = True  # every client the same PVs (fan-out) or disjoint slices
    waveform: bool = False  # one 1,000,000-element float64 waveform instead of counters
    duration: float = 15.0  # measured window, s
    warmup: float = 3.0  # s between READY and the window
    client_procs: int = 0  # 0 = automatic
    floor: bool = True  # also run the upstream floor
    coniql: bool = False  # also run Coniql 0.4.2 over the same PVs (over CA: no PVA in 0.4.2)
    profile: bool = False  # py-spy the server during the window
    tick_ms: float | None = None
    extra_args: list[str] = field(default_factory=list)

    def describe(self) -> str:
        what = "1 x 1M float64 waveform" if self.waveform else f"{self.pvs} PVs"
        per = self.per_client or self.pvs
        shape = (
            f"{self.clients} client(s) x {per} PVs"
            + ("" if self.shared or self.clients == 1 else " (disjoint)")
            + ("" if self.waveform else f" of {what}")
        )
        return f"{self.source.upper()}: {shape}" if not self.waveform else f"{self.source}: {what}"


def _bench_env() -> dict[str, str]:
    env = apply_loopback_env({**os.environ, "PYTHONUNBUFFERED": "1"})
    # The children import `bench` from the repository root.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def write_db(path: Path, n: int, waveform: bool) -> list[str]:
    """The IOC database; returns the record names."""
    if waveform:
        path.write_text(
            'record(waveform, "BENCH:WF") {\n  field(SCAN, ".1 second")\n'
            f'  field(FTVL, "DOUBLE")\n  field(NELM, "{WAVEFORM_LEN}")\n}}\n'
        )
        return ["BENCH:WF"]
    names = [f"BENCH:C{i}" for i in range(n)]
    path.write_text(
        "".join(
            f'record(calc, "{r}") {{\n  field(SCAN, ".1 second")\n  field(CALC, "A+1")\n'
            f'  field(INPA, "{r} NPP")\n}}\n'
            for r in names
        )
    )
    return names


def fill_waveform(env: dict[str, str], deadline: float) -> None:
    """Give the waveform its 1,000,000 elements (NORD) with one PVA put from a child process."""
    code = (
        "import numpy as np; from p4p.client.thread import Context\n"
        f"c = Context('pva'); c.put('BENCH:WF', np.arange({WAVEFORM_LEN}, dtype=float), "
        "timeout=10); c.close()"
    )
    subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, timeout=max(5, deadline - time.time())
    )


class ProcWatch:
    """CPU over the measured window and peak RSS (sampled every 0.2 s) of a set of processes,
    and of the first process's main thread (the server's event loop, without --workers)."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.procs = {k: [psutil.Process(p) for p in v] for k, v in pids.items()}
        self.rss_peak = {k: 0 for k in pids}
        self._cpu0: dict[str, float] = {}
        self._t0 = 0.0
        self.cpu_pct: dict[str, float] = {}
        self._main0: dict[str, float] = {}
        self.main_thread_cpu_pct: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _cpu(self, key: str) -> float:
        total = 0.0
        for p in self.procs[key]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def _main_thread_cpu(self, key: str) -> float:
        """CPU seconds of the main thread of `key`'s first process (its thread id is the pid)."""
        procs = self.procs[key]
        with contextlib.suppress(psutil.Error):
            for t in procs[0].threads() if procs else []:
                if t.id == procs[0].pid:
                    return float(t.user_time + t.system_time)
        return math.nan

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for k, procs in self.procs.items():
                rss = 0
                for p in procs:
                    with contextlib.suppress(psutil.Error):
                        rss += p.memory_info().rss
                self.rss_peak[k] = max(self.rss_peak[k], rss)

    def start_window(self) -> None:
        self._t0 = time.monotonic()
        self._cpu0 = {k: self._cpu(k) for k in self.procs}
        self._main0 = {k: self._main_thread_cpu(k) for k in self.procs}

    def end_window(self) -> float:
        wall = time.monotonic() - self._t0
        self.cpu_pct = {k: 100.0 * (self._cpu(k) - self._cpu0[k]) / wall for k in self.procs}
        self.main_thread_cpu_pct = {
            k: 100.0 * (self._main_thread_cpu(k) - self._main0[k]) / wall for k in self.procs
        }
        return wall

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


class Server(ServerProcess):
    """The server under test: the tests' child-process server plus the two calls the harness
    makes; `env` is the whole environment (loopback settings and the bench IOC's ports)."""

    def __init__(self, env: dict[str, str], args: list[str]) -> None:
        # Every load client comes from 127.0.0.1, and the harness's own requests too: room for
        # all of them, HTTP and WebSocket (counted together, api/connections.py).
        env = {"PVWIRE_MAX_CONNECTIONS_PER_ADDRESS": "10000", **env}
        super().__init__("--log-level", "warning", *args, env=env)
        self.start()

    def _data(self, query: str, variables: dict[str, Any]) -> Any:
        doc = self.graphql(query, variables)
        if doc.get("errors"):
            raise RuntimeError(f"GraphQL errors: {doc['errors']}")
        return doc["data"]

    def subscribe(self, ids: list[str]) -> str:
        data = self._data(
            "mutation($ids: [String!]!) { subscribe(ids: $ids) { token } }", {"ids": ids}
        )
        return str(data["subscribe"]["token"])

    def history_metrics(self) -> dict[str, float]:
        """The server's recent-history figures from /metrics (`pvwire_history_*`, labels
        joined to the name: `history_channels.monitored.true`), so a run shows whether its
        channels were recorded."""
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as r:
                text = r.read().decode()
        except OSError:
            return {}  # a figure left out, not a failed run
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("pvwire_history_"):
                continue
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.removeprefix("pvwire_").partition("{")
            for label in filter(None, labels.rstrip("}").split(",")):
                key, _, v = label.partition("=")
                name += f".{key}.{v.strip(chr(34))}"
            out[name] = float(value)
        return out

    def loop_lag_ms(self) -> float:
        try:
            return float(self._data("{ server { loopLagMs } }", {})["server"]["loopLagMs"])
        except Exception:
            return math.nan


class Child:
    """A READY/GO child process (load client or floor) with a JSON spec and a JSON result."""

    def __init__(self, module: str, spec: dict[str, Any], env: dict[str, str], tmp: Path) -> None:
        fd, path = tempfile.mkstemp(suffix=".json", dir=tmp)
        os.close(fd)
        self.out = Path(path)
        spec = {**spec, "out": str(self.out)}
        self.spec_path = self.out.with_suffix(".spec.json")
        self.spec_path.write_text(json.dumps(spec))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, str(self.spec_path)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self, deadline: float) -> None:
        assert self.proc.stdout is not None
        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        t.daemon = True
        t.start()
        t.join(max(0.1, deadline - time.time()))
        if not result or result[0].strip() != "READY":
            self.kill()
            raise RuntimeError(f"child {self.proc.args} not ready: {result}")

    def go(self, t0: float, t1: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"GO {t0} {t1}\n")
        self.proc.stdin.flush()

    def result(self, deadline: float) -> dict[str, Any]:
        try:
            self.proc.wait(max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"child {self.proc.args} did not finish") from None
        self._close_pipes()
        data: dict[str, Any] = json.loads(self.out.read_text())
        return data

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        """The child has exited: its pipes go now, not whenever the collector finds them."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # stdin: a write the child never read
                    pipe.close()


def _percentile(hist: list[int], q: float) -> float:
    total = sum(hist)
    if not total:
        return math.nan
    target = q * total
    acc = 0
    for i, c in enumerate(hist):
        acc += c
        if acc >= target:
            return 10 ** ((i + 0.5) / 100.0) / 1000.0  # bin centre, ms
    return math.nan


def _auto_procs(sc: Scenario) -> int:
    per = sc.per_client or sc.pvs
    load = sc.clients * per * UPDATE_HZ
    if sc.clients == 1:
        return 1
    return max(1, min(sc.clients, 4, math.ceil(load / 250_000)))


def run(sc: Scenario, verbose: bool = True) -> dict[str, Any]:
    """Run one scenario; returns a flat dict of results (see `bench.report`)."""
    env = _bench_env()
    t_start = time.time()
    hard = t_start + sc.warmup + sc.duration + 240  # nothing of one run outlives this
    if sc.coniql:
        hard += sc.warmup + sc.duration + CONIQL_READY_S + 60
    ioc: IocProcess | None = None
    server: Server | None = None
    children: list[Child] = []
    watch: ProcWatch | None = None
    res: dict[str, Any] = {"scenario": sc.name, "describe": sc.describe(), **asdict(sc)}

    def say(msg: str) -> None:
        if verbose:
            print(f"[{sc.name} +{time.time() - t_start:5.1f}s] {msg}", flush=True)

    with tempfile.TemporaryDirectory(prefix="pvwire-bench-") as tmpdir:
        tmp = Path(tmpdir)
        try:
            if sc.source == "sim":
                names = [f"counter/{i}" for i in range(sc.pvs)]
                ids = [f"sim://{n}" for n in names]
                server_env = env
            else:
                names = write_db(tmp / "bench.db", sc.pvs, sc.waveform)
                ioc = IocProcess([tmp / "bench.db"])
                ioc.start()
                server_env = {**env, **ioc.ports.client_env()}
                if sc.waveform:
                    fill_waveform(server_env, hard)
                ids = [f"{sc.source}://{n}" for n in names]
                say(f"IOC up with {len(names)} records (pid {ioc.pid()})")
            args = list(sc.extra_args)
            if sc.tick_ms:
                args += ["--tick-ms", str(sc.tick_ms)]
            if sc.waveform:
                args += ["--send-budget", str(64 << 20)]
            server = Server(server_env, args)
            say(f"server up on port {server.port} (pid {server.pid})")
            per = sc.per_client or len(ids)
            # One token per <= TOKEN_IDS ids, as the published results were measured (a single
            # 10,000-id token attaches too: tokens are compressed; tests/test_server_stream.py).
            tokens: list[list[tuple[str, int]]] = []
            cache: dict[tuple[str, ...], str] = {}
            for k in range(sc.clients):
                if sc.shared:
                    sel = ids[:per]
                else:
                    start = (k * per) % len(ids)
                    sel = (ids + ids)[start : start + per]
                mine = []
                for c0 in range(0, len(sel), TOKEN_IDS):
                    key = tuple(sel[c0 : c0 + TOKEN_IDS])
                    if key not in cache:
                        cache[key] = server.subscribe(list(key))
                    mine.append((cache[key], len(key)))
                tokens.append(mine)
            nprocs = sc.client_procs or _auto_procs(sc)
            kind = "waveform" if sc.waveform else "counter"
            for p in range(nprocs):
                mine = tokens[p::nprocs]
                if not mine:
                    continue
                spec = {
                    "url": server.ws_url,
                    "deadline": hard - 30,
                    "conns": [{"tokens": t, "kind": kind} for t in mine],
                }
                children.append(Child("bench.loadclient", spec, env, tmp))
            for c in children:
                c.wait_ready(time.time() + 120)
            say(f"{sc.clients} client(s) in {len(children)} process(es) attached")
            # Under --workers the server's CPU is its workers': count every child process too.
            workers = [c.pid for c in psutil.Process(server.pid).children(recursive=True)]
            pids = {
                "server": [server.pid, *workers],
                "clients": [c.proc.pid for c in children],
                "ioc": [ioc.pid()] if ioc and ioc.pid() else [],
            }
            watch = ProcWatch(pids)
            wall, spy = _window(sc, server, children, watch, tmp)
            res["loop_lag_ms"] = server.loop_lag_ms()
            res["history"] = server.history_metrics()
            if spy is not None:
                _finish_py_spy(spy, sc)
            results = [c.result(hard) for c in children]
            watch.stop()
            conns = [conn for r in results for conn in r["conns"]]
            res.update(_summarise(conns, wall, sc))
            res["decodes"] = sum(r["decodes"] for r in results)
            res["cache_hits"] = sum(r["cache_hits"] for r in results)
            res.update(_cpu_figures(watch, children, ioc, wall, res["received"]))
            delivered = res["delivered_per_s"]
            res["server_loop_us_per_update"] = (
                res["server_loop_cpu"] / 100.0 / delivered * 1e6 if delivered else math.nan
            )
            say(
                f"server {res['server_cpu']:.1f}% cpu, {res['received']} received, "
                f"{res['missing']} missing, {res['conflated']} conflated, "
                f"p99 {res['lat_p99_ms']:.1f} ms, clients {res['client_cpu']:.1f}%"
            )
            server.stop()
            server = None
            if sc.coniql and sc.source in ("ca", "pva") and not sc.waveform:
                res.update(_run_coniql(sc, names, server_env, env, tmp, ioc, hard, say))
            if sc.floor and sc.source in ("ca", "pva") and not sc.waveform:
                res.update(_run_floor(sc, names, server_env, tmp, ioc, hard, say))
            if sc.floor and "floor_us_per_update" in res:
                res["own_us_per_update"] = res["server_us_per_update"] - res["floor_us_per_update"]
        finally:
            _stop_all(children, watch, server, ioc)
    res["elapsed"] = time.time() - t_start
    res["loadavg_1m"] = os.getloadavg()[0]
    return res


def _run_coniql(
    sc: Scenario,
    names: list[str],
    server_env: dict[str, str],
    env: dict[str, str],
    tmp: Path,
    ioc: IocProcess | None,
    hard: float,
    say: Any,
) -> dict[str, Any]:
    """Coniql serving the same PVs to one client of its own kind, same warm-up and window."""
    coniql = ConiqlServer(server_env)
    spec = {
        "kind": "counters",
        "url": coniql.url,
        # Coniql 0.4.2 has no PVA plugin: in the PVA scenarios it reads the same records over CA.
        "ids": [f"ca://{n}" for n in names],
        "ready_s": CONIQL_READY_S,
        "deadline": hard - 20,
    }
    child = Child("bench.coniql_client", spec, env, tmp)
    try:
        child.wait_ready(time.time() + CONIQL_READY_S + 60)
        ioc_pids = [pid] if ioc and (pid := ioc.pid()) else []
        watch = ProcWatch({"coniql": [coniql.pid], "client": [child.proc.pid], "ioc": ioc_pids})
        t0 = time.time() + sc.warmup
        t1 = t0 + sc.duration
        child.go(t0, t1)
        time.sleep(max(0.0, t0 - time.time()))
        watch.start_window()
        time.sleep(max(0.0, t1 - time.time()))
        wall = watch.end_window()
        watch.stop()
        r = child.result(hard)
    finally:
        child.kill()
        coniql.stop()
    nominal = round(len(names) * UPDATE_HZ * wall)
    per_s = r["received"] / wall
    out = {
        "coniql_cpu": watch.cpu_pct["coniql"],
        "coniql_client_cpu": watch.cpu_pct["client"],
        "coniql_ioc_cpu": watch.cpu_pct["ioc"],
        "coniql_received": r["received"],
        "coniql_nominal": nominal,
        "coniql_missing": max(0, nominal - r["received"]),
        "coniql_counter_advance": r["counter_advance"],
        "coniql_pvs_connected": r["pvs_connected"],
        "coniql_pvs_updated": r["pvs_updated_in_window"],
        "coniql_per_s": per_s,
        "coniql_lat_p50_ms": r["lat_p50_ms"],
        "coniql_lat_p99_ms": r["lat_p99_ms"],
        "coniql_errors": r["errors"],
        "coniql_us_per_update": (
            watch.cpu_pct["coniql"] / 100.0 / per_s * 1e6 if per_s else math.nan
        ),
    }
    say(
        f"coniql {out['coniql_cpu']:.1f}% cpu, {r['received']} of {nominal} received, "
        f"{r['pvs_connected']} PVs connected, client {out['coniql_client_cpu']:.1f}%"
    )
    return out


def _run_floor(
    sc: Scenario,
    names: list[str],
    env: dict[str, str],
    tmp: Path,
    ioc: IocProcess | None,
    hard: float,
    say: Any,
) -> dict[str, Any]:
    spec = {"backend": sc.source, "names": names, "deadline": hard - 20}
    child = Child("bench.floor", spec, env, tmp)
    try:
        child.wait_ready(time.time() + 60)
        watch = ProcWatch({"floor": [child.proc.pid], "ioc": [ioc.pid()] if ioc else []})
        t0 = time.time() + 1.0
        t1 = t0 + sc.duration
        child.go(t0, t1)
        time.sleep(max(0.0, t0 - time.time()))
        watch.start_window()
        time.sleep(max(0.0, t1 - time.time()))
        wall = watch.end_window()
        watch.stop()
        r = child.result(hard)
    finally:
        child.kill()
    per_s = r["received"] / wall
    out = {
        "floor_cpu": watch.cpu_pct["floor"],
        "floor_received": r["received"],
        "floor_expected": r["expected"],
        "floor_missing": max(0, r["expected"] - r["received"]),
        "floor_per_s": per_s,
        "floor_ioc_cpu": watch.cpu_pct["ioc"],
        "floor_us_per_update": watch.cpu_pct["floor"] / 100.0 / per_s * 1e6 if per_s else math.nan,
    }
    say(
        f"floor ({sc.source}) {out['floor_cpu']:.1f}% cpu, {r['received']} received, "
        f"{out['floor_us_per_update']:.2f} us/update"
    )
    return out


def _window(
    sc: Timed, server: Server, children: list[Child], watch: ProcWatch, tmp: Path
) -> tuple[float, subprocess.Popen[bytes] | None]:
    """The measured window: the clients told when it runs, the server profiled in it if asked.
    Returns its length (s) and the profiler, still to be finished (_finish_py_spy)."""
    t0 = time.time() + sc.warmup
    t1 = t0 + sc.duration
    for c in children:
        c.go(t0, t1)
    time.sleep(max(0.0, t0 - time.time()))
    watch.start_window()
    spy = None
    if sc.profile:
        assert server.pid is not None
        spy = _start_py_spy(server.pid, sc, tmp)
    time.sleep(max(0.0, t1 - time.time()))
    return watch.end_window(), spy


def _cpu_figures(
    watch: ProcWatch, children: list[Child], ioc: IocProcess | None, wall: float, received: int
) -> dict[str, Any]:
    """What the window cost each process, and the server per update delivered."""
    server_cpu = watch.cpu_pct["server"]
    delivered = received / wall
    return {
        "server_cpu": server_cpu,
        "client_cpu": watch.cpu_pct["clients"],
        "ioc_cpu": watch.cpu_pct["ioc"] if ioc else math.nan,
        "server_rss_mb": watch.rss_peak["server"] / 1e6,
        "client_procs": len(children),
        "wall": wall,
        "delivered_per_s": delivered,
        "server_us_per_update": server_cpu / 100.0 / delivered * 1e6 if delivered else math.nan,
        # The event loop's share (the main thread's; under --workers, the parent's only):
        # where the server's own work runs, apart from libca's and pvxs's threads.
        "server_loop_cpu": watch.main_thread_cpu_pct["server"],
    }


def _stop_all(
    children: list[Child], watch: ProcWatch | None, server: Server | None, ioc: IocProcess | None
) -> None:
    """Whatever a run started, stopped, however it ended."""
    for c in children:
        c.kill()
    if watch is not None:
        watch.stop()
    if server is not None:
        server.stop()
    if ioc is not None:
        ioc.stop()


def _latency_hist(parts: list[dict[str, Any]]) -> list[int]:
    """The load clients' latency histograms (sparse [bin, count] pairs), added up."""
    hist = [0] * HIST_BINS
    for part in parts:
        for i, n in part["hist"]:
            hist[i] += n
    return hist


def _summarise(conns: list[dict[str, Any]], wall: float, sc: Scenario) -> dict[str, Any]:
    hist = _latency_hist(conns)
    keys = ("received", "expected", "conflated", "missing", "seq_gaps", "frames", "bytes")
    out: dict[str, Any] = {k: sum(c[k] for c in conns) for k in keys}
    per = sc.per_client or sc.pvs
    out["nominal"] = round(sc.clients * (1 if sc.waveform else per) * UPDATE_HZ * wall)
    out["min_received_client"] = min((c["received"] for c in conns), default=0)
    out["max_missing_client"] = max((c["missing"] for c in conns), default=0)
    out["max_conflated_client"] = max((c["conflated"] for c in conns), default=0)
    out["lat_p50_ms"] = _percentile(hist, 0.50)
    out["lat_p99_ms"] = _percentile(hist, 0.99)
    out["lat_max_ms"] = max((c["lat_max_us"] for c in conns), default=math.nan) / 1000.0
    out["errors"] = [c["error"] for c in conns if c["error"]]
    out["per_client"] = [
        {k: c[k] for k in ("received", "expected", "conflated", "missing", "seq_gaps")}
        for c in conns
    ]
    return out


def _start_py_spy(pid: int, sc: Timed, tmp: Path) -> subprocess.Popen[bytes]:
    out = Path(__file__).parent / "results" / f"profile-{sc.name}.txt"
    out.parent.mkdir(exist_ok=True)
    spy = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen(
        [str(spy), "record", "-p", str(pid), "-d", str(int(sc.duration)), "-r", "100",
         "-f", "raw", "-o", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _finish_py_spy(spy: subprocess.Popen[bytes], sc: Timed) -> None:
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait(5)
