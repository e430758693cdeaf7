"""Stateless signed stream tokens (PROTOCOL.md section 7).

A token carries everything needed to serve its stream (channel ids and options), signed with
HMAC-SHA256. Any replica holding the key verifies it without shared state, so a client can
reconnect to another replica after a restart with no sticky sessions. `kid` names the key, so keys
rotate: sign with the newest, verify with any still listed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .. import limits
from .codes import BAD_TOKEN, TOKEN_EXPIRED

__all__ = ["Claims", "Issued", "TokenError", "TokenExpired", "TokenSigner"]

PREFIX = "pvw1"
# Bounds what a forged or corrupted token can make the server parse.
MAX_TOKEN_BYTES = limits.MAX_TOKEN_BYTES
# The payload is zlib-compressed: channel ids share long prefixes, so a 10,000-channel token
# shrinks about tenfold and fits a client message. Decompression happens only after the
# signature checked out, and is bounded all the same.
MAX_PAYLOAD_BYTES = limits.MAX_TOKEN_PAYLOAD_BYTES


class TokenError(Exception):
    """The token is malformed, its signature is wrong, or its key id is unknown (close 4401)."""

    close_code = BAD_TOKEN


class TokenExpired(TokenError):
    """The token was valid but has expired (close 4402)."""

    close_code = TOKEN_EXPIRED


@dataclass(frozen=True, slots=True)
class Claims:
    ids: tuple[str, ...]
    mode: str
    max_rate: float
    issued_at: int
    expires_at: int
    # Who registered the subscription: the access rules are checked again on ATTACH (and when
    # the rules change) against this identity, so a token is no bearer ticket for anyone else.
    user: str = ""
    groups: tuple[str, ...] = ()
    auth: str = "anonymous"
    address: str = ""
    # Array reduction (PROTOCOL.md section 4.6); 0 = off.
    max_columns: int = 0
    max_pixels: int = 0
    # Seconds of recorded history sent before each attachment's snapshot (PROTOCOL.md 2.8).
    backfill: float = 0.0


class Issued(NamedTuple):
    """A token and its expiry (POSIX seconds), as the signer made it."""

    token: str
    expires_at: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """Signs with `keys[signing_kid]`; verifies with any key in `keys`."""

    def __init__(
        self,
        keys: Mapping[str, bytes],
        signing_kid: str,
        ttl: float = limits.number("token_ttl_s"),
        clock: Callable[[], float] = time.time,
    ) -> None:
        if signing_kid not in keys:
            raise ValueError(f"signing key id {signing_kid!r} is not among the keys")
        for kid in keys:
            if not kid or "." in kid:
                raise ValueError(f"key id {kid!r} must be non-empty and contain no '.'")
        self._keys = dict(keys)
        self._kid = signing_kid
        self.ttl = ttl
        self._clock = clock

    def now(self) -> float:
        """The signer's clock (POSIX seconds): what `issue` stamps and `verify` checks against."""
        return self._clock()

    def issue(
        self,
        ids: Sequence[str],
        mode: str = "LATEST",
        max_rate: float = 0.0,
        *,
        user: str = "",
        groups: Sequence[str] = (),
        auth: str = "anonymous",
        address: str = "",
        not_after: float | None = None,
        max_columns: int = 0,
        max_pixels: int = 0,
        backfill: float = 0.0,
    ) -> Issued:
        """A token for `ids` and its expiry: after `ttl`, or at `not_after` (the identity's own
        expiry, e.g. its JWT's) if that comes first. The expiry comes from here rather than from
        verifying the token: a JWT accepted within its leeway after `exp` makes a token that has
        expired already, which `verify` would refuse."""
        now = int(self._clock())
        exp = now + int(self.ttl)
        if not_after is not None:
            exp = min(exp, int(not_after))
        payload: dict[str, object] = {
            "ids": list(ids),
            "mode": mode,
            "maxRate": max_rate,
            "iat": now,
            "exp": exp,
        }
        # Only when asked for: tokens without a reduction stay byte for byte as they were.
        if max_columns:
            payload["maxColumns"] = max_columns
        if max_pixels:
            payload["maxPixels"] = max_pixels
        if backfill:
            payload["backfill"] = backfill
        # PROTOCOL.md section 7: `sub`, `grp` and `src` belong to identified callers only; the
        # address goes with every token that has one, because host rules are checked again on
        # ATTACH and on a rules reload, for anonymous callers too.
        if user or groups or auth != "anonymous":
            payload.update(sub=user, grp=sorted(groups), src=auth)
        if address:
            payload["adr"] = address
        body = _b64(zlib.compress(json.dumps(payload, separators=(",", ":")).encode()))
        signed = f"{PREFIX}.{self._kid}.{body}"
        return Issued(f"{signed}.{self._mac(self._kid, signed)}", exp)

    def verify(self, token: str) -> Claims:
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenError("token too long")
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != PREFIX:
            raise TokenError("not a pvwire token (expected pvw1.<kid>.<payload>.<signature>)")
        _, kid, body, signature = parts
        if kid not in self._keys:
            raise TokenError(f"token signed with unknown key id {kid!r}")
        expected = self._mac(kid, f"{PREFIX}.{kid}.{body}")
        if not hmac.compare_digest(expected, signature):
            raise TokenError("token signature does not match")
        try:
            inflater = zlib.decompressobj()
            raw = inflater.decompress(_unb64(body), MAX_PAYLOAD_BYTES)
            if inflater.unconsumed_tail:
                raise ValueError("payload too large")
            payload = json.loads(raw)
            claims = Claims(
                ids=tuple(str(i) for i in payload["ids"]),
                mode=str(payload["mode"]),
                max_rate=float(payload["maxRate"]),
                issued_at=int(payload["iat"]),
                expires_at=int(payload["exp"]),
                user=str(payload.get("sub", "")),
                groups=tuple(str(g) for g in payload.get("grp", ())),
                auth=str(payload.get("src", "anonymous")),
                address=str(payload.get("adr", "")),
                max_columns=int(payload.get("maxColumns", 0)),
                max_pixels=int(payload.get("maxPixels", 0)),
                backfill=float(payload.get("backfill", 0.0)),
            )
        except (ValueError, KeyError, TypeError, zlib.error) as exc:
            raise TokenError(f"token payload unreadable: {exc}") from None
        if self._clock() >= claims.expires_at:
            raise TokenExpired(f"token expired at {claims.expires_at} (POSIX seconds)")
        return claims

    def _mac(self, kid: str, signed: str) -> str:
        return _b64(hmac.new(self._keys[kid], signed.encode(), hashlib.sha256).digest())
