"""Errors of the client: one base, one subclass per server error code (GraphQL extensions.code)."""

from __future__ import annotations

__all__ = [
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
    "error_for",
]


class ProtocolError(Exception):
    """The server sent something PROTOCOL.md does not allow (the message says what)."""


class PvwireError(Exception):
    """An error the server reported, or the client could not reach it.

    ``code`` is the server's machine-readable code (e.g. ``NOT_FOUND``); ``id`` the channel, if any.
    """

    code = "ERROR"

    def __init__(self, message: str, *, code: str | None = None, id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.id = id

    @property
    def detail(self) -> str:
        """The message without a leading channel id when that id is this error's channel.

        The server's messages name the channel by its full id (``ca://X: no server answered
        within 3 s``); prefixing ``id`` again would name it twice.
        """
        if self.id:
            head, sep, rest = self.message.partition(": ")
            if sep and (head == self.id or head.endswith(f"://{self.id}")):
                return rest
        return self.message

    def __str__(self) -> str:
        detail = self.detail
        return detail if not self.id or self.id in detail else f"{self.id}: {detail}"


class NotFound(PvwireError):
    code = "NOT_FOUND"


class Timeout(PvwireError):
    code = "TIMEOUT"


class BadChannelId(PvwireError):
    code = "BAD_CHANNEL_ID"


class WriteDenied(PvwireError):
    code = "WRITE_DENIED"


class Unauthenticated(PvwireError):
    """The server did not accept the token: missing where required, invalid or expired."""

    code = "UNAUTHENTICATED"


class Forbidden(PvwireError):
    """The identity may not read (or subscribe to) the channels the error names."""

    code = "FORBIDDEN"


class ReadOnly(PvwireError):
    code = "READ_ONLY"


class TypeMismatch(PvwireError):
    code = "TYPE_MISMATCH"


class PutFailed(PvwireError):
    code = "PUT_FAILED"


class TooManyChannels(PvwireError):
    code = "TOO_MANY_CHANNELS"


class BackendUnavailable(PvwireError):
    """The server cannot serve this channel's protocol (e.g. pva:// on a server built without
    its PVA module); the message says what is missing."""

    code = "UNAVAILABLE"


class NoHistory(PvwireError):
    """The server holds no recent history of the channel; the message says why."""

    code = "NO_HISTORY"


class BadRequest(PvwireError):
    """A request the server refused as malformed (an option out of range, an empty list...)."""

    code = "BAD_REQUEST"


class QueryTooCostly(PvwireError):
    """A GraphQL query over the server's cost limit (too many ids, aliases or puts in one)."""

    code = "QUERY_TOO_COSTLY"


class RateLimited(PvwireError):
    """Too many requests of this kind from this identity; try again later."""

    code = "RATE_LIMITED"


class TooLarge(PvwireError):
    """A value larger than one GraphQL answer may carry; the stream carries it whole."""

    code = "TOO_LARGE"


class UnsupportedValue(PvwireError):
    """A value the protocol has no form for (PROTOCOL.md section 4)."""

    code = "UNSUPPORTED_VALUE"


class OriginNotAllowed(PvwireError):
    """The server refused the request's Origin (a browser page not in its allowed origins)."""

    code = "ORIGIN_NOT_ALLOWED"


class ServerUnavailable(PvwireError):
    """The server could not be reached, or did not answer as a pvwire server. Its code is the
    client's own: no server answer carries it."""

    code = "SERVER_UNAVAILABLE"


class StreamClosed(PvwireError):
    """The stream ended with a terminal close code (section 8); the monitor cannot continue."""

    code = "STREAM_CLOSED"

    def __init__(self, close_code: int, reason: str = "") -> None:
        # Imported here: the table is read with importlib.resources, ~20 ms that every
        # `pvwire get` would otherwise pay for an error only a stream can raise.
        from .closecodes import name as close_name

        text = f"stream closed: {close_code} {close_name(close_code)}"
        super().__init__(f"{text} ({reason})" if reason else text)
        self.close_code = close_code
        self.reason = reason


class StreamRefused(PvwireError):
    """The server refused or ended one subscription on the stream (PROTOCOL.md section 7).

    ``stream_code`` is 4401 (bad token) or 4402 (expired token) when even a freshly registered
    token was refused, or 4403 when the identity may not read a channel; ``code`` is its name
    (``BAD_TOKEN``, ``TOKEN_EXPIRED``, ``FORBIDDEN``). The client's other subscriptions go on.
    """

    code = "STREAM_REFUSED"

    def __init__(self, stream_code: int, message: str = "") -> None:
        from .closecodes import name as close_name  # lazily, as in StreamClosed

        name = close_name(stream_code)
        text = f"subscription refused: {stream_code} {name}"
        super().__init__(f"{text} ({message})" if message else text, code=name)
        self.stream_code = stream_code


_BY_CODE: dict[str, type[PvwireError]] = {
    c.code: c
    for c in (
        NotFound,
        Timeout,
        BadChannelId,
        WriteDenied,
        ReadOnly,
        TypeMismatch,
        PutFailed,
        TooManyChannels,
        Unauthenticated,
        Forbidden,
        BackendUnavailable,
        NoHistory,
        BadRequest,
        QueryTooCostly,
        RateLimited,
        TooLarge,
        UnsupportedValue,
        OriginNotAllowed,
    )
}


def error_for(code: str | None, message: str, id: str | None = None) -> PvwireError:
    """The exception for a server error code (unknown codes give a plain PvwireError)."""
    cls = _BY_CODE.get(code or "", PvwireError)
    return cls(message, code=code or None, id=id)
