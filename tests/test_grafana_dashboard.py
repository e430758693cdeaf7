"""docs/grafana/pvwire.json: a Grafana JSON model whose data source is an input, and every one of
its PromQL expressions answered by a real Prometheus (Debian's, `make prometheus`) scraping a
real server of two workers every second while clients receive updates from it: each returns at
least one series, and the figures that can be checked are plausible."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pvwire.core.tick import TICK_BUCKETS_MS
from pvwire.status import quantile
from pvwire_client import Client
from pvwire_dev.ioc import IocProcess, free_port

from tests.eventually import eventually
from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess, refuse_bearer_tokens, server_args_for_tests

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = json.loads((ROOT / "docs" / "grafana" / "pvwire.json").read_text())
JOB = "pvwire"
# What Grafana puts for $__rate_interval with a data source scraped every few seconds: long
# enough for each of two workers, scraped in turn, to have two samples in it.
RATE_INTERVAL = "15s"
STREAM_CLIENTS = 4  # plus one pvws client
DS_REF = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def panels() -> list[dict[str, Any]]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def targets() -> list[tuple[str, str]]:
    """(panel title/refId, expression) of every target of every panel."""
    return [(f"{p['title']}/{t['refId']}", t["expr"]) for p in panels() for t in p["targets"]]


def expressions() -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]


def substitute(expr: str, instance: str = ".*", job: str = JOB) -> str:
    """An expression as Grafana sends it: its variables replaced (All is `.*`)."""
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$instance", instance)
        .replace("$job", job)
    )


# --- the JSON model -------------------------------------------------------------------------


def test_the_data_source_is_an_input_every_panel_and_variable_uses() -> None:
    (ds,) = DASHBOARD["__inputs"]
    assert (ds["name"], ds["type"], ds["pluginId"]) == ("DS_PROMETHEUS", "datasource", "prometheus")
    for p in panels():
        assert p["datasource"] == DS_REF, p["title"]
        assert p["targets"] and all(t["datasource"] == DS_REF for t in p["targets"]), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    for var in DASHBOARD["templating"]["list"]:
        assert var["datasource"] == DS_REF and var["allValue"] == ".*", var["name"]
    required = {r["id"] for r in DASHBOARD["__requires"]}
    assert {p["type"] for p in panels()} | {"grafana", "prometheus"} <= required


def test_panels_have_unique_ids_and_tile_the_24_column_grid() -> None:
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, f"{p['title']} overlaps another panel"
        taken |= cells


def test_every_expression_filters_by_the_variables_and_rates_by_the_interval() -> None:
    for title, expr in expressions():
        for selector in re.findall(r"pvwire_\w+(\{[^}]*\})?", expr):
            assert selector == '{job=~"$job", instance=~"$instance"}', (title, expr)
        windows = re.findall(r"\[([^\]]+)\]", expr)
        assert windows and set(windows) == {"$__rate_interval"}, (title, expr)


def test_every_metric_the_dashboard_reads_is_served_and_every_series_is_shown(
    scraped: ServerProcess,
) -> None:
    served = set(re.findall(r"^# TYPE pvwire_(\w+) ", scraped.metrics(), re.M))
    read = {
        m
        for _, e in expressions()
        for m in re.findall(r"pvwire_(\w+?)(?:_bucket|_sum|_count)?\{", e)
    }
    assert read <= served
    # Left to section 13's and 14's readers: MJPEG's feeds, views, reclaimed histories.
    unshown = {"mjpeg_feeds", "mjpeg_viewers", "mjpeg_encodes_total", "mjpeg_frames_sent_total",
               "views", "history_reclaimed_total"}  # fmt: skip
    assert served - read <= unshown


# --- a real Prometheus scraping a real server under load ---------------------------------------


class Load:
    """Clients receiving updates from `url` for as long as the module runs, on a loop of their
    own in a thread (the tests query Prometheus meanwhile)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.received = 0
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        tasks = [asyncio.create_task(self._stream(i)) for i in range(STREAM_CLIENTS)]
        tasks.append(asyncio.create_task(self._pvws()))
        tasks.append(asyncio.create_task(self._leave()))
        await self._stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _stream(self, i: int) -> None:
        try:
            async with Client(self.url, timeout=10) as c:
                ids = ["sim://counter/dash?rate=20", f"sim://sine/dash{i}?period=2&rate=20",
                       "ca://PVW:COUNTER"]  # fmt: skip
                async for _ in c.monitor(ids):
                    self.received += 1
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.error = exc

    async def _leave(self) -> None:
        """A client that reads one update and goes: the disconnects have a code to count."""
        async with Client(self.url, timeout=10) as c:
            stream = c.monitor("sim://counter/dash?rate=20")
            await anext(stream)
            await stream.aclose()

    async def _pvws(self) -> None:
        client = await PvwsClient.connect(self.url)
        try:
            await client.subscribe("sim://counter/dash?rate=20")
            while True:
                await client.next("update", timeout=30)
                self.received += 1
        finally:
            await client.close()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


class Prometheus:
    """Debian's Prometheus on loopback, scraping `targets` every second, its data in `data`."""

    def __init__(self, data: Path, targets: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = data / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        self.log = data / "prometheus.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        eventually(self._ready, lambda: self.log.read_text(), timeout=60)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (or the API's error, raised)."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            with exc:
                raise AssertionError(f"{expr}: {exc.read().decode()}") from None
        assert doc["status"] == "success" and doc["data"]["resultType"] == "vector", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's `label_values(match, label)` asks the API for."""
        query = urllib.parse.urlencode({"match[]": match})
        with urllib.request.urlopen(
            f"{self.url}/api/v1/label/{label}/values?{query}", timeout=30
        ) as r:
            values: list[str] = json.loads(r.read())["data"]
        return values

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def scraped(epics_env: IocProcess) -> Iterator[ServerProcess]:
    # --forward-identity: pvwire's own PVA client exists, so its refusals are exported (at 0).
    with ServerProcess(*server_args_for_tests(["--workers", "2", "--forward-identity"])) as proc:
        yield proc


@pytest.fixture(scope="module")
def load(scraped: ServerProcess) -> Iterator[Load]:
    running = Load(scraped.url)
    try:
        eventually(lambda: running.received >= 50 or running.error, "clients receiving updates")
        assert running.error is None, running.error
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def prometheus(
    scraped: ServerProcess, load: Load, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{scraped.port}"])
    try:
        yield prom
    finally:
        prom.stop()


def values(result: list[dict[str, Any]]) -> list[float]:
    return [float(s["value"][1]) for s in result]


def answered(
    prom: Prometheus, expr: str, plausible: Callable[[list[dict[str, Any]]], bool]
) -> None:
    """Until `expr` (substituted) returns at least one series that `plausible` accepts."""
    query = substitute(expr)
    last: list[list[dict[str, Any]]] = [[]]

    def check() -> bool:
        last[0] = prom.query(query)
        return bool(last[0]) and plausible(last[0])

    eventually(check, lambda: f"{query} -> {last[0]}", timeout=90, interval=0.5)


def positive(result: list[dict[str, Any]]) -> bool:
    return any(v > 0 for v in values(result))


def any_series(result: list[dict[str, Any]]) -> bool:
    return True


# Figures the load makes checkable, by panel title and target; every other expression must
# return at least one series.
PLAUSIBLE: dict[str, Callable[[list[dict[str, Any]]], bool]] = {
    "Clients/A": lambda r: sum(values(r)) >= STREAM_CLIENTS + 1,
    "Processes/A": lambda r: sum(values(r)) == 2,  # the two workers, both scraped in turn
    "Clients by process/A": lambda r: {s["metric"].get("worker") for s in r} == {"1", "2"},
    "Deliveries by process/A": lambda r: {s["metric"].get("worker") for s in r} == {"1", "2"},
    "Upstream channels/B": lambda r: any(
        s["metric"] == {"scheme": "ca", "state": "connected"} and float(s["value"][1]) >= 1
        for s in r
    ),
    "Worst loop lag/A": lambda r: all(0 <= v < 5 for v in values(r)),
    "Event loop lag/A": lambda r: all(0 <= v < 5 for v in values(r)),
    "History memory/B": lambda r: any(v == 128 * (1 << 20) for v in values(r)),
}
PLAUSIBLE |= {
    f"{title}/{ref}": positive
    for title, refs in (("Upstream channels", "A"), ("Updates in", "A"), ("Deliveries", "A"),
                        ("Updates in and out", "ABC"), ("Bytes", "A"))
    for ref in refs
}  # fmt: skip
PLAUSIBLE |= {
    f"Tick duration/{ref}": lambda r: all(0 < v <= TICK_BUCKETS_MS[-1] / 1000 for v in values(r))
    for ref in "ABC"
}


@pytest.mark.parametrize(("target", "expr"), targets(), ids=[t for t, _ in targets()])
def test_prometheus_answers_every_expression(
    prometheus: Prometheus, target: str, expr: str
) -> None:
    answered(prometheus, expr, PLAUSIBLE.get(target, any_series))


def test_the_variables_list_the_scraped_job_and_instance(
    prometheus: Prometheus, scraped: ServerProcess
) -> None:
    target = f"127.0.0.1:{scraped.port}"
    eventually(lambda: prometheus.label_values("job", "pvwire_server_info") == [JOB])
    match = substitute('pvwire_server_info{job=~"$job"}')
    assert prometheus.label_values("instance", match) == [target]
    # A variable set to that one instance selects it, and another selects nothing.
    expr = next(e for t, e in expressions() if t == "Clients")
    assert prometheus.query(substitute(expr, instance=target))
    assert not prometheus.query(substitute(expr, instance="no-such-host:1"))


def test_refusals_show_by_reason(prometheus: Prometheus, scraped: ServerProcess) -> None:
    refuse_bearer_tokens(scraped, 20)
    (expr,) = [e for t, e in expressions() if t == "Refusals" and "auth_refusals" in e]
    answered(prometheus, expr, positive)


def test_the_status_pvs_tick_p99_reads_the_histogram_as_prometheus_does(
    prometheus: Prometheus,
) -> None:
    """status/figures.py's quantile and Prometheus's histogram_quantile, over the same samples:
    one worker's buckets at one instant."""
    buckets = 'last_over_time(pvwire_tick_duration_seconds_bucket{worker="1"}[15s])'

    at = [0.0]

    def sampled() -> list[dict[str, Any]] | None:
        # Two scrape timeouts back: a scrape still being ingested cannot change what the second
        # query sees at the same instant.
        at[0] = time.time() - 2.0
        found = prometheus.query(buckets, at[0])
        if len(found) != len(TICK_BUCKETS_MS) + 1:
            return None
        # A histogram scraped before the first tick holds nothing: its quantile is NaN.
        return found if max(float(s["value"][1]) for s in found) > 0 else None

    series = eventually(sampled, "worker 1's tick histogram scraped with ticks", timeout=60)
    cumulative = {float(s["metric"]["le"]): float(s["value"][1]) for s in series}
    bounds = sorted(cumulative)
    counts = [int(cumulative[b] - (cumulative[a] if a is not None else 0))
              for a, b in zip([None, *bounds[:-1]], bounds, strict=True)]  # fmt: skip
    theirs = values(prometheus.query(f"histogram_quantile(0.99, {buckets})", at[0]))[0]
    ours = quantile(0.99, [b * 1000 for b in bounds[:-1]], counts) / 1000
    assert math.isclose(ours, theirs, rel_tol=1e-9), (ours, theirs, counts)
