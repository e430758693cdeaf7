"""`--oidc-issuer`: discovery and the JWKS over real HTTP from a provider started here on
127.0.0.1, key rotation followed without a restart, the refetch on an unknown key id bounded."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pvwire.access.identity import Authenticator, AuthError, JwtSettings
from pvwire.access.oidc import IssuerKeys, ProviderInfo, discover
from pvwire.access.refusals import RefusalLog

AUD = "pvwire"


class Provider:
    """A minimal OIDC provider: a discovery document and a JWKS that the test changes."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}  # kid -> private key
        self.jwks_requests = 0
        self.issuer_override: str | None = None
        self.discovery_moved_to: str | None = None  # answered with a redirect there
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/realms/ctrl/.well-known/openid-configuration" and (
                    provider.discovery_moved_to
                ):
                    self.send_response(302)
                    self.send_header("Location", provider.discovery_moved_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path in ("/realms/ctrl/.well-known/openid-configuration",
                                 "/moved/openid-configuration"):  # fmt: skip
                    body: Any = {"issuer": provider.issuer_override or provider.issuer,
                                 "jwks_uri": f"{provider.issuer}/certs",
                                 "token_endpoint": f"{provider.issuer}/token"}  # fmt: skip
                elif self.path == "/realms/ctrl/certs":
                    provider.jwks_requests += 1
                    body = {"keys": [provider.public(kid) for kid in provider.keys]}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self.httpd.server_address[1]}/realms/ctrl"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def add_key(self, kid: str, kind: str = "RS256") -> None:
        if kind == "RS256":
            self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        else:
            self.keys[kid] = ec.generate_private_key(ec.SECP256R1())

    def public(self, kid: str) -> dict[str, Any]:
        key = self.keys[kid]
        if isinstance(key, rsa.RSAPrivateKey):
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
            alg = "RS256"
        else:
            jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
            alg = "ES256"
        return {**jwk, "kid": kid, "use": "sig", "alg": alg}

    def token(self, kid: str, **extra: Any) -> str:
        now = int(time.time())
        claims = {"sub": "s-1", "preferred_username": "olga", "groups": ["operators"],
                  "iss": self.issuer, "aud": AUD, "iat": now, "exp": now + 300}  # fmt: skip
        claims.update(extra)
        key = self.keys[kid]
        alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
        return jwt.encode(claims, key, alg, headers={"kid": kid})

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def provider() -> Iterator[Provider]:
    p = Provider()
    p.add_key("k1")
    yield p
    p.close()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def make(provider: Provider, **settings: Any) -> Authenticator:
    return Authenticator(
        JwtSettings(**{"oidc_issuer": provider.issuer, "audience": AUD, **settings}),
        refusals=RefusalLog(),
    )


async def until(what: str, condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.02)


async def test_keys_come_from_discovery_and_tokens_are_checked(provider: Provider) -> None:
    auth = make(provider)
    await auth.start()
    try:
        who = await auth.authenticate(bearer(provider.token("k1")), "10.0.0.1", "query get")
        assert (who.user, who.groups, who.source) == ("olga", frozenset({"operators"}), "jwt")
        assert auth.provider is not None and auth.provider.token_endpoint.endswith("/token")
        # The issuer is checked without --jwt-issuer, the audience as configured.
        for token, reason in [(provider.token("k1", iss="http://127.0.0.1:1/other"), "issuer"),
                              (provider.token("k1", aud="other"), "audience")]:  # fmt: skip
            with pytest.raises(AuthError, match=reason):
                await auth.authenticate(bearer(token), "10.0.0.1")
        assert auth.refusals.counts["wrong_issuer"] == auth.refusals.counts["wrong_audience"] == 1
    finally:
        await auth.stop()


async def test_a_rotation_at_the_provider_is_followed_without_a_restart(
    provider: Provider,
) -> None:
    auth = make(provider, oidc_min_interval_s=0.0)
    await auth.start()
    try:
        assert (await auth.authenticate(bearer(provider.token("k1")), "10.0.0.1")).user == "olga"
        provider.add_key("k2", "ES256")  # a new active key...
        del provider.keys["k1"]  # ...and the old one retired
        who = await auth.authenticate(bearer(provider.token("k2")), "10.0.0.1")
        assert who.user == "olga"
        assert auth.issuer_keys is not None and set(auth.issuer_keys.keys) == {"k2"}
    finally:
        await auth.stop()


async def test_unknown_key_ids_cost_the_provider_one_fetch_per_interval(
    provider: Provider,
) -> None:
    """A flood of tokens with made-up key ids: refused as unknown_key, and the provider is asked
    again once (the interval is an hour here), not once per token."""
    auth = make(provider, oidc_min_interval_s=3600.0)
    await auth.start()
    try:
        started = provider.jwks_requests
        provider.add_key("evil")
        forged = provider.token("evil")
        del provider.keys["evil"]
        for _ in range(200):
            with pytest.raises(AuthError, match="key id 'evil'"):
                await auth.authenticate(bearer(forged), "10.6.6.6")
        assert provider.jwks_requests == started  # within the interval of the first fetch
        assert auth.refusals.counts["unknown_key"] == 200
    finally:
        await auth.stop()


async def test_the_keys_are_fetched_again_on_a_schedule(provider: Provider) -> None:
    auth = make(provider, oidc_refresh_s=0.05, oidc_min_interval_s=0.0)
    await auth.start()
    try:
        provider.add_key("k3")
        keys = auth.issuer_keys
        assert keys is not None
        await until("the schedule fetched k3", lambda: "k3" in keys.keys)
        # Found by the schedule, so the synchronous path (pvws) accepts it too.
        assert auth.identify(bearer(provider.token("k3")), "10.0.0.1").user == "olga"
    finally:
        await auth.stop()


async def test_a_provider_that_names_another_issuer_is_not_believed(provider: Provider) -> None:
    provider.issuer_override = "https://elsewhere.example"
    auth = make(provider)
    await auth.start()
    try:
        assert auth.provider is None and auth.issuer_keys is not None and not auth.issuer_keys.keys
        with pytest.raises(AuthError, match="key id 'k1' is not among"):
            await auth.authenticate(bearer(provider.token("k1")), "10.0.0.1")
    finally:
        await auth.stop()


async def test_a_provider_down_at_start_is_tried_again(provider: Provider) -> None:
    keys, provider.keys = provider.keys, {}  # answers, but with no usable key yet
    auth = make(provider, oidc_min_interval_s=0.05)
    await auth.start()
    try:
        assert auth.issuer_keys is not None and not auth.issuer_keys.keys
        provider.keys = keys
        await until("keys fetched again", lambda: bool(auth.issuer_keys and auth.issuer_keys.keys))
        assert (await auth.authenticate(bearer(provider.token("k1")), "10.0.0.1")).user == "olga"
    finally:
        await auth.stop()


def test_an_issuer_must_be_an_http_url() -> None:
    with pytest.raises(ValueError, match="not an http"):
        Authenticator(JwtSettings(oidc_issuer="ftp://x"))


def test_an_issuer_without_an_audience_or_authorized_party_is_refused(provider: Provider) -> None:
    """The provider signs every client's tokens with the same keys: without `aud` or `azp`,
    a token it issued to any other application would be accepted."""
    with pytest.raises(ValueError, match=r"--jwt-audience.*--jwt-authorized-party"):
        Authenticator(JwtSettings(oidc_issuer=provider.issuer))


async def test_the_authorized_party_names_the_clients_whose_tokens_count(
    provider: Provider,
) -> None:
    auth = make(provider, audience="", authorized_parties=("pvwire-page", "pvwire-cli"))
    await auth.start()
    try:
        for client in ("pvwire-page", "pvwire-cli"):
            token = provider.token("k1", azp=client, aud="account")
            assert (await auth.authenticate(bearer(token), "10.0.0.1")).user == "olga"
        for claims in ({"azp": "grafana"}, {}):
            token = provider.token("k1", **claims)
            with pytest.raises(AuthError, match="issued to client") as refused:
                await auth.authenticate(bearer(token), "10.0.0.1")
            assert refused.value.reason == "wrong_audience"
            assert ("'grafana'" if claims else "no azp claim") in str(refused.value)
    finally:
        await auth.stop()


@pytest.mark.parametrize(
    "issuer", ["http://sso.example.org/realms/ctrl", "http://10.1.2.3:8080/realms/ctrl"]
)
def test_a_plain_http_issuer_off_loopback_is_refused_unless_allowed(issuer: str) -> None:
    with pytest.raises(ValueError, match="--oidc-allow-http"):
        Authenticator(JwtSettings(oidc_issuer=issuer, audience=AUD))
    Authenticator(JwtSettings(oidc_issuer=issuer, audience=AUD, oidc_allow_http=True))
    for local in ("http://127.0.0.1:8080/r", "http://localhost/r", "http://[::1]/r"):
        Authenticator(JwtSettings(oidc_issuer=local, audience=AUD))
    Authenticator(JwtSettings(oidc_issuer="https://sso.example.org/realms/ctrl", audience=AUD))


def test_keys_named_by_an_https_issuer_over_plain_http_are_refused() -> None:
    issuer = "https://sso.example.org/realms/ctrl"
    doc = {"issuer": issuer, "jwks_uri": "http://sso.example.org/realms/ctrl/certs"}
    with pytest.raises(ValueError, match="plain http"):
        ProviderInfo.from_document(issuer, doc)
    assert ProviderInfo.from_document(issuer, doc, allow_http=True).jwks_uri == doc["jwks_uri"]


async def test_a_token_with_no_audience_is_refused_as_the_wrong_audience(
    provider: Provider,
) -> None:
    """As the provider issues them to a client without an audience mapper."""
    now = int(time.time())
    claims = {"sub": "s-1", "preferred_username": "olga", "iss": provider.issuer, "exp": now + 60}
    token = jwt.encode(claims, provider.keys["k1"], "RS256", headers={"kid": "k1"})
    auth = make(provider)
    await auth.start()
    try:
        with pytest.raises(AuthError, match="no audience") as refused:
            await auth.authenticate(bearer(token), "10.0.0.1")
        assert refused.value.reason == "wrong_audience"
    finally:
        await auth.stop()


def test_a_redirect_of_discovery_to_plain_http_off_loopback_is_refused(provider: Provider) -> None:
    """Discovery moved elsewhere: followed on loopback (or https), refused before any request
    to plain http on another machine, whose answer would name the keys."""
    provider.discovery_moved_to = (
        provider.issuer.rsplit("/realms", 1)[0] + "/moved/openid-configuration"
    )
    assert discover(provider.issuer, 10.0).jwks_uri == f"{provider.issuer}/certs"
    provider.discovery_moved_to = "http://sso.example.invalid/realms/ctrl/openid-configuration"
    with pytest.raises(ValueError, match=r"redirects to http://sso\.example\.invalid.*plain http"):
        discover(provider.issuer, 10.0)


async def test_a_provider_that_never_answers_costs_one_timeout_not_a_hang(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Beyond `oidc_fetch_timeout_s` the fetch gives up, logs why and keeps the keys in hand
    (none here); the schedule tries again later."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connects, never answers
        issuer = f"http://127.0.0.1:{silent.getsockname()[1]}/realms/ctrl"
        keys = IssuerKeys(issuer, timeout_s=0.5)
        await keys.refresh()
    assert keys.keys == {} and keys.provider is None and keys.fetches == 0
    assert "cannot fetch the keys" in caplog.text and "timed out" in caplog.text
