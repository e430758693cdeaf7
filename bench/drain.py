"""A replica leaving with 1,000 clients: `python -m bench.drain [--clients N]`.

Three replicas behind HAProxy (tests/replicas.py, checking `/readyz`, as Kubernetes' readiness
probe does), the test IOC's 10 Hz counter recorded on each (`--history-channels`). Every client
is a pvwire Python client, its own connection, following the counter in ALL mode with a backfill
(so a re-attach asks with `since` for what it missed); they run in a few processes. All of them
are on the first replica: the other two start only once the clients are streaming. Then that
replica is stopped, in one of two ways, each in a cluster of its own, one after the other:

- `at-once`: SIGINT, what SIGTERM did before the drain: every WebSocket closed with 1012 in
  the same instant; clients reconnect with their backoff (`random(0, 0.5 s)` at first);
- `drain`: SIGTERM with the default drain: `/readyz` 503 at once, 5 s serving on, then 4012
  DRAINING paced over 20 s; clients reconnect within what the close says (20 ms at 1,000).

Per way: reconnects per second at the peak (clients back, counted in any 1 s window, and in any
100 ms window times 10), each client's longest time without an update (past or live) around the
stop, the counter values lost (none when the re-attach's `since` is answered), how long the
replica took to exit and with what status. Where a lost value went: in a jump of a client's live
values before its close or after it, which the serial says a server merged away or not, or
while it moved (its new replica's history lacked it); each replica's worst loop lag by phase
and its counts of entries merged for a client behind and dropped at ALL's bounds (from /metrics
every 0.5 s); the draining replica's own account of its passes (its log); the client
processes' own worst loop lag.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import re
import signal
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pvwire.loopback import apply_loopback_env
from pvwire_dev.ioc import IocProcess, free_port

from tests.replicas import COUNTER, Haproxy
from tests.server_process import ServerProcess

DB = Path(__file__).resolve().parent.parent / "tests" / "dbs" / "test.db"
PROCESSES = 4  # client processes; 250 clients each at 1,000
BOUND_S = 300.0  # every wait's bound, never a measure
MODES = ("at-once", "drain")
GAP_S = 0.15  # a pause between two updates of the 10 Hz counter worth recording


@dataclass
class Follower:
    """One client's record: arrivals (wall clock, for every process alike) and values."""

    last: float = 0.0
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (start, length) > GAP_S
    values: set[int] = field(default_factory=set)
    lost: list[tuple[float, str]] = field(default_factory=list)
    back: list[float] = field(default_factory=list)
    streaming: int = 0
    before_loss: int | None = None  # the newest value when the stream was first lost
    first_live_after: int | None = None  # the first live (not past) value after that
    # Live values that jumped past the one before: (arrival, before, value, merged), `merged`
    # the updates the server said it merged away there (the serial's jump, `conflated`).
    jumps: list[tuple[float, int, int, int]] = field(default_factory=list)
    _live: int | None = None
    _conflated: int = 0

    def update(self, now: float, value: int | None, past: bool = False, conflated: int = 0) -> None:
        if value is not None and not past and self.lost and self.first_live_after is None:
            self.first_live_after = value
        if value is not None and not past:
            # A conflated count that fell restarted (a new upstream monitor, section 3).
            merged = conflated - self._conflated if conflated >= self._conflated else conflated
            self._conflated = conflated
            if self._live is not None and value > self._live + 1 and len(self.jumps) < 1000:
                self.jumps.append((now, self._live, value, merged))
            self._live = value
        if self.lost and len(self.back) < len(self.lost):
            self.back.append(now)
        if self.last and now - self.last > GAP_S and len(self.gaps) < 1000:
            self.gaps.append((self.last, now - self.last))
        self.last = now
        self.streaming += 1
        if value is not None:
            self.values.add(value)

    def mark(self, now: float) -> None:
        """The baseline starts: what happened before (the first streams to a busy replica, some
        lost by the client's watchdog) is not the stop's."""
        self.last, self.gaps, self.values, self.jumps = now, [], set(), []
        self.lost, self.back = [], []
        self.before_loss = self.first_live_after = None

    def result(self) -> dict[str, Any]:
        seen = self.values
        lacking = set(range(min(seen), max(seen) + 1)) - seen if seen else set()
        lo, hi = self.before_loss, self.first_live_after
        # Lost while moving (between the last value before the close and the first live one
        # after), against lost while streaming on a replica (its upstream skipped them).
        moving = sum(lo < v < hi for v in lacking) if lo is not None and hi is not None else 0
        missing = len(lacking) if seen else -1
        return {
            "missing_moving": moving,
            "missing_where": self._where(lacking),
            "gaps": self.gaps,
            "missing": missing,
            "lost": self.lost,
            "back": self.back,
        }

    def _where(self, lacking: set[int]) -> dict[str, int]:
        """Where each value lacking at the end went missing: in a jump of the live values on the
        first replica (before the stream was lost) or on the next one, which the server said it
        merged away (`merged`) or not; else while moving."""
        where: dict[str, int] = {}
        lost_at = self.lost[0][0] if self.lost else float("inf")
        lo_move, hi_move = self.before_loss, self.first_live_after
        for v in lacking:
            key = "moving"
            if lo_move is not None and hi_move is not None and lo_move < v < hi_move:
                where[key] = where.get(key, 0) + 1
                continue
            key = "unexplained"
            for t, lo, hi, merged in self.jumps:
                if lo < v < hi:
                    side = "before" if t < lost_at else "after"
                    key = f"{side} close, {'merged' if merged else 'not merged'}"
                    break
            where[key] = where.get(key, 0) + 1
        return where


async def _follow(url: str, f: Follower) -> None:
    from pvwire_client import Client, ServerUnavailable
    from pvwire_client.state import CONNECTED, DISCONNECTED

    for attempt in range(10):  # a first registration the busy replica could not answer
        try:
            async with Client(url, timeout=30.0) as c:
                async for u in c.monitor(COUNTER, mode="ALL", backfill=120):
                    ch = u.channel
                    if ch.state == DISCONNECTED:
                        if not f.lost and f.values:
                            f.before_loss = max(f.values)
                        f.lost.append((time.time(), ch.reason or ""))
                    elif ch.state == CONNECTED:
                        value = None if ch.value is None else int(ch.value)
                        f.update(time.time(), value, u.past, ch.conflated)
        except ServerUnavailable:
            if f.streaming or attempt == 9:
                raise
            await asyncio.sleep(1.0 + attempt)


async def _clients(url: str, n: int, pipe: Connection) -> None:
    followers = [Follower() for _ in range(n)]
    tasks = []
    for f in followers:  # ~100 a second over all processes: one replica answers them all
        tasks.append(asyncio.create_task(_follow(url, f)))
        await asyncio.sleep(PROCESSES * 0.01)
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + BOUND_S
    while not all(f.streaming >= 3 for f in followers):
        if time.monotonic() > deadline or any(t.done() for t in tasks):
            failed = [t.exception() for t in tasks if t.done()]
            pipe.send(("failed", repr(failed[:3])))
            return
        await asyncio.sleep(0.1)
    pipe.send(("ready", n))
    lag = [0.0]  # this process's own worst loop lag since the mark: its clients' pauses too
    tasks.append(asyncio.create_task(_probe_lag(lag)))
    while True:
        command = await loop.run_in_executor(None, pipe.recv)
        if command == "mark":
            now = time.time()
            for f in followers:
                f.mark(now)
            lag[0] = 0.0
        elif command == "stop":
            pipe.send(("results", ([f.result() for f in followers], lag[0])))
            break
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _probe_lag(worst: list[float], period: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(period)
        worst[0] = max(worst[0], loop.time() - t - period)


def _client_process(url: str, n: int, pipe: Connection, env: dict[str, str]) -> None:
    os.environ.update(env)
    asyncio.run(_clients(url, n, pipe))


def _instance(url: str) -> str:
    body = json.dumps({"query": "{ server { instance } }"}).encode()
    req = urllib.request.Request(f"{url}/graphql", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(json.loads(r.read())["data"]["server"]["instance"])


def _wait(check: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {BOUND_S} s")
        time.sleep(0.1)


def _peak(times: list[float], window: float) -> int:
    """The most of `times` within any `window` seconds."""
    times, most, j = sorted(times), 0, 0
    for i, t in enumerate(times):
        while times[j] < t - window:
            j += 1
        most = max(most, i - j + 1)
    return most


def trial(mode: str, clients: int, delay_s: float, window_s: float) -> dict[str, Any]:
    env = {
        "PVWIRE_DRAIN_DELAY_S": str(delay_s),
        "PVWIRE_DRAIN_WINDOW_S": str(window_s),
        # Every client comes from 127.0.0.1 (through HAProxy): the per-address bound (100)
        # would refuse most of them.
        "PVWIRE_MAX_CONNECTIONS_PER_ADDRESS": str(2 * clients + 100),
    }
    # The server's defaults (send budget, stall limit), not the tests' quick failure settings.
    args = ["--history-channels", COUNTER]
    ports = [free_port() for _ in range(3)]
    # The first one logs at info: its drain's last line says how its passes went.
    replicas = [
        ServerProcess(
            *args, "--log-level", "info" if i == 1 else "warning",
            port=p, env={**env, "PVWIRE_INSTANCE": f"r{i}"},
        )
        for i, p in enumerate(ports, start=1)
    ]  # fmt: skip
    victim, others = replicas[0], replicas[1:]
    # Each client holds its WebSocket and, for a few seconds, its GraphQL connection.
    proxy = Haproxy(ports, check="/readyz", maxconn=4 * clients + 1000)
    pipes: list[Connection] = []
    procs: list[multiprocessing.process.BaseProcess] = []
    ctx = multiprocessing.get_context("spawn")
    try:
        victim.start(BOUND_S)
        proxy.start()
        with Sampler(replicas) as sampler:
            per = [clients // PROCESSES + (i < clients % PROCESSES) for i in range(PROCESSES)]
            for n in (n for n in per if n):
                mine, theirs = ctx.Pipe()
                p = ctx.Process(
                    target=_client_process, args=(proxy.url, n, theirs, dict(os.environ))
                )
                p.start()
                pipes.append(mine)
                procs.append(p)
            for pipe in pipes:
                kind, detail = pipe.recv()
                if kind != "ready":
                    raise RuntimeError(f"clients did not stream: {detail}")
            for r in others:
                r.start(BOUND_S)  # a bound: the machine is shared, and 1,000 clients busy
            # HAProxy sends new connections to the others too (each answers once it is up).
            _wait(lambda: {_instance(proxy.url) for _ in range(12)} >= {"r1", "r2", "r3"}, "r2, r3")
            marked = time.time()
            for pipe in pipes:
                pipe.send("mark")
            time.sleep(2.0)  # a baseline of updates before the stop, for the gaps
            stopped = time.time()
            victim.signal(signal.SIGINT if mode == "at-once" else signal.SIGTERM)
            status = victim.wait(delay_s + window_s + BOUND_S)
            exited = time.time() - stopped
            _wait(
                lambda: sum(_clients_on(r) for r in others) >= clients, "every client on r2 and r3"
            )
            time.sleep(2.0)  # updates after, for the gaps
            results: list[dict[str, Any]] = []
            client_lag = 0.0
            for pipe in pipes:
                pipe.send("stop")
                kind, (got, lag) = pipe.recv()
                results += got
                client_lag = max(client_lag, lag)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        proxy.stop()
        for r in replicas:
            r.stop()
    back = [r["back"][0] for r in results if r["back"]]
    closes = [r["lost"][0][0] for r in results if r["lost"]]
    away = sorted(r["back"][0] - r["lost"][0][0] for r in results if r["back"] and r["lost"])
    reasons: dict[str, int] = {}
    for r in results:
        for _, why in r["lost"]:
            code = why.removeprefix("stream closed: ").split(" (")[0]
            reasons[code] = reasons.get(code, 0) + 1

    def longest(after: bool) -> list[float]:
        """Per client, its longest pause between updates ending after (or before) the stop."""
        return sorted(
            max([n for t, n in r["gaps"] if (t + n >= stopped) == after] or [0.0]) for r in results
        )

    during, before = longest(True), longest(False)
    missing = [r["missing"] for r in results]
    return {
        "mode": mode,
        "clients": clients,
        "moved": len(back),
        "exit_status": status,
        "exit_s": round(exited, 2),
        "closes_span_s": round(max(closes) - min(closes), 2) if closes else 0.0,
        "first_close_s": round(min(closes) - stopped, 2) if closes else 0.0,
        "reconnects_peak_per_s": _peak(back, 1.0),
        "reconnects_peak_per_100ms_x10": 10 * _peak(back, 0.1),
        "closes_peak_per_s": _peak(closes, 1.0),
        "losses_by_code": reasons,
        "away_s_median": round(statistics.median(away), 3) if away else 0.0,
        "away_s_p99": round(_p99(away), 3),
        "longest_without_data_s_median": round(statistics.median(during), 3),
        "longest_without_data_s_p99": round(_p99(during), 3),
        "longest_without_data_s_max": round(during[-1], 3),
        # The same before the stop: what a loaded machine shows without any stop.
        "longest_before_stop_s_median": round(statistics.median(before), 3),
        "longest_before_stop_s_max": round(before[-1], 3),
        "updates_lost_total": sum(m for m in missing if m > 0),
        "updates_lost_while_moving": sum(r["missing_moving"] for r in results),
        "updates_lost_where": _summed(r["missing_where"] for r in results),
        "clients_losing_updates": sum(m > 0 for m in missing),
        "servers": sampler.summary(marked, stopped),
        # The client processes' worst loop lag from the baseline on: a pause the clients
        # themselves caused, not the servers.
        "clients_lag_max_s": round(client_lag, 3),
        "drain_log": _drain_done(victim.log()),
    }


_DRAIN_DONE = re.compile(
    r"drain done: (?P<closed>\d+) clients closed in (?P<s>[\d.]+) s, in (?P<passes>\d+) passes "
    r"of at most (?P<most>\d+); at most (?P<behind_s>[\d.]+) s behind the schedule; "
    r"(?P<left>\d+) connections left"
)


def _drain_done(log: str) -> dict[str, float]:
    """The drain's own account of its closes (server side, its loop's clock), if it logged it."""
    m = _DRAIN_DONE.search(log)
    return {k: float(v) for k, v in m.groupdict().items()} if m else {}


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for k, n in c.items():
            total[k] = total.get(k, 0) + n
    return dict(sorted(total.items()))


def _p99(xs: list[float]) -> float:
    return xs[int(0.99 * (len(xs) - 1))] if xs else 0.0


def _clients_on(r: ServerProcess) -> int:
    return int(_series(r).get("pvwire_clients", 0))


SAMPLED = (
    "pvwire_clients",
    "pvwire_event_loop_lag_seconds",
    "pvwire_conflated_total",
    "pvwire_dropped_total",
)


def _series(r: ServerProcess) -> dict[str, float]:
    """The unlabelled series of `SAMPLED` in the replica's /metrics."""
    got = {}
    for line in r.metrics().splitlines():
        name, _, rest = line.partition(" ")
        if name in SAMPLED:
            got[name] = float(rest.split()[0])
    return got


class Sampler:
    """Each replica's /metrics every 0.5 s while it answers: where the server merged or
    dropped updates, and how late its loop ran, before and after the stop."""

    def __init__(self, replicas: list[ServerProcess]) -> None:
        self.replicas = replicas
        self.rows: list[tuple[float, int, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for i, r in enumerate(self.replicas):
                with contextlib.suppress(OSError, ValueError):
                    self.rows.append((time.time(), i, _series(r)))

    def summary(self, marked: float, stopped: float) -> dict[str, Any]:
        """Per replica (r1 the one stopped): its worst loop lag by phase (`setup`: the clients
        connecting, before the baseline; `before` the stop; `after` it), and the entries it
        merged for a client behind and dropped at ALL's bounds. (Its upstream updates a second,
        taken from these samples, proved too noisy to tell one dropped update: the clients'
        serials tell that exactly.)"""
        out: dict[str, Any] = {}
        phases = {"setup": (0.0, marked), "before": (marked, stopped), "after": (stopped, 1e12)}
        lag = "pvwire_event_loop_lag_seconds"
        for i in range(len(self.replicas)):
            rows = [(t, m) for t, j, m in self.rows if j == i and m]
            if not rows:
                continue
            got: dict[str, Any] = {}
            for name, (lo, hi) in phases.items():
                lags = [m.get(lag, 0.0) for t, m in rows if lo <= t < hi]
                if lags:
                    got[f"lag_max_{name}_s"] = round(max(lags), 3)
            first, last = rows[0][1], rows[-1][1]
            for k in ("pvwire_conflated_total", "pvwire_dropped_total"):
                name = k.removeprefix("pvwire_").removesuffix("_total")
                got[name] = last.get(k, 0) - first.get(k, 0)
            out[f"r{i + 1}"] = got
        return out


def measure(
    clients: int = 1000,
    delay_s: float = 5.0,
    window_s: float = 20.0,
    modes: tuple[str, ...] = MODES,
) -> dict[str, Any]:
    """Both ways (or those of `modes`), one after the other, against one IOC."""
    apply_loopback_env()
    ioc = IocProcess([DB])
    os.environ.update(ioc.ports.client_env())
    ioc.start()
    try:
        return {m: trial(m, clients, delay_s, window_s) for m in modes}
    finally:
        ioc.stop()


def table(res: dict[str, Any]) -> str:
    rows = [
        "| stop | clients moved | closes/s, reconnects/s at the peak (1 s; 100 ms x 10) "
        "| away per client, median / p99 (s) | longest time without data per client, "
        "median / p99 / max (s; before the stop: median / max) | updates lost | closes span (s) "
        "| server: passes, most in one, behind (s) | clients' own lag (s) | exit (s, status) |",
        "|---|---:|---|---|---|---:|---:|---|---:|---|",
    ]
    for m, r in res.items():
        d = r["drain_log"]
        passes = f"{d['passes']:.0f}, {d['most']:.0f}, {d['behind_s']}" if d else "-"
        rows.append(
            f"| {m} | {r['moved']} | {r['closes_peak_per_s']}, {r['reconnects_peak_per_s']} "
            f"({r['reconnects_peak_per_100ms_x10']}) | {r['away_s_median']} / {r['away_s_p99']} "
            f"| {r['longest_without_data_s_median']} / {r['longest_without_data_s_p99']} / "
            f"{r['longest_without_data_s_max']} ({r['longest_before_stop_s_median']} / "
            f"{r['longest_before_stop_s_max']}) | {r['updates_lost_total']} | "
            f"{r['closes_span_s']} | {passes} | {r['clients_lag_max_s']} | "
            f"{r['exit_s']}, {r['exit_status']} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.drain", description=__doc__)
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--delay", type=float, default=5.0)
    p.add_argument("--window", type=float, default=20.0)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = p.parse_args()
    res = measure(args.clients, args.delay, args.window, tuple(args.modes))
    print(json.dumps(res, indent=1))
    print(table(res))


if __name__ == "__main__":
    main()
