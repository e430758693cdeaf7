"""Each bound of the Archiver Appliance API (limits.py, `aa_*`), exceeded, answered with its HTTP
error before any work; the access rules; a client that stops reading; in process, over httpx's
ASGI transport, with the server's own app serving a recorded sim channel."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from pvwire.aa import endpoint
from pvwire.aa.pb import PbReader, Sample
from pvwire.app import create_app
from pvwire.config import Settings
from pvwire.limits import integer
from pvwire.upstream.sim import SimBackend, SimLimits

from tests.eventually import eventually_async

DATA = "/retrieval/data/getData.json"


def app(tmp_path: Path, **settings: object) -> FastAPI:
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[rule]]\nchannels = "sim://noise*"\naccess = "NONE"\n'
        '[[rule]]\nchannels = "*"\naccess = "READ"\n'
    )
    s = Settings(history_channels=["sim://counter", "sim://noise"], access_rules=str(rules),
                 stall_timeout_s=0.5, **settings)  # type: ignore[arg-type]  # fmt: skip
    return create_app(s, backends={"sim": SimBackend(SimLimits())})


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    application = app(tmp_path)
    try:
        async with application.router.lifespan_context(application):
            transport = httpx.ASGITransport(app=application)
            async with httpx.AsyncClient(transport=transport, base_url="http://pvwire") as c:
                await eventually_async(lambda: recorded(c, 5), "sim://counter recorded")
                yield application, c
    finally:
        gc.unfreeze()  # what serving froze: this process goes on testing


async def recorded(c: httpx.AsyncClient, n: int) -> bool:
    r = await c.get(DATA, params={"pv": "sim://counter"})
    return r.status_code == 200 and len(r.json()[0]["data"]) >= n


async def test_pvs_per_request(served: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, c = served
    most = integer("aa_max_pvs")
    ok = await c.get("/retrieval/data/getDataForPVs.json", params={"pv": ["sim://counter"] * 2})
    assert ok.status_code == 200 and len(ok.json()) == 2
    r = await c.get(
        "/retrieval/data/getDataForPVs.json", params={"pv": ["sim://counter"] * (most + 1)}
    )
    assert r.status_code == 400 and "aa_max_pvs" in r.text
    at = await c.post("/retrieval/data/getDataAtTime", json=["sim://counter"] * (most + 1))
    assert at.status_code == 400 and "aa_max_pvs" in at.text


async def test_samples_per_answer_are_counted_before_anything_is_read(
    served: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    _, c = served
    day = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}
    fits = await c.get(DATA, params={"pv": "meanSample_1(sim://counter)", **day})
    assert fits.status_code == 200  # no-fill bins: at most one per row held
    # Filled 1 s bins over a day are 86,400 samples; twice that is past the bound.
    two = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-03T00:00:00Z"}
    r = await c.get(DATA, params={"pv": "mean_1(sim://counter)", **two})
    assert r.status_code == 400 and "aa_max_points" in r.text and "172,8" in r.text


async def test_time_range(served: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, c = served
    r = await c.get(DATA, params={"pv": "sim://counter", "from": "2000-01-01T00:00:00Z",
                                  "to": "2026-01-01T00:00:00Z"})  # fmt: skip
    assert r.status_code == 400 and "aa_max_range_s" in r.text
    bad = await c.get(DATA, params={"pv": "sim://counter", "from": "2026-01-01 00:00:00 02:00"})
    assert bad.status_code == 400 and "%2B" in bad.text
    backwards = await c.get(DATA, params={"pv": "sim://counter", "from": "2026-01-02T00:00:00Z",
                                          "to": "2026-01-01T00:00:00Z"})  # fmt: skip
    assert backwards.status_code == 400 and "before start" in backwards.text
    # Year 0 once its offset is applied: refused as a time, not an error of the server.
    year0 = await c.get(DATA, params={"pv": "sim://counter", "from": "0001-01-01T00:00:00+01:00",
                                      "to": "0001-01-02T00:00:00Z"})  # fmt: skip
    assert year0.status_code == 400 and "years 1 to 9999" in year0.text


async def test_pattern_length_and_a_regex_that_backtracks(
    served: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    _, c = served
    most = integer("aa_max_pattern")
    r = await c.get("/retrieval/bpl/getMatchingPVs", params={"regex": "a" * (most + 1)})
    assert r.status_code == 400 and "aa_max_pattern" in r.text
    # Exponential for a backtracking engine over a long name; RE2 answers at once.
    evil = await c.get("/retrieval/bpl/getMatchingPVs", params={"regex": "(s|si|sim|:|/)+x"})
    assert evil.status_code == 200 and evil.json() == []
    bad = await c.get("/retrieval/bpl/getMatchingPVs", params={"regex": "(unclosed"})
    assert bad.status_code == 400


async def test_read_rules_apply_to_data_matching_and_status(
    served: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    _, c = served
    r = await c.get(DATA, params={"pv": "sim://noise"})
    assert r.status_code == 403 and "may not read sim://noise" in r.text
    pvs = {"pv": ["sim://counter", "sim://noise"]}
    both = await c.get("/retrieval/data/getDataForPVs.json", params=pvs)
    assert both.status_code == 403
    found = (await c.get("/retrieval/bpl/getMatchingPVs", params={"pv": "sim://*"})).json()
    assert "sim://counter" in found and not [f for f in found if f.startswith("sim://noise")]
    status = (await c.get("/retrieval/bpl/getPVStatus", params={"pv": "sim://noise"})).json()
    assert status == [{"pvName": "sim://noise", "status": "Not being archived"}]
    at = (
        await c.post("/retrieval/data/getDataAtTime", json=["sim://noise", "sim://counter"])
    ).json()
    assert list(at) == ["sim://counter"]


async def test_samples_per_second_per_identity(tmp_path: Path) -> None:
    application = app(tmp_path, aa_points_per_s=2.0)  # bursts of 4
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://pvwire") as c:
        first = await c.post("/retrieval/data/getDataAtTime", json=["sim://counter"] * 3)
        assert first.status_code == 200
        r = await c.post("/retrieval/data/getDataAtTime", json=["sim://counter"] * 3)
        assert r.status_code == 429 and "aa_points_per_s" in r.text


async def test_the_raw_answer_is_chunked_unless_donotchunk(
    served: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    _, c = served
    raw = "/retrieval/data/getData.raw"
    chunked = await c.get(raw, params={"pv": "sim://counter"})
    whole = await c.get(raw, params={"pv": "sim://counter", "donotchunk": ""})
    assert "content-length" not in chunked.headers
    assert int(whole.headers["content-length"]) == len(whole.content)
    for body in (chunked.content, whole.content):
        samples = [e for e in PbReader().feed(body) if isinstance(e, Sample)]
        assert len(samples) >= 5


async def test_a_client_that_stops_reading_is_dropped_after_the_stall_timeout(
    served: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    """A body whose pieces wait on a send that never completes: the answer gives up after
    stall_timeout_s with what it made so far, never more (the pieces are made as sent)."""
    made: list[int] = []

    def pieces() -> object:
        for i in range(1000):
            made.append(i)
            yield b"x" * 65536

    response = endpoint.Pieces(pieces(), "text/plain", stall_s=0.2)  # type: ignore[arg-type]
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)
        if len(sent) > 2:  # the start and one piece go; then the socket is full
            await asyncio.Event().wait()

    async def receive() -> dict[str, object]:
        await asyncio.Event().wait()
        return {}

    await asyncio.wait_for(response({"type": "http"}, receive, send), 10)  # type: ignore[arg-type]
    assert len(made) == 2 and len(sent) == 3


CATALOGUED = 1_000
STATUS = "/retrieval/bpl/getPVStatus"


@pytest.fixture
async def catalogued(tmp_path: Path) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app with a catalogue of CATALOGUED ids, samples at 20 times their count per
    second (bursts of 40): a pattern over them costs 1/40 of a burst."""
    ids = [f"sim://value/cat{i:04d}" for i in range(CATALOGUED)]
    application = app(tmp_path, catalogue=ids, aa_points_per_s=20.0 * CATALOGUED)
    transport = httpx.ASGITransport(app=application)
    try:
        async with (
            application.router.lifespan_context(application),
            httpx.AsyncClient(transport=transport, base_url="http://pvwire") as c,
        ):
            yield application, c
    finally:
        gc.unfreeze()


async def test_status_names_are_bounded_before_any_is_matched(
    catalogued: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    _, c = catalogued
    most = integer("aa_max_pvs")
    globs = [f"nothing{i}*" for i in range(most + 1)]
    r = await c.post(STATUS, json=globs)
    assert r.status_code == 400 and "aa_max_pvs" in r.text
    big = integer("aa_max_names_bytes")
    body = json.dumps(["x" * (big // 10)] * 11).encode()
    r = await c.post(STATUS, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "aa_max_names_bytes" in r.text

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as it is read
        for _ in range(11):
            yield json.dumps("x" * (big // 10)).encode()

    r = await c.post(STATUS, content=chunked(), headers={"content-type": "text/plain"})
    assert r.status_code == 413 and "aa_max_names_bytes" in r.text
    # In a form, as `pv` parameters are (a URL that long is refused before pvwire sees it).
    form = {"pv": ",".join(["y" * 1000] * (big // 1000 + 1))}
    r = await c.post(STATUS, data=form)
    assert r.status_code == 413 and "aa_max_names_bytes" in r.text


async def test_a_glob_matching_past_the_bound_stops_there(
    catalogued: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    _, c = catalogued
    r = await c.get(STATUS, params={"pv": "sim://value/cat*"})
    assert r.status_code == 400 and "501 or more PVs" in r.text
    fits = (await c.get(STATUS, params={"pv": "sim://value/cat*", "limit": "3"})).json()
    assert len(fits) == 3 and all(s["pvName"].startswith("sim://value/cat") for s in fits)
    ten = (await c.get(STATUS, params={"pv": "sim://value/cat000?"})).json()
    assert [s["pvName"] for s in ten] == [f"sim://value/cat000{i}" for i in range(10)]
    # A glob's other characters are themselves, as the Archiver Appliance's globs have them.
    dot = await c.get(STATUS, params={"pv": "sim://value.cat000?"})
    assert dot.json() == []


async def test_each_pattern_costs_the_ids_it_is_matched_against(
    catalogued: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    """A burst is 40 catalogues: a few globs fit, fifty do not, however few names they ask."""
    _, c = catalogued
    few = await c.post(STATUS, json=[f"nothing{i}*" for i in range(3)])
    assert few.status_code == 200 and few.json() == []
    many = await c.post(STATUS, json=[f"nothing{i}*" for i in range(50)])
    assert many.status_code == 429 and "aa_points_per_s" in many.text


async def test_an_unknown_pv_is_answered_without_listing_the_catalogue(
    catalogued: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    application, c = catalogued
    hub = application.state.hub
    listed: list[object] = []
    known_ids = hub.known_ids

    def spy(*args: object) -> object:
        listed.append(args)
        return known_ids(*args)

    hub.known_ids = spy
    r = await c.get(DATA, params={"pv": "sim://value/nowhere"})
    assert r.status_code == 404 and "Unable to find typeinfo" in r.text
    at = await c.post("/retrieval/data/getDataAtTime", json=["sim://value/nowhere"])
    assert at.status_code == 200 and at.json() == {}
    catalogued_one = await c.get(DATA, params={"pv": "sim://value/cat0007"})
    assert catalogued_one.status_code == 200
    assert listed == []
    found = await c.get("/retrieval/bpl/getMatchingPVs", params={"pv": "sim://value/cat000*"})
    assert len(found.json()) == 10 and len(listed) == 1  # the spy sees what lists them
