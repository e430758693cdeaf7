"""The verification keys of an OIDC issuer, followed as the provider rotates them.

`--oidc-issuer URL`: the provider's discovery document (`URL/.well-known/openid-configuration`)
names its JWKS; the keys are fetched at start, again on a schedule (`refresh_s`, 10 min), and
again when a token names a key id they do not hold, at most once per `min_interval_s` (10 s): a
provider that rotates its keys (Keycloak adds a key, makes it active, then retires the old one)
needs no restart here, and a flood of tokens with made-up key ids costs the provider at most one
request per 10 s.

PyJWT's `PyJWKClient` does the JWKS fetch and the parsing (a well-kept client: timeout, no
redirects, the payload checked before it is used); the discovery document follows a redirect
only to a place `--oidc-issuer` itself could name (no plain http off loopback). PyJWKClient's
lookup (`get_signing_key`) is not used: it fetches in the caller's thread, which here is the event
loop; the fetches run in a worker thread and the keys are swapped in whole, so a lookup never
waits on the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt

from ..limits import number

__all__ = [
    "ALGORITHMS",
    "IssuerKeys",
    "ProviderInfo",
    "check_audience",
    "check_issuer",
    "usable_keys",
]

log = logging.getLogger("pvwire.access")

ALGORITHMS = ("RS256", "ES256")  # what a site's provider signs access tokens with


def check_audience(source: str, audience: str, parties: Sequence[str], any_audience: bool) -> None:
    """Refuses, naming the options to set, a source of verification keys (`--oidc-issuer`,
    `--jwks-file`) with neither an audience nor authorized parties: a provider signs the tokens
    of all its clients with the same keys, so the signature alone says a token came from the
    realm, not that it was meant for pvwire (ValueError). `any_audience` says that is meant."""
    if audience or parties or any_audience:
        return
    raise ValueError(
        f"{source} needs --jwt-audience AUD (the `aud` the provider puts in tokens meant for "
        "pvwire; Keycloak: an audience mapper, docs/ACCESS.md) or --jwt-authorized-party "
        "CLIENT_ID (the clients whose tokens are accepted, by `azp`): without one, a token the "
        "provider issued to any of its clients is accepted (--jwt-any-audience if that is "
        "what you mean)"
    )


def check_issuer(
    issuer: str,
    audience: str,
    parties: Sequence[str],
    allow_http: bool,
    any_audience: bool = False,
) -> None:
    """Refuses, naming the option to set, an issuer configuration that would accept tokens not
    meant for pvwire or verification keys fetched in the clear (ValueError)."""
    if not issuer.startswith(("https://", "http://")):
        raise ValueError(f"--oidc-issuer {issuer!r} is not an http(s) URL")
    check_audience(f"--oidc-issuer {issuer}", audience, parties, any_audience)
    if in_clear(issuer, allow_http):
        raise ValueError(
            f"--oidc-issuer {issuer} is plain http off loopback: the keys that check every "
            "token would travel unprotected, and anyone on the way could replace them. Use "
            "https, or --oidc-allow-http on a network you trust"
        )


def in_clear(url: str, allow_http: bool) -> bool:
    """`url` is plain http to another machine, and that is not allowed."""
    if allow_http or not url.startswith("http://"):
        return False
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name other than localhost may resolve anywhere


def usable_keys(jwks: jwt.PyJWKSet) -> dict[str, jwt.PyJWK]:
    """The signing keys of a JWKS by key id ("" for one without), RS256/ES256 only: Keycloak's
    JWKS also lists an encryption key (`use: enc`, RSA-OAEP), which must not verify tokens."""
    return {
        k.key_id or "": k
        for k in jwks.keys
        if k.public_key_use in ("sig", None) and k.algorithm_name in ALGORITHMS
    }


@dataclass(frozen=True, slots=True)
class ProviderInfo:
    """What the discovery document says, as far as pvwire and its clients use it."""

    issuer: str
    jwks_uri: str
    authorization_endpoint: str = ""
    token_endpoint: str = ""
    device_authorization_endpoint: str = ""
    end_session_endpoint: str = ""

    @classmethod
    def from_document(
        cls, issuer: str, doc: Mapping[str, Any], allow_http: bool = False
    ) -> ProviderInfo:
        # OpenID Connect Discovery 1.0, section 4.3: the document's issuer must be the one asked
        # for, or a provider could vouch for another one's tokens.
        if doc.get("issuer") != issuer:
            raise ValueError(f"discovery names issuer {doc.get('issuer')!r}, not {issuer!r}")
        if not isinstance(doc.get("jwks_uri"), str):
            raise ValueError("discovery document has no jwks_uri")
        if in_clear(doc["jwks_uri"], allow_http):
            raise ValueError(f"jwks_uri {doc['jwks_uri']} is plain http off loopback")

        def text(name: str) -> str:
            value = doc.get(name, "")
            return value if isinstance(value, str) else ""

        return cls(
            issuer,
            doc["jwks_uri"],
            text("authorization_endpoint"),
            text("token_endpoint"),
            text("device_authorization_endpoint"),
            text("end_session_endpoint"),
        )


class _RedirectNotInClear(urllib.request.HTTPRedirectHandler):
    """Follows a redirect unless it leads to plain http off loopback: an https issuer must not
    hand its discovery document, and so the JWKS it names, to an unprotected place."""

    def __init__(self, allow_http: bool) -> None:
        super().__init__()
        self.allow_http = allow_http

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        if in_clear(newurl, self.allow_http):
            fp.close()
            raise ValueError(f"{req.full_url} redirects to {newurl}: plain http off loopback")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def discover(issuer: str, timeout: float, allow_http: bool = False) -> ProviderInfo:
    """Blocking: the issuer's discovery document (run in a worker thread)."""
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    opener = urllib.request.build_opener(_RedirectNotInClear(allow_http))
    with opener.open(url, timeout=timeout) as response:
        doc = json.load(response)
    if not isinstance(doc, dict):
        raise ValueError(f"{url} is not a JSON object")
    return ProviderInfo.from_document(issuer, doc, allow_http)


class IssuerKeys:
    """The keys of one issuer, fetched over HTTP(S); `keys` is replaced whole on each fetch."""

    def __init__(
        self,
        issuer: str,
        refresh_s: float = number("oidc_refresh_s"),
        min_interval_s: float = number("oidc_min_interval_s"),
        timeout_s: float = number("oidc_fetch_timeout_s"),
        clock: Callable[[], float] = time.monotonic,
        allow_http: bool = False,
    ) -> None:
        if not issuer.startswith(("https://", "http://")):
            raise ValueError(f"--oidc-issuer {issuer!r} is not an http(s) URL")
        self.issuer = issuer
        self.allow_http = allow_http  # the JWKS may be plain http off loopback too
        self.refresh_s, self.min_interval_s, self.timeout_s = refresh_s, min_interval_s, timeout_s
        self._clock = clock
        self.provider: ProviderInfo | None = None
        self.keys: dict[str, jwt.PyJWK] = {}
        self.fetches = 0  # successful ones
        self._last_attempt = -float("inf")
        self._inflight: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._wanted = asyncio.Event()

    async def start(self) -> None:
        """The first fetch (a provider that does not answer yet is retried by the schedule:
        until then, every token is refused as `unknown_key`), then the schedule."""
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="oidc-keys")

    async def stop(self) -> None:
        for task in (self._task, self._inflight):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def may_refresh(self) -> bool:
        return self._clock() - self._last_attempt >= self.min_interval_s

    def want(self, kid: str) -> None:
        """A token named a key id not held: fetch again as soon as the rate limit allows."""
        if kid not in self.keys:
            self._wanted.set()

    async def refresh(self) -> None:
        """Fetch now (the fetch under way, if one is): the discovery document, then the JWKS."""
        if self._inflight is None or self._inflight.done():
            self._last_attempt = self._clock()
            self._inflight = asyncio.create_task(self._fetch())
        await asyncio.shield(self._inflight)

    async def _fetch(self) -> None:
        try:
            provider = self.provider
            if provider is None:
                provider = await asyncio.to_thread(
                    discover, self.issuer, self.timeout_s, self.allow_http
                )
                self.provider = provider
            client = jwt.PyJWKClient(provider.jwks_uri, cache_jwk_set=False,
                                     timeout=self.timeout_s)  # fmt: skip
            jwks = await asyncio.to_thread(client.get_jwk_set, True)
            keys = usable_keys(jwks)
            if not keys:
                raise ValueError(f"{provider.jwks_uri} holds no RS256 or ES256 signing key")
        except (OSError, ValueError, jwt.PyJWTError) as exc:
            # The keys in hand stay: a provider that is down for a minute must not log everyone
            # out. Logged each time, at most once per `min_interval_s`.
            log.warning("cannot fetch the keys of %s: %s", self.issuer, exc)
            return
        if set(keys) != set(self.keys):
            log.info("keys of %s: %s", self.issuer, sorted(keys))
        self.keys = keys
        self.fetches += 1

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                # Retried sooner while no key is held (a provider that was down at start).
                wait = self.refresh_s if self.keys else self.min_interval_s
                await asyncio.wait_for(self._wanted.wait(), wait)
            self._wanted.clear()
            delay = self.min_interval_s - (self._clock() - self._last_attempt)
            if delay > 0:
                await asyncio.sleep(delay)  # the rate limit, not a synchronisation
            await self.refresh()
