"""The ASGI application: GraphQL at /graphql, the stream at /stream, probes, metrics, the page."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import signal
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from cross_web import HTTPException
from fastapi import FastAPI, Request, WebSocket
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from strawberry.fastapi import GraphQLRouter

from . import __version__
from .access.identity import Authenticator, AuthError, JwtSettings
from .access.ratelimit import RateLimiter
from .access.refusals import RefusalLog
from .api.body_limit import BodyLimit
from .api.graphiql_offline import ASSETS, ASSETS_PATH, offline_page
from .api.graphql import make_schema
from .api.metrics import render_metrics
from .api.mjpeg import MjpegEndpoint
from .api.query_cost import ValueBudget
from .api.stream import serve_stream
from .config import Settings
from .core.hub import Hub
from .limits import number
from .pvws.endpoint import PvwsEndpoint
from .pvws.scripts import router as pvws_js_router
from .upstream.base import Backend
from .wire.tokens import TokenSigner
from .worker import WorkerIdentity

__all__ = ["create_app", "make_backends"]

STATIC = Path(__file__).parent / "static"
SETTINGS_ENV = "PVWIRE_SETTINGS_JSON"  # how `serve --workers N` hands settings to each worker
WORKERS_ENV = "PVWIRE_WORKERS_STARTED"  # and how many workers it started
# A loop this late cannot serve anyone (DESIGN.md section 9).
MAX_LOOP_LAG_READY = number("ready_max_loop_lag_s")


def make_backends(settings: Settings) -> dict[str, Backend]:
    from .upstream.ca import CaBackend
    from .upstream.loc import LocBackend
    from .upstream.pva import PvaBackend
    from .upstream.sim import SimBackend, SimLimits

    backends: dict[str, Backend] = {
        "ca": CaBackend(settings.forward_identity, settings.forward_host_name),
        "pva": PvaBackend(
            settings.pva_queue_size, settings.forward_identity, settings.forward_host_name
        ),
        "loc": LocBackend(),
    }
    if settings.sim_enabled:
        limits = SimLimits(
            max_rate=settings.sim_max_rate,
            max_length=settings.sim_max_length,
            max_bytes_per_s=settings.sim_max_bytes_per_s,
        )
        backends["sim"] = SimBackend(limits)
    return backends


class OfflineGraphQLRouter(GraphQLRouter[Any, None]):
    """Serves GraphiQL from vendored files when they are there (`make`), else strawberry's page."""

    @property
    def graphql_ide_html(self) -> str:
        return offline_page() or super().graphql_ide_html

    def encode_json(self, data: object) -> bytes:
        # orjson: arrays straight from numpy, ~10x json (api/query_cost.py has figures).
        return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)

    def decode_json(self, data: str | bytes) -> object:
        # strawberry answers JSONDecodeError with 400 but lets UnicodeDecodeError through as a
        # 500: a body that is not UTF-8 is the client's error like any other unparsable body.
        try:
            decoded = super().decode_json(data)
        except UnicodeDecodeError as exc:
            raise json.JSONDecodeError(f"body is not UTF-8 ({exc.reason})", "", exc.start) from None
        # Strawberry calls `.get` on what is not a list, so a body of `false` or `0` was a 500.
        if not isinstance(decoded, dict | list):
            raise HTTPException(400, "the body must be a JSON object: a GraphQL request")
        return decoded


def create_app(
    settings: Settings, backends: Mapping[str, Backend] | None = None, workers: int = 1
) -> FastAPI:
    keys, kid = settings.signing_keys()
    signer = TokenSigner(keys, kid, settings.token_ttl_s)
    hub = Hub(backends if backends is not None else make_backends(settings), settings, signer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        hub.start()
        await authenticator.start()  # the OIDC issuer's keys, if one is followed
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            # SIGHUP reads the access rules and the catalogue file again (both are also read
            # when their file changes). The one handler: the loop's replaces any set before.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hub.reload)
        # Everything allocated so far (FastAPI, strawberry, numpy, EPICS libraries) lives as
        # long as the process: move it out of the collector's reach, so that full collections,
        # which otherwise walked all of it, no longer pause the event loop.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await authenticator.stop()  # and the summary of refusals left out, if any
            mjpeg.close()
            await hub.stop()

    app = FastAPI(
        title="pvwire",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.hub = hub
    # Computed in the process that serves, after uvicorn spawned it.
    worker = WorkerIdentity.current(settings.instance, workers)
    app.state.worker = worker
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["*"],
        )

    # Added last, so outermost: no body beyond the bound reaches CORS, authentication or a route.
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)

    authenticator = make_authenticator(settings, hub.refusals)
    app.state.authenticator = authenticator
    cost_limiter = RateLimiter(settings.max_cost_per_s, 2 * settings.max_cost_per_s)

    async def context(request: Request) -> dict[str, Any]:
        check_origin(settings, request.headers.get("origin"))
        peer = request.client.host if request.client else ""
        # The body, for a refusal's audit line (cached: strawberry reads the same bytes again).
        body = await request.body() if request.method == "POST" else b""
        return {
            "hub": hub,
            "request": request,
            "identity": await authenticator.authenticate(
                request.headers, peer, lambda: graphql_operation(body, request.query_params)
            ),
            "budget": ValueBudget(settings.max_graphql_elements),
            "cost_limiter": cost_limiter,
            "worker": worker,
        }

    graphql: GraphQLRouter[Any, None] = OfflineGraphQLRouter(
        make_schema(settings.max_query_depth, settings.max_query_cost),
        context_getter=context,
        graphql_ide="graphiql",
        multipart_uploads_enabled=False,
    )
    app.include_router(graphql, prefix="/graphql")

    @app.exception_handler(AuthError)
    async def unauthenticated(request: Request, exc: AuthError) -> JSONResponse:
        # GraphQL-shaped, so clients read it like any other error of the control plane.
        body = {"errors": [{"message": str(exc), "extensions": {"code": exc.code}}]}
        status = 403 if isinstance(exc, OriginRefused) else 401
        headers = {} if status == 403 else {"WWW-Authenticate": 'Bearer realm="pvwire"'}
        return JSONResponse(body, status_code=status, headers=headers)

    if ASSETS.is_dir():
        app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS), name="graphiql-assets")

    @app.websocket("/stream")
    async def stream(websocket: WebSocket) -> None:
        await serve_stream(websocket, hub, authenticator)

    pvws = PvwsEndpoint(hub, authenticator)
    app.state.pvws = pvws

    @app.websocket("/pvws/pv")
    async def pvws_socket(websocket: WebSocket) -> None:
        await pvws.serve(websocket)

    app.include_router(pvws.router())
    app.include_router(pvws_js_router())

    mjpeg = MjpegEndpoint(hub, authenticator)
    app.state.mjpeg = mjpeg
    app.include_router(mjpeg.router())

    @app.get("/status", response_model=None)
    async def status_page() -> FileResponse | PlainTextResponse:
        page = STATIC / "status.html"
        if page.is_file():
            return FileResponse(page)
        return PlainTextResponse("the status page is not built (run `make tsbuild`)", 404)

    @app.get("/auth.json")
    async def auth_config() -> dict[str, str]:
        """Where to sign in: the provider, and the public client the page uses (PKCE); {} for
        none. `pvwire login` reads it too."""
        found = {"issuer": settings.oidc_issuer, "clientId": settings.oidc_client_id}
        return {k: v for k, v in found.items() if v}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        lag = hub.loop_lag
        ready = lag < MAX_LOOP_LAG_READY
        # A scheme this process cannot serve (pva:// without its compiled module) leaves the
        # others ready; it is named here, with the reason, for whoever looks at the probe.
        body = {
            "ready": ready,
            "loop_lag_s": lag,
            "channels": hub.channel_count,
            "unavailable": hub.unavailable_schemes(),
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = render_metrics(hub.snapshot(detail=False), worker, mjpeg.stats())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    if (STATIC / "index.html").is_file():
        app.mount("/", StaticFiles(directory=STATIC, html=True), name="page")
    else:

        @app.get("/")
        async def no_page() -> PlainTextResponse:
            return PlainTextResponse(
                "pvwire is running; the demo page is not built (run `make tsbuild`).\n"
                "GraphQL: /graphql   stream: /stream   metrics: /metrics\n"
            )

    return app


class OriginRefused(AuthError):
    code = "ORIGIN_NOT_ALLOWED"


def check_origin(settings: Settings, origin: str | None) -> None:
    """Browsers always send Origin: a present one must be allowed. None is a non-browser client
    (the Python client, the CLI, Node), which an Origin list must not lock out."""
    if settings.allowed_origins and origin is not None and origin not in settings.allowed_origins:
        raise OriginRefused(f"origin {origin!r} is not allowed")


_OPERATION = re.compile(r"\s*(query|mutation|subscription)?\s*(\w*)[^{]*\{\s*(?:\w+\s*:\s*)?(\w+)")


def graphql_operation(body: bytes, params: Mapping[str, str]) -> str:
    """What a GraphQL request asks, for the audit file: `mutation put`, `query SetUp` (by the
    operation's name when it has one, else its first field), or `graphql` if it cannot tell.
    Looks at the first 2,000 characters only: this runs for refusals, which anyone can send."""
    request: Any = dict(params)
    if body:
        try:
            request = json.loads(body[:1_000_000])
        except ValueError:
            return "graphql"
    if not isinstance(request, dict):
        return "graphql"
    name, query = request.get("operationName"), request.get("query")
    found = _OPERATION.match(query[:2000]) if isinstance(query, str) else None
    kind = (found.group(1) if found else "") or "query"
    if isinstance(name, str) and name.isidentifier():
        return f"{kind} {name[:100]}"
    if found:
        return f"{kind} {found.group(2) or found.group(3)}"[:100]
    return "graphql"


def make_authenticator(settings: Settings, refusals: RefusalLog | None = None) -> Authenticator:
    return Authenticator(
        JwtSettings(
            secret_file=settings.jwt_secret_file,
            jwks_file=settings.jwks_file,
            oidc_issuer=settings.oidc_issuer,
            oidc_refresh_s=settings.oidc_refresh_s,
            oidc_min_interval_s=settings.oidc_min_interval_s,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
            authorized_parties=tuple(settings.jwt_authorized_parties),
            oidc_allow_http=settings.oidc_allow_http,
            groups_claim=settings.jwt_groups_claim,
            user_claim=settings.jwt_user_claim,
            leeway_s=settings.jwt_leeway_s,
        ),
        trusted_proxies=settings.trusted_proxies,
        user_header=settings.user_header,
        groups_header=settings.groups_header,
        refusals=refusals or RefusalLog(),
    )


def app_from_env() -> FastAPI:
    """Factory for uvicorn workers: settings come as JSON in PVWIRE_SETTINGS_JSON."""
    settings = Settings()
    settings.update(json.loads(os.environ[SETTINGS_ENV]))
    return create_app(settings, workers=int(os.environ.get(WORKERS_ENV, "1")))
