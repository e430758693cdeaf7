"""GraphQL documents of the control plane (protocol/schema.graphql) and their results as Python.

Pure conversion, no I/O: GraphQL ``Channel`` objects become :class:`ChannelState` in the same
shape the stream produces (metadata limits as ``[low, high]`` with NaN for unset sides, severity,
status and connection as numbers, numeric arrays as numpy arrays).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .errors import PvwireError, ServerUnavailable, error_for
from .lazynp import tolist
from .state import CONNECTION_STATES, SEVERITIES, STATUSES, ChannelState

__all__ = [
    "PutResult",
    "Registration",
    "StreamChannel",
    "channel_state",
    "metadata",
    "put_error",
    "put_result",
    "raise_errors",
    "response_data",
]

_META = (
    "type count description units precision form display { low high } control { low high }"
    " alarm { low high } warning { low high } choices colorMode writable"
)
CHANNEL_FIELDS = (
    "id value time { seconds nanoseconds } alarm { severity status message } connection"
    f" metadata {{ {_META} }} error errorCode"
)
Q_CHANNELS = f"query($ids: [String!]!, $timeout: Float!) {{ channels(ids: $ids, timeout: $timeout) {{ {CHANNEL_FIELDS} }} }}"  # noqa: E501
Q_INFO = f"query($id: String!, $timeout: Float!) {{ channel(id: $id, timeout: $timeout) {{ id connection metadata {{ {_META} }} }} }}"  # noqa: E501
Q_SEARCH = "query($p: String!, $n: Int!) { search(pattern: $p, limit: $n) }"
Q_SERVER = (
    "{ server { version uptime tickMs writesEnabled loopLagMs"
    " clients { id address attachments channels queuedBytes conflated framesSent bytesSent"
    " connectedSeconds } channels { id subscribers updates updateRate connection } } }"
)
M_PUT = (
    "mutation($id: String!, $value: JSON!, $wait: Boolean!, $timeout: Float!) {"
    " put(id: $id, value: $value, wait: $wait, timeout: $timeout) { id ok error errorCode } }"
)
M_PUT_MANY = (
    "mutation($puts: [PutInput!]!, $wait: Boolean!, $timeout: Float!) {"
    " putMany(puts: $puts, wait: $wait, timeout: $timeout) { id ok error errorCode } }"
)
M_SUBSCRIBE = (
    "mutation($ids: [String!]!, $options: SubscribeOptions) {"
    " subscribe(ids: $ids, options: $options)"
    f" {{ token expiresAt streamPath channels {{ sid id access metadata {{ {_META} }} }} }} }}"
)

_NUMERIC = {
    "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64",
}  # fmt: skip
_LIMITS = ("display", "control", "alarm", "warning")


@dataclass(frozen=True, slots=True)
class PutResult:
    id: str
    ok: bool
    error: str | None = None
    error_code: str | None = None


@dataclass(frozen=True, slots=True)
class StreamChannel:
    sid: int
    id: str
    metadata: dict[str, Any]
    access: str | None = None  # "READ" or "WRITE" for the identity that registered


@dataclass(frozen=True, slots=True)
class Registration:
    """The answer of ``subscribe``: a token for the stream and the channels it names."""

    token: str
    expires_at: float
    stream_path: str
    channels: tuple[StreamChannel, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Registration:
        chans = sorted(d["channels"], key=lambda c: c["sid"])
        return cls(
            d["token"],
            float(d["expiresAt"]),
            d["streamPath"],
            tuple(
                StreamChannel(c["sid"], c["id"], metadata(c.get("metadata")), c.get("access"))
                for c in chans
            ),
        )


def response_data(url: str, status: int, body: bytes, id: str | None = None) -> Any:
    """The ``data`` of a GraphQL answer; raises its first error, or ServerUnavailable if the
    answer is not a pvwire server's (a proxy's error page, an empty body, ...)."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if status == 401 and not (isinstance(doc, dict) and doc.get("errors")):
        # Refused before pvwire answered (an authenticating proxy): still "log in again".
        raise error_for("UNAUTHENTICATED", f"{url}/graphql answered HTTP 401", id)
    if doc is None:
        raise ServerUnavailable(f"{url}/graphql answered HTTP {status} without JSON")
    if not isinstance(doc, dict):
        raise ServerUnavailable(f"{url}/graphql answered {type(doc).__name__}, not JSON")
    raise_errors(doc.get("errors") or [], id)
    if doc.get("data") is None:
        raise ServerUnavailable(f"{url}/graphql answered HTTP {status} without data")
    return doc["data"]


def raise_errors(errors: list[dict[str, Any]], id: str | None = None) -> None:
    """Raise the first GraphQL error as the PvwireError subclass of its ``extensions.code``."""
    if not errors:
        return
    first = errors[0]
    ext = first.get("extensions") or {}
    raise error_for(ext.get("code"), str(first.get("message", "error")), id)


def metadata(m: dict[str, Any] | None) -> dict[str, Any]:
    """GraphQL ``Metadata`` in the stream's form (section 5): absent keys for unknown fields."""
    out: dict[str, Any] = {}
    for k, v in (m or {}).items():
        if v is None:
            continue
        if k in _LIMITS:
            lo, hi = v.get("low"), v.get("high")
            if lo is None and hi is None:
                continue
            v = [math.nan if lo is None else float(lo), math.nan if hi is None else float(hi)]
        out[k] = v
    return out


def _index(names: tuple[str, ...], name: Any, default: int) -> int:
    try:
        return names.index(name)
    except ValueError:
        return default


def value_from_json(value: Any, meta: dict[str, Any]) -> Any:
    """JSON arrays of numbers become numpy arrays of the channel's type (as on the stream)."""
    t = meta.get("type")
    if isinstance(value, list) and t in _NUMERIC:
        import numpy as np  # only for arrays: numpy is slow to import (see lazynp)

        return np.asarray(value, dtype=np.dtype(t))
    if t in _NUMERIC and t is not None and t.startswith("float") and type(value) is int:
        return float(value)
    return value


def channel_state(c: dict[str, Any]) -> ChannelState:
    """A GraphQL ``Channel`` (without an error) as a ChannelState."""
    meta = metadata(c.get("metadata"))
    s = ChannelState(c["id"], metadata=meta)
    s.value = value_from_json(c.get("value"), meta)
    t = c.get("time")
    if t:
        secs = float(t["seconds"])
        s.seconds, s.nanoseconds = math.floor(secs), int(t["nanoseconds"])
    a = c.get("alarm")
    if a:
        s.severity = _index(SEVERITIES, a.get("severity"), 3)
        s.status = _index(STATUSES, a.get("status"), 0)
        s.message = a.get("message") or ""
    s.state = _index(CONNECTION_STATES, c.get("connection"), 0)
    return s


def channel_or_error(c: dict[str, Any]) -> ChannelState | PvwireError:
    if c.get("error") or c.get("errorCode"):
        return error_for(c.get("errorCode"), c.get("error") or "error", c.get("id"))
    return channel_state(c)


def put_result(r: dict[str, Any]) -> PutResult:
    return PutResult(r["id"], bool(r["ok"]), r.get("error"), r.get("errorCode"))


def put_error(res: PutResult) -> PvwireError:
    return error_for(res.error_code or "PUT_FAILED", res.error or "put failed", res.id)


def to_json(value: Any) -> Any:
    """A value to put, as JSON: numpy arrays and scalars become lists and numbers."""
    value = tolist(value)
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value
