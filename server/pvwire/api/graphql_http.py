"""GraphQL over HTTP at /graphql: the router, each request's context, the offline GraphiQL
files, and how an authentication refusal is answered."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import orjson
from cross_web import HTTPException
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from strawberry.fastapi import GraphQLRouter

from ..access.identity import Authenticator, AuthError
from ..access.ratelimit import RateLimiter
from ..config import Settings
from ..core.hub import Hub
from ..worker import WorkerIdentity
from .graphiql_offline import ASSETS, ASSETS_PATH, offline_page
from .graphql import make_schema
from .query_cost import ValueBudget

__all__ = [
    "OfflineGraphQLRouter",
    "OriginRefused",
    "auth_refused",
    "check_origin",
    "graphql_operation",
    "graphql_router",
    "mount_graphiql_assets",
]


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


def graphql_router(
    settings: Settings, hub: Hub, authenticator: Authenticator, worker: WorkerIdentity
) -> GraphQLRouter[Any, None]:
    """The router to include at /graphql; each request is authenticated in its context."""
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

    return OfflineGraphQLRouter(
        make_schema(settings.max_query_depth, settings.max_query_cost),
        context_getter=context,
        graphql_ide="graphiql",
        multipart_uploads_enabled=False,
    )


def mount_graphiql_assets(app: FastAPI) -> None:
    """GraphiQL's vendored files, when `make` put them there (else the page loads them itself)."""
    if ASSETS.is_dir():
        app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS), name="graphiql-assets")


async def auth_refused(request: Request, exc: AuthError) -> JSONResponse:
    """The answer to an `AuthError` raised while serving any route."""
    # GraphQL-shaped, so clients read it like any other error of the control plane.
    body = {"errors": [{"message": str(exc), "extensions": {"code": exc.code}}]}
    status = 403 if isinstance(exc, OriginRefused) else 401
    headers = {} if status == 403 else {"WWW-Authenticate": 'Bearer realm="pvwire"'}
    return JSONResponse(body, status_code=status, headers=headers)


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
