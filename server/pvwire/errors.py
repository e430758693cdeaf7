"""One error hierarchy for the server; each error carries a code that GraphQL clients see."""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "BadChannelId",
    "ChannelNotFound",
    "ChannelTimeout",
    "CredentialsExpired",
    "IocDenied",
    "PutRejected",
    "PvwireError",
    "ReadOnlyChannel",
    "TooManyChannels",
    "TypeMismatch",
    "WriteDenied",
]


class PvwireError(Exception):
    """Base of every error pvwire reports to a client. `code` is stable and machine-readable."""

    code = "ERROR"
    # Who refused a put, for the audit line: "pvwire" (its rules and limits) or "ioc" (the
    # upstream server's own access security); "" when nobody refused (a failure, not a refusal).
    refused_by = ""


class BadChannelId(PvwireError):
    """The id cannot be parsed or names an unknown scheme, e.g. 'foo://X'."""

    code = "BAD_CHANNEL_ID"


class BackendUnavailable(PvwireError):
    """This server cannot reach the id's scheme at all, e.g. pva:// without its compiled module.

    The message says what is missing and how to fix it; the server's log and /readyz say so too.
    """

    code = "UNAVAILABLE"


class ChannelNotFound(PvwireError):
    """No server answered for the channel within the timeout (unknown or unreachable PV)."""

    code = "NOT_FOUND"


class ChannelTimeout(PvwireError):
    """The channel exists but an operation (get, put with wait) did not complete in time."""

    code = "TIMEOUT"


class TypeMismatch(PvwireError):
    """A put value cannot be converted to the channel's type, e.g. 'abc' to a float record."""

    code = "TYPE_MISMATCH"


class ReadOnlyChannel(PvwireError):
    """The upstream server refuses writes to the channel (access rights, read-only kind)."""

    code = "READ_ONLY"


class IocDenied(ReadOnlyChannel):
    """The IOC's own access security (its ACF) refused the write: same code as READ_ONLY."""

    refused_by = "ioc"


class WriteDenied(PvwireError):
    """pvwire's own write rules do not allow writes to the channel."""

    code = "WRITE_DENIED"
    refused_by = "pvwire"


class PutRejected(PvwireError):
    """The upstream server answered the put with an error."""

    code = "PUT_FAILED"


class Forbidden(PvwireError):
    """The identity may not read this channel (access rules)."""

    code = "FORBIDDEN"
    refused_by = "pvwire"


class RateLimited(PvwireError):
    """The identity asked for more than its share (puts per second, query cost per second)."""

    code = "RATE_LIMITED"
    refused_by = "pvwire"


class TooManyChannels(PvwireError):
    """The caller's address holds all the upstream channels it may (max_channels_per_address)."""

    code = "TOO_MANY_CHANNELS"
    refused_by = "pvwire"


class CredentialsExpired(PvwireError):
    """The caller's credentials (its JWT) are past their expiry, though still accepted within the
    clock-skew leeway: a stream token outlives no credentials, so it would be born expired."""

    code = "UNAUTHENTICATED"
