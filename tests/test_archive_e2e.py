"""The facility's archive behind the history, end to end: the real server (A) with `--archiver`
in front of two archivers that speak the published format, over real HTTP, and a real IOC.

- a second pvwire (B), recording the IOC's 10 Hz counter since before A started, serving its
  Archiver Appliance API: through A, GraphQL `history`, the stream's backfill and A's own
  Archiver Appliance API answer B's rows before A's oldest kept point and A's from there on,
  exactly (no row twice, none missing), raw and binned;
- tests/archiver.py, whose PB the PyPI client's protobuf classes write: A's rows of the same
  counter over PVA after its samples, raw and binned, each counted one by one; a repeated plot
  is not asked of it again; the Python client's `history` spans both;
- archivers that are down, trickle bytes, answer garbage, an error or too many samples: each
  costs at most `--archive-timeout`, answers the recent part with the marker (GraphQL `archive`,
  the stream's gap row with its reason, the Archiver Appliance API's header and meta), and
  another client is served meanwhile."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from pvwire.limits import integer
from pvwire_client import Client, wire
from pvwire_dev.ioc import IocProcess, free_port

from tests.archiver import NS, PbArchiver
from tests.eventually import eventually
from tests.server_process import ServerProcess, server_args_for_tests, stream_token
from tests.stream_client import RawStream

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]

COUNTER = "ca://PVW:COUNTER"  # B holds its past
PB_COUNTER = "pva://PVW:COUNTER"  # tests/archiver.py holds its past
TIMEOUT_S = 3.0  # --archive-timeout: a bound, far above what a bystander's answer takes
Q = """query($id: String!, $since: Float, $until: Float, $max: Int!) {
  history(id: $id, since: $since, until: $until, maxPoints: $max) {
    resolution seconds nanoseconds value count gap recordedSince
    archive { state reason rows until } } }"""


class Servers:
    def __init__(self, a: ServerProcess, b: ServerProcess, pb: PbArchiver,
                 failing: dict[str, PbArchiver]) -> None:  # fmt: skip
        self.a, self.b, self.pb, self.failing = a, b, pb, failing


@pytest.fixture(scope="module")
def servers(epics_env: IocProcess) -> Iterator[Servers]:
    with (
        ServerProcess(*server_args_for_tests(["--history-channels", COUNTER])) as b,
        PbArchiver() as pb,
        PbArchiver("SLOW") as slow,
        PbArchiver("SLOW") as slow_stream,
        PbArchiver("GARBAGE") as garbage,
        PbArchiver("BIG") as big,
        PbArchiver("ERROR") as error,
    ):
        pb.every("PVW:COUNTER", time.time_ns() // NS * NS - 600 * NS, NS // 10)
        # B records for a while before A starts: their pasts overlap, A's is the shorter.
        eventually(lambda: len(history(b, COUNTER, 0)["value"]) >= 30, "B recorded")
        routes = [
            f"{COUNTER}={b.url}/retrieval", f"{PB_COUNTER}={pb.url}",
            f"ca://SLOW:*={slow.url}", f"sim://ramp*={slow_stream.url}",
            f"ca://GARBAGE:*={garbage.url}", f"ca://BIG:*={big.url}",
            f"ca://ERROR:*={error.url}", f"ca://DOWN:*=http://127.0.0.1:{free_port()}/retrieval",
        ]  # fmt: skip
        extra = ["--history-channels", COUNTER, "--history-channels", PB_COUNTER,
                 "--archive-timeout", str(TIMEOUT_S),
                 *(a for r in routes for a in ("--archiver", r))]  # fmt: skip
        with ServerProcess(*server_args_for_tests(extra)) as a:
            eventually(lambda: own(a, COUNTER, 15) and own(a, PB_COUNTER, 15), "A recorded")
            failing = {"slow": slow, "slow_stream": slow_stream, "garbage": garbage}
            yield Servers(a, b, pb, failing)


def history(server: ServerProcess, cid: str, since: float, max_points: int = 10_000,
            until: float | None = None) -> dict[str, Any]:  # fmt: skip
    doc = server.graphql(Q, {"id": cid, "since": since, "until": until, "max": max_points})
    assert "errors" not in doc, doc
    return dict(doc["data"]["history"])


def times(h: dict[str, Any]) -> list[int]:
    return [s * NS + n for s, n in zip(h["seconds"], h["nanoseconds"], strict=True)]


def own(a: ServerProcess, cid: str, n: int) -> bool:
    """A has recorded `cid` for two seconds (its history reaches back: no archive needed) and
    holds `n` points of it there."""
    h = history(a, cid, time.time() - 2)
    return h["archive"]["state"] == "NOT_NEEDED" and len(h["value"]) >= n


def a_own(a: ServerProcess, cid: str) -> tuple[int, list[int]]:
    """A's oldest kept point of `cid` (where its rows begin), and its rows from there on as it
    holds them (read with no archive: NOT_NEEDED). GraphQL's seconds are floats, finer than a
    microsecond only at a row's own (seconds, nanoseconds): the oldest is the row there."""
    joined = history(a, cid, time.time() - 300)
    seam = joined["archive"]["until"]
    at = [t for t in times(joined) if abs(t - seam * NS) < 2_000]
    assert len(at) == 1, (seam, at)
    h = history(a, cid, seam + 1e-6)
    assert h["archive"]["state"] == "NOT_NEEDED", h["archive"]
    return at[0], [*at, *times(h)]


def aa(server: ServerProcess, pv: str, since: float, until: float) -> tuple[Any, Any]:
    """The Archiver Appliance API's getData.json of `pv`, and the response's headers (looked up
    by name in any case)."""
    fmt = "%Y-%m-%dT%H:%M:%S"
    start, end = time.strftime(fmt, time.gmtime(since)), time.strftime(fmt, time.gmtime(until))
    q = urllib.parse.urlencode({"pv": pv, "from": f"{start}Z", "to": f"{end}.999Z"})
    with urllib.request.urlopen(f"{server.url}/retrieval/data/getData.json?{q}", timeout=60) as r:
        return json.loads(r.read()), r.headers


def backfill(server: ServerProcess, cid: str, seconds: float) -> tuple[list[wire.History],
                                                                      wire.Snapshot]:  # fmt: skip
    """A subscription of `cid` with `backfill`, attached: its HISTORY messages, then its
    SNAPSHOT."""

    async def attach() -> tuple[list[wire.History], wire.Snapshot]:
        token = stream_token(server, [cid], backfill=seconds)
        s = await RawStream.connect(server.ws_url)
        try:
            await s.send(16, 1, token)
            rows: list[wire.History] = []
            while True:
                m = await s.recv(60)
                if isinstance(m, wire.History):
                    rows.append(m)
                elif isinstance(m, wire.Snapshot):
                    return rows, m
        finally:
            await s.close()

    return asyncio.run(attach())


# --- a second pvwire as the archive ---------------------------------------------------------


def test_graphql_history_is_b_s_rows_then_a_s_exactly(servers: Servers) -> None:
    b_rows = times(history(servers.b, COUNTER, 0))
    joined = history(servers.a, COUNTER, b_rows[0] / NS)
    note = joined["archive"]
    assert note["state"] == "JOINED" and joined["resolution"] == 0
    got = times(joined)
    seam, mine = a_own(servers.a, COUNTER)
    b_now = [t for t in times(history(servers.b, COUNTER, 0)) if t <= got[-1]]
    assert any(t >= seam for t in b_now), "B holds rows past the seam: the overlap is real"
    assert got == [t for t in b_now if t < seam] + [t for t in mine if t <= got[-1]]
    assert note["rows"] == len([t for t in b_now if t < seam])
    values = joined["value"]
    assert values == sorted(values)  # one counter, in order across the seam


def test_graphql_binned_history_counts_each_update_once(servers: Servers) -> None:
    b_rows = times(history(servers.b, COUNTER, 0))
    joined = history(servers.a, COUNTER, b_rows[0] / NS, 4)
    width = round(joined["resolution"] * NS)
    seam = round(joined["archive"]["until"] * NS)
    assert joined["archive"]["state"] == "JOINED" and width >= 10 * NS and seam % width == 0
    starts = times(joined)
    assert all(b - a == width for a, b in itertools.pairwise(starts))  # every bin
    b_now = times(history(servers.b, COUNTER, 0))
    _, mine = a_own(servers.a, COUNTER)
    for start, count in list(zip(starts, joined["count"], strict=True))[:-1]:  # the last grows
        source = b_now if start < seam else mine
        assert count == len([t for t in source if start <= t < start + width]), start


def test_a_backfill_sends_b_s_rows_then_a_s_then_the_snapshot(servers: Servers) -> None:
    first = times(history(servers.b, COUNTER, 0))[0]
    seconds = time.time() - first / NS + 1

    rows, snap = backfill(servers.a, COUNTER, seconds)
    got = [int(t) for r in rows for t in r.t]
    entry = snap.entries[0]
    assert entry.seconds is not None and entry.nanoseconds is not None
    current = entry.seconds * NS + entry.nanoseconds
    assert got == sorted(set(got)) and got[-1] < current  # none twice; then the snapshot's
    assert not any(bool(g) for r in rows for g in r.gap)
    b_now = times(history(servers.b, COUNTER, 0))
    a_first, mine = a_own(servers.a, COUNTER)
    assert got == [t for t in b_now if first <= t < a_first] + [t for t in mine if t < current]


def test_the_archiver_appliance_api_joins_raw_and_binned(servers: Servers) -> None:
    first = int(times(history(servers.b, COUNTER, 0))[0] / NS)
    until = time.time() - 2  # a range that is over: both reads see the same samples
    raw, headers = aa(servers.a, "PVW:COUNTER", first, until)
    secs = [r["secs"] * NS + r["nanos"] for r in raw[0]["data"]]
    assert headers.get("Pvwire-Archive") is None and secs == sorted(set(secs))
    vals = [r["val"] for r in raw[0]["data"]]
    assert vals == sorted(vals)
    counts, _ = aa(servers.a, "count_1(PVW:COUNTER)", first, until)
    inside = [t for t in secs if t >= first * NS]  # not the one before `from`, which it adds
    total = sum(r["val"] for r in counts[0]["data"] if r["secs"] >= first)
    assert total == len(inside)


# --- tests/archiver.py, written with the PyPI client's protobuf classes -------------------


def test_the_published_format_s_samples_then_a_s_rows(servers: Servers) -> None:
    start = servers.pb.pvs["PVW:COUNTER"].start  # type: ignore[union-attr]
    since = (time.time_ns() - 120 * NS) // NS * NS
    joined = history(servers.a, PB_COUNTER, since / NS, 5000)
    note = joined["archive"]
    assert note["state"] == "JOINED" and joined["resolution"] == 0, (note, servers.pb.asked)
    seam = round(note["until"] * NS)
    got = times(joined)
    step = NS // 10
    held = [
        start + k * step for k in range((since - start) // step - 1, (seam - start) // step + 1)
    ]
    expected = [t for t in held if t < seam and t >= since - step]  # from the one before since
    assert got[: note["rows"]] == expected and joined["value"][: note["rows"]] == [
        float((t - start) // step) for t in expected
    ]
    assert seam == a_own(servers.a, PB_COUNTER)[0] or abs(seam - got[note["rows"]]) < 2_000
    assert got[note["rows"] :] == [t for t in a_own(servers.a, PB_COUNTER)[1] if t <= got[-1]]


def test_the_published_format_s_bins_then_a_s_and_a_repeated_plot_is_cached(
    servers: Servers,
) -> None:
    held_from = servers.pb.pvs["PVW:COUNTER"].start  # type: ignore[union-attr]
    since = (time.time() - 500) // 300 * 300
    asked = sum(servers.pb.requests.values())
    joined = history(servers.a, PB_COUNTER, since, 20)
    again = history(servers.a, PB_COUNTER, since, 20)
    assert sum(servers.pb.requests.values()) == asked + 1  # the second plot: from the cache
    assert (
        again["seconds"][: joined["archive"]["rows"]]
        == joined["seconds"][: joined["archive"]["rows"]]
    )
    width = round(joined["resolution"] * NS)
    seam = round(joined["archive"]["until"] * NS)
    starts = times(joined)
    for start, count in list(zip(starts, joined["count"], strict=True))[:-1]:
        if held_from <= start and start + width <= seam:  # the archive's: every 100 ms
            assert count == width // (NS // 10), start
    _, mine = a_own(servers.a, PB_COUNTER)
    # A's points before the seam are in the archive's last bin (it holds them too), not again.
    assert sum(joined["count"][joined["archive"]["rows"] : -1]) == len(
        [t for t in mine if seam <= t < starts[-1]]
    )


def test_a_long_backfill_s_archive_part_is_bins_that_fit_its_rows(servers: Servers) -> None:
    """Ten minutes at 10 Hz in the archive (6,000 samples) for a backfill of an hour: bins wide
    enough for archive_backfill_rows, then A's own rows."""

    rows, _ = backfill(servers.a, PB_COUNTER, 3600)
    archive = [r for r in rows if r.resolution >= NS]
    assert archive, [r.resolution for r in rows]
    n = sum(len(r.t) for r in archive)
    assert 0 < n <= integer("archive_backfill_rows")
    starts = [int(t) for r in archive for t in r.t]
    assert starts == sorted(set(starts)) and all(t % archive[0].resolution == 0 for t in starts)
    after = [int(t) for r in rows[len(archive) :] for t in r.t]
    assert after, [(r.resolution, len(r.t), r.gap[-1], r.reason) for r in rows]
    # A's rows after the archive's: each bin of it whole before them. When A's first row lies
    # in the bin of the value the snapshot carries (A recorded less than a bin), that bin's
    # archived samples are in no row: a gap row at its start says so.
    width = archive[0].resolution
    whole = [int(t) for r in archive for t, g in zip(r.t, r.gap, strict=True) if not g]
    assert whole and whole[-1] + width <= after[0] and after[0] > starts[-1]
    assert starts[-1] == whole[-1] or (starts[-1] == whole[-1] + width and archive[-1].gap[-1])


def test_the_python_client_history_spans_the_archive_and_the_recent_past(
    servers: Servers,
) -> None:
    async def read() -> tuple[str, str | None, int, str, str | None]:
        async with Client(servers.a.url) as pv:
            rows = await pv.history(PB_COUNTER, since=time.time() - 60)
            lost = await pv.history("ca://DOWN:X", since=time.time() - 60)
            assert rows.archive is not None and lost.archive is not None
            return (rows.archive.state, rows.archive_missing, rows.archive.rows, lost.describe(),
                    lost.archive_missing)  # fmt: skip

    state, missing, n, lost, why = asyncio.run(read())
    assert state == "JOINED" and missing is None and n > 0
    assert why is not None and "cannot be reached" in why and "part is missing" in lost


# --- archivers that fail ------------------------------------------------------------------


def bystander(a: ServerProcess) -> tuple[int, str]:
    """Another client: a stream's DATA frames (three), and a GraphQL query's answer."""

    async def stream() -> int:
        s = await RawStream.connect(a.ws_url)
        try:
            await s.attach(stream_token(a, ["sim://counter?rate=50"]))
            return len([await s.next_data(30) for _ in range(3)])
        finally:
            await s.close()

    frames = asyncio.run(stream())
    return frames, str(a.graphql("{ server { version } }")["data"]["server"]["version"])


@pytest.mark.parametrize(
    ("cid", "says"),
    [
        ("ca://DOWN:X", "cannot be reached"),
        ("ca://GARBAGE:X", "malformed"),
        ("ca://BIG:X", "past pvwire's bounds"),
        ("ca://ERROR:X", "HTTP 500"),
    ],
)
def test_a_failing_archiver_gives_the_marker(servers: Servers, cid: str, says: str) -> None:
    """Each failure is the recent part with the marker, and another client is served beside it."""
    since = time.time() - 60
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        failing = pool.submit(history, servers.a, cid, since)
        other = pool.submit(bystander, servers.a)
        h = failing.result(timeout=60)  # bounds, not measures
        frames, version = other.result(timeout=60)
    assert h["archive"]["state"] == "MISSING" and says in h["archive"]["reason"]
    assert h["gap"] == [True] and h["seconds"] == [int(since)]
    assert frames == 3 and version


def test_a_slow_archiver_costs_its_deadline_and_stalls_no_one(servers: Servers) -> None:
    """While A waits for the trickling archiver, another client's queries and stream go on."""

    async def streaming(stop: concurrent.futures.Future[Any]) -> int:
        token = stream_token(servers.a, ["sim://counter?rate=50"])
        s = await RawStream.connect(servers.a.ws_url)
        frames = 0
        try:
            await s.attach(token)
            while not stop.done():
                await s.next_data(30)
                frames += 1
        finally:
            await s.close()
        return frames

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(history, servers.a, "ca://SLOW:X", time.time() - 60)
        stream = pool.submit(asyncio.run, streaming(slow))
        answered = servers.a.graphql("{ server { version } }")
        recent = history(servers.a, COUNTER, time.time() - 1)
        assert not slow.done()  # both answered while the slow read was still waiting
        assert answered["data"]["server"]["version"] and recent["archive"]["state"] == "NOT_NEEDED"
        h = slow.result(timeout=60)  # a bound: the trickle alone would last 500 s
        assert stream.result(timeout=60) > 0
    assert h["archive"]["state"] == "MISSING"
    assert f"did not answer within {TIMEOUT_S:g} s" in h["archive"]["reason"]
    again = history(servers.a, "ca://SLOW:Y", time.time() - 60)  # left alone now: at once
    assert "archive_retry_s" in again["archive"]["reason"]
    assert servers.failing["slow"].requests["SLOW:Y"] == 0


def test_a_backfill_s_missing_archive_part_is_a_gap_row_with_its_reason(
    servers: Servers,
) -> None:
    rows, snap = backfill(servers.a, "sim://ramp", 30)
    assert rows[0].gap.tolist() == [1] and rows[0].reason is not None
    assert "did not answer within" in rows[0].reason
    assert snap.entries[0].value is not None


def test_the_archiver_appliance_api_says_which_parts_are_missing(servers: Servers) -> None:
    now = time.time()
    doc, headers = aa(servers.a, "GARBAGE:Y", now - 60, now)
    assert "missing for 1 of 1 PVs" in headers.get("Pvwire-Archive", "")
    assert doc[0]["meta"]["pvwireArchive"].startswith("missing: the archiver")
    assert doc[0]["data"] == []


def test_the_reads_are_counted_by_outcome(servers: Servers) -> None:
    history(servers.a, "ca://GARBAGE:Z", time.time() - 60)
    text = servers.a.metrics()
    lines = [x for x in text.splitlines() if x.startswith("pvwire_archive_reads_total{")]
    counts = {x.split('outcome="')[1].split('"')[0]: float(x.rsplit(" ", 1)[1]) for x in lines}
    assert counts["malformed"] >= 1 and counts["read"] >= 1
    assert set(counts) >= {"timeout", "down", "too_large", "http_error", "skipped"}
    assert np.isfinite(counts["cached"])
