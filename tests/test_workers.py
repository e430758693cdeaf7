"""`serve --workers N`: N processes on one port, each saying who it is in /metrics and in the
GraphQL `server` query, so an operator can tell which worker answered and keep their counters
apart. Real server processes over real HTTP."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.attacks import slow_senders
from tests.server_process import ServerProcess, server_args_for_tests

INFO = re.compile(r"^pvwire_server_info\{(?P<labels>[^}]*)\} 1$", re.M)
# New connections are spread over the workers by the kernel: enough requests see both of them
# at once on an idle machine; a loaded one may take longer, so the wait is bounded, not short.
SPREAD_TIMEOUT = 60.0


def labels(text: str) -> dict[str, str]:
    (match,) = INFO.findall(text)
    return dict(re.findall(r'(\w+)="([^"]*)"', match))


def scrape(url: str) -> str:
    # A fresh connection per request: a kept-alive one would stay with one worker.
    req = urllib.request.Request(f"{url}/metrics", headers={"Connection": "close"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text: str = r.read().decode()
    return text


@pytest.fixture(scope="module")
def two_workers() -> Iterator[ServerProcess]:
    with ServerProcess(*server_args_for_tests(["--workers", "2"])) as proc:
        yield proc


def test_a_lone_server_names_itself_without_a_worker_label(server: ServerProcess) -> None:
    text = scrape(server.url)
    info = labels(text)
    assert info["worker"] == "0" and info["workers"] == "1" and int(info["pid"]) == server.pid
    assert re.search(r"^pvwire_clients \d", text, re.M)
    s = server.graphql("query { server { instance pid worker workers } }")["data"]["server"]
    assert s == {"instance": info["instance"], "pid": server.pid, "worker": 0, "workers": 1}


def test_each_worker_names_itself_in_metrics_and_graphql(two_workers: ServerProcess) -> None:
    from_metrics: dict[str, str] = {}  # worker -> pid
    from_graphql: dict[int, int] = {}
    deadline = time.monotonic() + SPREAD_TIMEOUT
    while (len(from_metrics) < 2 or len(from_graphql) < 2) and time.monotonic() < deadline:
        text = scrape(two_workers.url)
        info = labels(text)
        assert info["workers"] == "2" and info["worker"] in ("1", "2"), info
        from_metrics[info["worker"]] = info["pid"]
        # Every series carries the worker's label, so two workers' counters never merge.
        samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        assert all(f'worker="{info["worker"]}"' in ln for ln in samples), samples
        q = "query { server { instance pid worker workers } }"
        s = two_workers.graphql(q)["data"]["server"]
        assert s["workers"] == 2 and s["instance"] == info["instance"]
        from_graphql[s["worker"]] = s["pid"]
    assert set(from_metrics) == {"1", "2"} and set(from_graphql) == {1, 2}
    assert len(set(from_metrics.values())) == 2 and two_workers.pid not in from_graphql.values()
    assert {int(w): int(p) for w, p in from_metrics.items()} == from_graphql


async def test_every_worker_bounds_slow_headers(two_workers: ServerProcess) -> None:
    """The server's own HTTP protocol (api/http_protocol.py) in every worker: each slow sender,
    whichever worker the kernel hands it to, is answered 408 by the header deadline."""
    senders = await slow_senders(two_workers, {"headers": 20}, ["127.0.0.1"])
    wrong = [s for s in senders if s.status != 408 or b"http_header_timeout_s" not in s.answer]
    assert not wrong, [s.answer[:200] for s in wrong[:3]]
