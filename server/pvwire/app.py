"""The ASGI application: GraphQL at /graphql, the stream at /stream, probes, metrics, the page.
`create_app` assembles the routes of `api/` in order; `lifespan` starts and stops what they use."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI, WebSocket
from fastapi.middleware.cors import CORSMiddleware

from . import __version__
from .aa.endpoint import AaEndpoint
from .access.identity import Authenticator, AuthError, JwtSettings
from .access.refusals import RefusalLog
from .api import stream
from .api.body_limit import BodyLimit
from .api.connections import STATE_KEY, Connections, capacity
from .api.graphql_http import auth_refused, graphql_router, mount_graphiql_assets
from .api.mjpeg import MjpegEndpoint
from .api.paced_bodies import PacedBodies
from .api.routes import mount_page, pages, probes, readiness
from .config import Settings
from .core.hub import Hub
from .pvws.endpoint import PvwsEndpoint
from .pvws.scripts import router as pvws_js_router
from .status import StatusServer
from .tls import ServerCertificate, serving_certificates
from .upstream.base import Backend
from .wire.tokens import TokenSigner
from .worker import WorkerIdentity

__all__ = ["create_app", "lifespan", "make_authenticator", "make_backends"]

# The collector's thresholds: a young collection every 50,000 allocations of tracked objects,
# not 700. At 700, the bodies of a tick's updates, alive one update period (100 ms at 10 Hz),
# outlived two young collections into the oldest generation, and with 500 screens full
# collections of ~240,000 objects paused the loop 40-285 ms every 2-3 s; with these, none came
# in the measured window (bench/JOURNAL.md, "The control room, compiled").
GC_THRESHOLDS = (50_000, 10, 10)

# How often the TLS certificate's files are looked at (a stat of each; read only when changed).
CERTIFICATE_POLL_S = 1.0

SETTINGS_ENV = "PVWIRE_SETTINGS_JSON"  # how `serve --workers N` hands settings to each worker
WORKERS_ENV = "PVWIRE_WORKERS_STARTED"  # and how many workers it started


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


def create_app(
    settings: Settings, backends: Mapping[str, Backend] | None = None, workers: int = 1
) -> FastAPI:
    keys, kid = settings.signing_keys()
    signer = TokenSigner(keys, kid, settings.token_ttl_s)
    hub = Hub(backends if backends is not None else make_backends(settings), settings, signer)
    authenticator = make_authenticator(settings, hub.refusals)
    mjpeg = MjpegEndpoint(hub, authenticator)
    status = None
    if settings.status_prefix:
        # The figures `/metrics` reads, and the readiness `/readyz` answers.
        status = StatusServer(
            settings.status_prefix,
            lambda: hub.snapshot(detail=False),
            lambda: bool(readiness(hub)["ready"]),
            settings.tick_ms,
            workers,
        )
    # Counted at accept by the server's protocols (api/http_protocol.py), which find the table
    # in the lifespan's state.
    connections = Connections(
        settings.max_connections_per_address,
        capacity(settings.max_connections),
        authenticator.is_proxy,
        authenticator.client_address,
    )
    app = FastAPI(
        title="pvwire",
        version=__version__,
        lifespan=lifespan(hub, authenticator, mjpeg, status, connections),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    # Computed in the process that serves, after uvicorn spawned it.
    worker = WorkerIdentity.current(settings.instance, workers)
    app.state.hub, app.state.worker, app.state.authenticator = hub, worker, authenticator
    app.state.mjpeg, app.state.connections = mjpeg, connections
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["*"],
        )
    # Answers over TLS in pieces the server's flow control sees (its write deadline).
    app.add_middleware(PacedBodies)
    # Added last, so outermost: no body beyond the bound reaches CORS, authentication or a route.
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)

    app.include_router(graphql_router(settings, hub, authenticator, worker), prefix="/graphql")
    app.exception_handler(AuthError)(auth_refused)
    mount_graphiql_assets(app)
    app.include_router(stream.router(hub, authenticator))
    app.state.pvws = mount_pvws(app, hub, authenticator)
    app.include_router(mjpeg.router())
    if settings.aa_prefix:  # the Archiver Appliance's retrieval API (docs/ARCHIVER.md)
        app.include_router(AaEndpoint(hub, authenticator).router())
    app.include_router(pages(settings))
    app.include_router(probes(hub, worker, mjpeg.stats, connections.stats))
    mount_page(app)  # last: it answers every path the routes above leave
    return app


def lifespan(
    hub: Hub,
    authenticator: Authenticator,
    mjpeg: MjpegEndpoint,
    status: StatusServer | None = None,
    connections: Connections | None = None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Connections]]]:
    """Starts the hub, then the OIDC key follower, then the status PVs; stops them in reverse,
    MJPEG's feeds between. The state it yields is what the server hands its protocols: the
    connection table."""

    @asynccontextmanager
    async def serving(app: FastAPI) -> AsyncIterator[dict[str, Connections]]:
        hub.start()
        await authenticator.start()  # the OIDC issuer's keys, if one is followed
        if status is not None:
            status.start()
        certificates = serving_certificates()

        def reload() -> None:
            hub.reload()
            for certificate in certificates:
                certificate.request_reload()
                certificate.poll()

        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            # SIGHUP reads the access rules, the catalogue file and the TLS certificate again
            # (all are also read when their files change). The one handler: the loop's
            # replaces any set before.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
        stop_draining = drain_on_sigterm(hub)
        follower = asyncio.create_task(follow_certificates(certificates))
        # Everything allocated so far (FastAPI, strawberry, numpy, EPICS libraries) lives as
        # long as the process: move it out of the collector's reach, so that full collections,
        # which otherwise walked all of it, no longer pause the event loop.
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        try:
            yield {STATE_KEY: connections} if connections is not None else {}
        finally:
            if status is not None:
                await status.stop()
            follower.cancel()
            stop_draining()
            await authenticator.stop()  # and the summary of refusals left out, if any
            mjpeg.close()
            await hub.stop()

    return serving


async def follow_certificates(certificates: tuple[ServerCertificate, ...]) -> None:
    """Read a certificate again when its files change (cert-manager rotates them in place)."""
    while certificates:
        await asyncio.sleep(CERTIFICATE_POLL_S)
        for certificate in certificates:
            certificate.poll()


def drain_on_sigterm(hub: Hub) -> Callable[[], None]:
    """SIGTERM starts the hub's drain (core/drain.py) instead of stopping the server at once; the
    server is stopped when the drain is done. Returns what undoes it (the drain is cancelled).

    uvicorn's own SIGTERM handler (its Server's `handle_exit`, set before the lifespan starts)
    is put back and the server stopped as that handler would, without recording the signal to
    raise it again after the shutdown: a drain that went as planned ends the process with 0.
    SIGINT (Ctrl-C) still stops at once, every WebSocket closed with 1012."""
    loop = asyncio.get_running_loop()
    stop_server = signal.getsignal(signal.SIGTERM)
    tasks: set[asyncio.Task[None]] = set()

    def stop() -> None:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, stop_server)
        server = getattr(stop_server, "__self__", None)
        if server is not None and hasattr(server, "should_exit"):
            server.should_exit = True
        elif callable(stop_server):
            stop_server(signal.SIGTERM, None)
        else:
            signal.raise_signal(signal.SIGTERM)

    async def drain() -> None:
        try:
            await hub.run_drain()
        finally:
            stop()

    def on_sigterm() -> None:
        if hub.begin_drain():
            task = loop.create_task(drain(), name="pvwire-drain")
            tasks.add(task)

    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except (NotImplementedError, RuntimeError, ValueError):
        return lambda: None  # not the main thread (an app served by a test client)

    def undo() -> None:
        for task in tasks:
            task.cancel()

    return undo


def mount_pvws(app: FastAPI, hub: Hub, authenticator: Authenticator) -> PvwsEndpoint:
    """pvws' WebSocket at /pvws/pv, its HTTP routes and its browser scripts."""
    pvws = PvwsEndpoint(hub, authenticator)

    @app.websocket("/pvws/pv")
    async def pvws_socket(websocket: WebSocket) -> None:
        await pvws.serve(websocket)

    app.include_router(pvws.router())
    app.include_router(pvws_js_router())
    return pvws


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
            any_audience=settings.jwt_any_audience,
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
