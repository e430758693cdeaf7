"""One anonymous client flooding the Archiver Appliance API's pattern routes (`getPVStatus`,
`getMatchingPVs`) of the real server, over real HTTP, with a catalogue of CATALOGUED ids: past
its names' bounds it is refused before anything is matched; within them its matching is charged
to its rate a slice at a time, and a bystander's `/healthz` is answered while it is in flight.
(A POST of 3,500 distinct 1,000-character globs once held the event loop for 17 s.)"""

from __future__ import annotations

import http.client
import json
import random
import string
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pvwire.limits import integer

from tests.server_process import ServerProcess, server_args_for_tests

CATALOGUED = 20_000
FLOODER = ("127.0.0.61", 0)  # all of 127/8 is loopback: its rate is not the other tests' own
# Bursts of 200,000 samples: ten patterns over the catalogue, about a second of matching.
RATE = 100_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    catalogue = Path(tmp_path_factory.mktemp("aa_flood")) / "catalogue.txt"
    catalogue.write_text(
        "".join(f"ca://FLOOD:SR{i % 40:02d}:PV{i:05d}\n" for i in range(CATALOGUED))
    )
    args = server_args_for_tests(["--catalogue-file", str(catalogue)])
    with ServerProcess(*args, env={"PVWIRE_AA_POINTS_PER_S": str(RATE)}) as proc:
        yield proc


def globs(n: int, length: int, seed: int) -> list[str]:
    """`n` distinct globs of `length` characters that match nothing."""
    rnd = random.Random(seed)
    return ["".join(rnd.choices(string.ascii_letters, k=length - 1)) + "*" for _ in range(n)]


def post(server: ServerProcess, path: str, body: bytes) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.request("POST", path, body, {"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


STATUS = "/retrieval/bpl/getPVStatus"


def test_a_flood_past_the_names_bounds_is_refused_before_it_is_matched(
    server: ServerProcess,
) -> None:
    huge = json.dumps(globs(3_500, 1_000, 1)).encode()  # 3.5 MB
    assert len(huge) > integer("aa_max_names_bytes")
    status, text = post(server, STATUS, huge)
    assert status == 413 and "aa_max_names_bytes" in text
    many = json.dumps(globs(3_500, 100, 2)).encode()  # within the bytes, past the count
    assert len(many) < integer("aa_max_names_bytes")
    status, text = post(server, STATUS, many)
    assert status == 400 and "aa_max_pvs" in text


def test_a_flood_within_the_bounds_costs_its_rate_and_a_bystander_is_answered_meanwhile(
    server: ServerProcess,
) -> None:
    """500 globs of 1,000 characters: 10 million ids to match, 50 bursts. It is answered 429
    once its burst is spent; meanwhile the bystander's `/healthz` is answered, each of them
    before the flood's answer has come."""
    flood = json.dumps(globs(integer("aa_max_pvs"), 1_000, 3)).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, 120, FLOODER)
    sent, answered = threading.Event(), threading.Event()
    got: list[tuple[int, str]] = []

    def flooder() -> None:
        try:
            conn.request("POST", STATUS, flood, {"content-type": "application/json"})
            sent.set()
            r = conn.getresponse()
            got.append((r.status, r.read().decode()))
        finally:
            sent.set()
            answered.set()
            conn.close()

    thread = threading.Thread(target=flooder)
    thread.start()
    try:
        assert sent.wait(120)
        in_flight = 0
        while not answered.is_set():
            bystander = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
            try:
                bystander.request("GET", "/healthz")
                r = bystander.getresponse()
                assert r.status == 200
                r.read()
            finally:
                bystander.close()
            in_flight += not answered.is_set()
    finally:
        thread.join(120)
    assert got and got[0][0] == 429 and "aa_points_per_s" in got[0][1], got
    assert in_flight >= 1


def test_a_regex_over_the_catalogue_is_answered_and_costs_the_ids(server: ServerProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.request("GET", "/retrieval/bpl/getMatchingPVs?regex=FLOOD:SR07:.*&limit=-1")
        r = conn.getresponse()
        found = json.loads(r.read())
    finally:
        conn.close()
    assert r.status == 200 and len(found) == CATALOGUED // 40
    assert found == sorted(found) and found[0] == "FLOOD:SR07:PV00007"
