"""The control plane without asyncio: blocking GraphQL requests over the standard library.

The ``pvwire`` command reads and writes through this rather than through :class:`.Client`,
because importing asyncio, httpx and numpy took 0.3-0.4 s of a 0.45 s ``pvwire get`` and shell
loops over PVs run the command many times. Results are the same objects the Client returns.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from . import graphql as gql
from .errors import PvwireError, ServerUnavailable
from .login import default_token
from .state import ChannelState

__all__ = ["DEFAULT_URL", "Control"]

DEFAULT_URL = "http://127.0.0.1:8080"
# Seconds the HTTP request may take beyond the server-side timeout it asks for.
_MARGIN = 10.0


class Control:
    """Blocking ``get``/``put``/``search`` on a pvwire server; one connection per request.

    ``token`` as the Client's (a string, or a callable asked before each request; default the
    ``PVWIRE_TOKEN`` environment variable, ``""`` for anonymous).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout: float = 3.0,
        token: str | Callable[[], str | None] | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._ca_file = ca_file  # https: the system's trusted certificates, or this CA (PEM)
        self._token = default_token() if token is None else token
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerUnavailable(f"not an http(s) URL: {url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = f"{parts.path}/graphql"

    def _graphql(
        self, query: str, variables: dict[str, Any], id: str | None = None, wait: float = 0
    ) -> Any:
        body = json.dumps({"query": query, "variables": variables}).encode()
        conn: http.client.HTTPConnection
        limit = self.timeout + wait + _MARGIN
        if self._https:
            context = ssl.create_default_context(cafile=self._ca_file)
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=limit,
                                               context=context)  # fmt: skip
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=limit)
        token = self._token() if callable(self._token) else self._token
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            conn.request("POST", self._path, body, headers)
            r = conn.getresponse()
            status, data = r.status, r.read()
        except (OSError, http.client.HTTPException) as e:
            raise ServerUnavailable(f"cannot reach pvwire server at {self.url}: {e}") from None
        finally:
            conn.close()
        return gql.response_data(self.url, status, data, id)

    def get_many(
        self, ids: Iterable[str], *, timeout: float | None = None
    ) -> list[ChannelState | PvwireError]:
        """Read channels; a failing one is returned as its error, in place, not raised."""
        t = self.timeout if timeout is None else timeout
        data = self._graphql(gql.Q_CHANNELS, {"ids": list(ids), "timeout": t}, wait=t)
        return [gql.channel_or_error(c) for c in data["channels"]]

    def get(self, id: str, *, timeout: float | None = None) -> ChannelState:
        (result,) = self.get_many([id], timeout=timeout)
        if isinstance(result, PvwireError):
            raise result
        return result

    def put(
        self, id: str, value: Any, *, wait: bool = False, timeout: float = 5.0
    ) -> gql.PutResult:
        """Write a value (enum labels as strings); raises WriteDenied, TypeMismatch, ..."""
        v = {"id": id, "value": gql.to_json(value), "wait": wait, "timeout": timeout}
        res = gql.put_result(self._graphql(gql.M_PUT, v, id, wait=timeout)["put"])
        if not res.ok:
            raise gql.put_error(res)
        return res

    def search(self, pattern: str, limit: int = 100) -> list[str]:
        """Channel ids matching a glob pattern, sorted."""
        return list(self._graphql(gql.Q_SEARCH, {"p": pattern, "n": limit})["search"])
