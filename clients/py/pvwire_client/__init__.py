"""Python client for pvwire: EPICS PVs over GraphQL and a MessagePack WebSocket stream.

Example::

    import asyncio
    from pvwire_client import Client

    async def main() -> None:
        async with Client("http://127.0.0.1:8080") as c:
            print((await c.get("ca://X:TEMP")).format())
            async for u in c.monitor(["sim://sine"]):
                print(u.channel.format())

    asyncio.run(main())

Names are imported on first use (PEP 562), so ``import pvwire_client.cli`` does not pay for
httpx, h11 and numpy unless the command needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batch import Batch
    from .client import Client, TokenSource, Update
    from .closecodes import is_reconnect
    from .control import DEFAULT_URL
    from .errors import (
        BackendUnavailable,
        BadChannelId,
        BadRequest,
        Forbidden,
        NoHistory,
        NotFound,
        OriginNotAllowed,
        ProtocolError,
        PutFailed,
        PvwireError,
        QueryTooCostly,
        RateLimited,
        ReadOnly,
        ServerUnavailable,
        StreamClosed,
        StreamRefused,
        Timeout,
        TooLarge,
        TooManyChannels,
        TypeMismatch,
        Unauthenticated,
        UnsupportedValue,
        WriteDenied,
    )
    from .graphql import PutResult
    from .history import ArchivePart, HistoryRows
    from .state import ChannelState
    from .sync import SyncClient
    from .wire import Entry, decode_message

# Public name -> the module that defines it.
_WHERE = {
    "Batch": "batch",
    "Client": "client",
    "TokenSource": "client",
    "Update": "client",
    "is_reconnect": "closecodes",
    "DEFAULT_URL": "control",
    **dict.fromkeys(
        (
            "BackendUnavailable",
            "BadChannelId",
            "BadRequest",
            "Forbidden",
            "NoHistory",
            "NotFound",
            "OriginNotAllowed",
            "ProtocolError",
            "PutFailed",
            "PvwireError",
            "QueryTooCostly",
            "RateLimited",
            "ReadOnly",
            "ServerUnavailable",
            "StreamClosed",
            "StreamRefused",
            "Timeout",
            "TooLarge",
            "TooManyChannels",
            "TypeMismatch",
            "Unauthenticated",
            "UnsupportedValue",
            "WriteDenied",
        ),
        "errors",
    ),
    "PutResult": "graphql",
    "ArchivePart": "history",
    "HistoryRows": "history",
    "ChannelState": "state",
    "SyncClient": "sync",
    "Entry": "wire",
    "decode_message": "wire",
}

__all__ = [
    "DEFAULT_URL",
    "ArchivePart",
    "BackendUnavailable",
    "BadChannelId",
    "BadRequest",
    "Batch",
    "ChannelState",
    "Client",
    "Entry",
    "Forbidden",
    "HistoryRows",
    "NoHistory",
    "NotFound",
    "OriginNotAllowed",
    "ProtocolError",
    "PutFailed",
    "PutResult",
    "PvwireError",
    "QueryTooCostly",
    "RateLimited",
    "ReadOnly",
    "ServerUnavailable",
    "StreamClosed",
    "StreamRefused",
    "SyncClient",
    "Timeout",
    "TokenSource",
    "TooLarge",
    "TooManyChannels",
    "TypeMismatch",
    "Unauthenticated",
    "UnsupportedValue",
    "Update",
    "WriteDenied",
    "decode_message",
    "is_reconnect",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
