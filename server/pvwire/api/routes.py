"""The small HTTP routes: the probes and metrics, the sign-in settings and status page, and the
demo page at `/`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

from ..config import Settings
from ..core.hub import Hub
from ..core.mjpeg import MjpegStats
from ..limits import number
from ..worker import WorkerIdentity
from .connections import ConnectionStats
from .metrics import render_metrics

__all__ = ["STATIC", "mount_page", "pages", "probes", "readiness"]

STATIC = Path(__file__).parent.parent / "static"
# The files of the status page (clients/ts/scripts/build-page.mjs), the only ones `/status/` serves.
STATUS_ASSETS = frozenset({"app.css", "status.css", "status.js", "status.js.map"})
# A loop this late cannot serve anyone (DESIGN.md section 9).
MAX_LOOP_LAG_READY = number("ready_max_loop_lag_s")


def probes(
    hub: Hub,
    worker: WorkerIdentity,
    mjpeg_stats: Callable[[], MjpegStats],
    connection_stats: Callable[[], ConnectionStats] = ConnectionStats,
) -> APIRouter:
    """/healthz (the process answers), /readyz (it can serve) and /metrics."""
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        body = readiness(hub)
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @router.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = render_metrics(hub.snapshot(detail=False), worker, mjpeg_stats(), connection_stats())
        # Prometheus keeps its connection to a target open, so under --workers N every scrape
        # reached the worker that accepted the first one and the others were never seen:
        # closed after each answer, the next scrape goes to whichever worker the kernel picks.
        headers = {"Connection": "close"} if worker.workers > 1 else None
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4", headers=headers)

    return router


def readiness(hub: Hub) -> dict[str, Any]:
    """What `/readyz` answers, its `ready` deciding 200 or 503; the status PVs' `ready` is it."""
    lag = hub.loop_lag
    # A scheme this process cannot serve (pva:// without its compiled module) leaves the
    # others ready; it is named here, with the reason, for whoever looks at the probe.
    return {
        # From SIGTERM on, not ready: load balancers stop sending clients here (core/drain.py).
        "ready": lag < MAX_LOOP_LAG_READY and not hub.draining,
        "loop_lag_s": lag,
        "channels": hub.channel_count,
        "unavailable": hub.unavailable_schemes(),
        "draining": hub.draining,
    }


def pages(settings: Settings) -> APIRouter:
    """/status (the status page) and /auth.json (where the page signs in)."""
    router = APIRouter()

    @router.get("/status", response_model=None)
    async def status_page() -> FileResponse | PlainTextResponse:
        page = STATIC / "status.html"
        if page.is_file():
            return FileResponse(page)
        return PlainTextResponse("the status page is not built (run `make tsbuild`)", 404)

    @router.get("/status/{asset}", response_model=None)
    async def status_asset(asset: str) -> FileResponse | PlainTextResponse:
        """What the status page loads, under its own path (status.html names them so): a
        proxy that routes only pvwire's paths (`/status*`, not `/`) serves the whole page."""
        if asset not in STATUS_ASSETS or not (STATIC / asset).is_file():
            return PlainTextResponse(f"no status page asset {asset!r}", 404)
        return FileResponse(STATIC / asset)

    @router.get("/auth.json")
    async def auth_config() -> dict[str, str]:
        """Where to sign in: the provider, and the public client the page uses (PKCE); {} for
        none. `pvwire login` reads it too."""
        found = {"issuer": settings.oidc_issuer, "clientId": settings.oidc_client_id}
        return {k: v for k, v in found.items() if v}

    return router


def mount_page(app: FastAPI) -> None:
    """The demo page at `/`, or a line saying it is not built. Mounted last: it answers every
    path no other route took."""
    if (STATIC / "index.html").is_file():
        app.mount("/", StaticFiles(directory=STATIC, html=True), name="page")
        return

    @app.get("/")
    async def no_page() -> PlainTextResponse:
        return PlainTextResponse(
            "pvwire is running; the demo page is not built (run `make tsbuild`).\n"
            "GraphQL: /graphql   stream: /stream   metrics: /metrics\n"
        )
