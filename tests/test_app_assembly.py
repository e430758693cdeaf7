"""`create_app` as assembled from api/: every route answers where it did, the body limit is the
outermost middleware, the page is mounted last, and an authentication refusal is answered the
same way on every route. In process, over httpx's ASGI transport (no socket needed)."""

from __future__ import annotations

import gc
import re
import urllib.parse
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from pvwire.api.body_limit import BodyLimit
from pvwire.api.paced_bodies import PacedBodies
from pvwire.app import GC_THRESHOLDS, create_app
from pvwire.config import Settings
from pvwire.upstream.loc import LocBackend

ORIGIN = "https://page.example.org"
QUERY = b'{"query": "{ server { version } }"}'
JSON = {"content-type": "application/json"}


def assembled() -> FastAPI:
    settings = Settings(
        cors_origins=[ORIGIN],
        allowed_origins=[ORIGIN],
        oidc_issuer="https://sso.example.org/realms/c",
        oidc_client_id="pvwire-page",
        jwt_audience="pvwire",
        max_request_bytes=64 * 1024,
    )
    return create_app(settings, backends={"loc": LocBackend()})


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=assembled())
    async with httpx.AsyncClient(transport=transport, base_url="http://pvwire") as c:
        yield c


def test_the_body_limit_is_outermost_and_the_page_last() -> None:
    app = assembled()
    classes: list[object] = [m.cls for m in app.user_middleware]
    assert classes == [BodyLimit, PacedBodies, CORSMiddleware]
    assert getattr(app.router.routes[-1], "name", None) in ("page", "no_page")


@pytest.mark.parametrize(
    ("method", "path", "status", "media_type"),
    [
        ("GET", "/healthz", 200, "application/json"),
        ("GET", "/readyz", 200, "application/json"),
        ("GET", "/metrics", 200, "text/plain; version=0.0.4"),
        ("GET", "/auth.json", 200, "application/json"),
        ("GET", "/pvws/js/pvws.js", 200, "application/javascript"),
        ("GET", "/mjpeg/loc://x?fps=fast", 400, "text/plain"),
        ("POST", "/healthz", 405, "application/json"),
        ("GET", "/no/such/page", 404, None),
    ],
)
async def test_each_route_answers_at_its_path(
    client: httpx.AsyncClient, method: str, path: str, status: int, media_type: str | None
) -> None:
    r = await client.request(method, path)
    assert r.status_code == status, r.text
    if media_type is not None:
        assert r.headers["content-type"].startswith(media_type)


async def test_probes_and_sign_in_settings(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "alive"}
    ready = (await client.get("/readyz")).json()
    assert ready["ready"] is True and ready["channels"] == 0
    assert (await client.get("/auth.json")).json() == {
        "issuer": "https://sso.example.org/realms/c",
        "clientId": "pvwire-page",
    }
    assert "pvwire_server_info" in (await client.get("/metrics")).text


async def test_graphql_answers_and_refuses_as_the_control_plane(
    client: httpx.AsyncClient,
) -> None:
    ok = await client.post("/graphql", content=QUERY, headers=JSON)
    assert ok.status_code == 200 and ok.json()["data"]["server"]["version"]
    forged = await client.post(
        "/graphql", content=QUERY, headers={**JSON, "authorization": "Bearer not-a-jwt"}
    )
    assert forged.status_code == 401
    assert forged.headers["www-authenticate"] == 'Bearer realm="pvwire"'
    assert forged.json()["errors"][0]["extensions"]["code"]
    foreign = await client.post(
        "/graphql", content=QUERY, headers={**JSON, "origin": "https://elsewhere.example.org"}
    )
    assert foreign.status_code == 403 and "www-authenticate" not in foreign.headers
    assert foreign.json()["errors"][0]["extensions"]["code"] == "ORIGIN_NOT_ALLOWED"


async def test_a_body_over_the_bound_is_refused_before_cors_or_graphql(
    client: httpx.AsyncClient,
) -> None:
    big = b'{"query": "' + b" " * (65 * 1024) + b'{ server { version } }"}'
    r = await client.post("/graphql", content=big, headers={**JSON, "origin": ORIGIN})
    assert r.status_code == 413
    assert r.json()["errors"][0]["extensions"]["code"] == "TOO_LARGE"
    # Outermost: CORS never saw the request, so the refusal carries none of its headers.
    assert "access-control-allow-origin" not in r.headers
    allowed = await client.post("/graphql", content=QUERY, headers={**JSON, "origin": ORIGIN})
    assert allowed.headers["access-control-allow-origin"] == ORIGIN


async def test_serving_sets_the_collector_s_thresholds() -> None:
    """Young collections rare enough that a tick's short-lived bodies die young: at the default
    thresholds, full collections paused the loop 40-285 ms every 2-3 s (app.py)."""
    app = assembled()
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        async with app.router.lifespan_context(app):
            assert gc.get_threshold() == GC_THRESHOLDS != (700, 10, 10)
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()  # what serving froze: this process goes on testing


async def test_the_status_page_loads_what_it_needs_from_under_its_own_path(
    client: httpx.AsyncClient,
) -> None:
    """A proxy that routes only pvwire's paths (`/status*`, not the demo page at `/`) serves the
    whole status page."""
    page = await client.get("/status")
    assert page.status_code == 200, page.text
    found = re.findall(r'(?:href|src)="([^"]+)"', page.text)
    refs = [r for r in found if not r.startswith("data:")]
    assert len(refs) == 3, refs  # two style sheets and the script
    for ref in refs:
        url = urllib.parse.urljoin("http://pvwire/status", ref)
        assert urllib.parse.urlsplit(url).path.startswith("/status/"), ref
        got = await client.get(url)
        assert got.status_code == 200 and got.content, (ref, got.status_code)
    assert (await client.get("/status/index.html")).status_code == 404  # its own files only
