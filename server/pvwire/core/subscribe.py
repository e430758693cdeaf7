"""Registration: the GraphQL `subscribe` mutation's work, for any caller (PROTOCOL.md section 7).

Resolve the ids, check that the caller may read every one, sign a token that carries the ids,
the options and the caller's identity, and describe each channel as far as the hub knows it now
(metadata of monitored channels, whether the caller may write). The API only converts the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..access.identity import Identity
from ..access.rules import Access
from ..errors import CredentialsExpired
from ..model import Metadata
from ..wire.tokens import TokenSigner
from .channel import Channel
from .control import Control

__all__ = ["Registered", "Registration", "StreamOptions", "register"]


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """A subscription's options, checked by the caller (api/graphql.py says the limits)."""

    mode: str = "LATEST"
    max_rate: float = 0.0
    max_columns: int = 0
    max_pixels: int = 0
    backfill: float = 0.0  # seconds of history before each snapshot (PROTOCOL.md section 2.8)


@dataclass(frozen=True, slots=True)
class Registered:
    """One channel of a registration; `sid` is its index in the token."""

    sid: int
    id: str
    may_write: bool  # the access rules let the caller write it (the upstream may still refuse)
    metadata: Metadata | None  # as the caller sees it, or None while the hub has none yet


@dataclass(frozen=True, slots=True)
class Registration:
    token: str
    expires_at: int  # POSIX seconds
    channels: tuple[Registered, ...]


def register(
    control: Control,
    signer: TokenSigner,
    channels: Mapping[str, Channel],
    canonical: Sequence[str],
    identity: Identity,
    options: StreamOptions,
) -> Registration:
    """A token for `canonical` (resolved ids) and `identity`; raises Forbidden naming the ids the
    identity may not read, CredentialsExpired when the identity's own credentials have expired.

    A JWT is accepted up to `jwt_leeway_s` after its `exp` (clock skew), but a token expires no
    later than the credentials (PROTOCOL.md section 7): one made then would be refused with 4402
    on ATTACH, and a client registering again with the same JWT would loop until the leeway ran
    out. Refused here instead, with a code that tells the client to get fresh credentials."""
    expires = identity.expires_at
    if expires is not None and signer.now() >= int(expires):
        raise CredentialsExpired(
            f"your credentials expired at {int(expires)} (POSIX seconds): "
            "get a fresh token from your identity provider and subscribe again"
        )
    control.require_read(identity, list(canonical))
    issued = signer.issue(
        canonical,
        options.mode,
        options.max_rate,
        user=identity.user,
        groups=sorted(identity.groups),
        auth=identity.source,
        address=identity.address,
        not_after=identity.expires_at,
        max_columns=options.max_columns,
        max_pixels=options.max_pixels,
        backfill=options.backfill,
    )
    registered = []
    for sid, cid in enumerate(canonical):
        ch = channels.get(cid)
        writes = control.access(identity, cid) == Access.WRITE
        meta = ch.meta.for_client(writes) if ch is not None and ch.meta != Metadata() else None
        registered.append(Registered(sid, cid, writes, meta))
    return Registration(issued.token, issued.expires_at, tuple(registered))
