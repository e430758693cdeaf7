"""TLS handshakes under pvwire's deadline: uvloop's loop, whose TLS servers are made with
`tls_handshake_timeout_s`.

uvicorn hands its TLS context to the loop's `create_server` with no handshake deadline of its
own, so uvloop's default held each socket that sent nothing, or a few bytes of a ClientHello,
for 60 s; the HTTP protocol (and its header deadline, its connection counts) hears of a
connection only once its handshake is done. uvicorn takes the loop by name (`loop=`, a
factory: the class), so that every worker of `--workers N` runs it too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvloop

from ..limits import number

__all__ = ["HANDSHAKE_TIMEOUT", "Loop"]

HANDSHAKE_TIMEOUT = number("tls_handshake_timeout_s")


class Loop(uvloop.Loop):
    """uvloop's loop; a TLS server's handshakes have `tls_handshake_timeout_s`."""

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.AbstractServer:  # type: ignore[override]
        if kwargs.get("ssl") is not None and kwargs.get("ssl_handshake_timeout") is None:
            kwargs["ssl_handshake_timeout"] = HANDSHAKE_TIMEOUT
        return await super().create_server(*args, **kwargs)
