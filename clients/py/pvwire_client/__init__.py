"""Python client for pvwire: EPICS PVs over GraphQL and a MessagePack WebSocket stream.

>>> async with Client("http://127.0.0.1:8080") as c:
...     print(await c.get("ca://X:TEMP"))
...     async for u in c.monitor(["sim://sine"]):
...         print(u.channel.format())
"""

from .client import DEFAULT_URL, Client, TokenSource, Update
from .closecodes import is_reconnect
from .errors import (
    BadChannelId,
    Forbidden,
    NotFound,
    ProtocolError,
    PutFailed,
    PvwireError,
    ReadOnly,
    ServerUnavailable,
    StreamClosed,
    StreamRefused,
    Timeout,
    TooManyChannels,
    TypeMismatch,
    Unauthenticated,
    WriteDenied,
)
from .graphql import PutResult
from .state import ChannelState
from .wire import Entry, decode_message

__all__ = [
    "DEFAULT_URL",
    "BadChannelId",
    "ChannelState",
    "Client",
    "Entry",
    "Forbidden",
    "NotFound",
    "ProtocolError",
    "PutFailed",
    "PutResult",
    "PvwireError",
    "ReadOnly",
    "ServerUnavailable",
    "StreamClosed",
    "StreamRefused",
    "Timeout",
    "TokenSource",
    "TooManyChannels",
    "TypeMismatch",
    "Unauthenticated",
    "Update",
    "WriteDenied",
    "decode_message",
    "is_reconnect",
]
