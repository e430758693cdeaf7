"""A flood of gets of names no server has leaves nothing behind: no channel searching, RSS flat.

Before channels were released after use, 2,000 unknown CA names left 2,000 channels searching
for the life of the process (RSS +27 MB). This runs its own server so its RSS is its own.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import psutil
import pytest
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually
from tests.server_process import ServerProcess, server_args_for_tests

QUERY = """query($ids: [String!]!, $timeout: Float!) {
  channels(ids: $ids, timeout: $timeout) { id errorCode }
}"""
BATCH = 1000  # names per request: 500 CA + 500 PVA
FLOOD = 20_000
WARM_UP = 2_000
RELEASE_TIMEOUT = 60.0
# The channels of 20,000 names leaked ~270 MB before (27 MB per 2,000); what is left after the
# flood must be far below that, whatever the allocator keeps for itself.
RSS_GROWTH_LIMIT = 40 * 2**20


@pytest.fixture
def own_server(epics_env: IocProcess) -> Iterator[ServerProcess]:
    # The shared IOC: the known names at the end are its own (run alone, the file had none).
    server = ServerProcess(*server_args_for_tests())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _ca_channels(server: ServerProcess, state: str) -> int:
    text = server.metrics()
    m = re.search(
        rf'^pvwire_upstream_channels\{{scheme="ca",state="{state}"\}} (\d+)', text, re.MULTILINE
    )
    assert m, "pvwire_upstream_channels for ca missing from /metrics"
    return int(m.group(1))


def _flood(server: ServerProcess, start: int, count: int, timeout: float = 0.5) -> None:
    for first in range(start, start + count, BATCH):
        names = range(first, first + BATCH // 2)
        ids = [f"ca://PVW:FLOOD:{i}" for i in names] + [f"pva://PVW:FLOOD:{i}" for i in names]
        doc = server.graphql(QUERY, {"ids": ids, "timeout": timeout})
        assert "errors" not in doc, doc.get("errors")
        codes = {ch["errorCode"] for ch in doc["data"]["channels"]}
        assert codes == {"NOT_FOUND"}, codes


def test_flood_of_unknown_names_is_released(own_server: ServerProcess) -> None:
    server = own_server
    pid = server.pid
    assert pid is not None
    proc = psutil.Process(pid)

    # The count is live: a request still waiting on its names shows them as searching. 5 s of
    # waiting: polls 0.2 s apart, on a busy machine, do not miss it.
    busy = threading.Thread(target=_flood, args=(server, 10_000_000, BATCH, 5.0))
    busy.start()
    try:
        eventually(
            lambda: _ca_channels(server, "searching") > 0, "searching channels seen", interval=0.2
        )
    finally:
        busy.join()

    # Warm-up: the allocator and the libraries reach their working size first.
    _flood(server, 0, WARM_UP)
    eventually(
        lambda: _ca_channels(server, "searching") == 0,
        "no CA search",
        timeout=RELEASE_TIMEOUT,
        interval=0.2,
    )
    rss_before = proc.memory_info().rss

    _flood(server, WARM_UP, FLOOD)
    eventually(
        lambda: _ca_channels(server, "searching") == 0,
        "no CA search",
        timeout=RELEASE_TIMEOUT,
        interval=0.2,
    )
    assert _ca_channels(server, "connected") == 0
    growth = proc.memory_info().rss - rss_before
    assert growth < RSS_GROWTH_LIMIT, f"RSS grew {growth / 2**20:.1f} MB over the flood"

    # Known names still work afterwards, and their channels are released too.
    doc = server.graphql(QUERY, {"ids": ["ca://PVW:AO", "pva://PVW:AO"], "timeout": 20})
    assert [ch["errorCode"] for ch in doc["data"]["channels"]] == [None, None]
