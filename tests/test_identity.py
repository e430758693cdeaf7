"""Who a request is: bearer JWTs (HS256 and RS256 through a JWKS file) as a site's OIDC provider
issues them, a trusted proxy's user header, or anonymous. Tokens are minted here with PyJWT."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pvwire.access.identity import Authenticator, AuthError, JwtSettings

SECRET = "s" * 48
ISS, AUD = "https://sso.example.org/realms/ctrl", "pvwire"


def claims(**extra: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"sub": "u-123", "preferred_username": "alice", "groups": ["operators"], "iss": ISS,
            "aud": AUD, "iat": now, "exp": now + 300}  # fmt: skip
    base.update(extra)
    return base


@pytest.fixture
def hs(tmp_path: Path) -> Authenticator:
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    return Authenticator(JwtSettings(secret_file=str(secret), issuer=ISS, audience=AUD))


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_hs256_token_names_the_user_and_groups(hs: Authenticator) -> None:
    who = hs.identify(bearer(jwt.encode(claims(), SECRET, "HS256")), "10.0.0.7")
    assert (who.user, who.groups, who.source, who.address) == (
        "alice",
        frozenset({"operators"}),
        "jwt",
        "10.0.0.7",
    )
    assert who.expires_at is not None and who.expires_at > time.time()


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (lambda: jwt.encode(claims(exp=int(time.time()) - 600), SECRET, "HS256"), "expired"),
        (lambda: jwt.encode(claims(nbf=int(time.time()) + 600), SECRET, "HS256"), "not valid yet"),
        (lambda: jwt.encode(claims(aud="other"), SECRET, "HS256"), "audience"),
        (lambda: jwt.encode(claims(iss="https://evil"), SECRET, "HS256"), "issuer"),
        (lambda: jwt.encode(claims(), "x" * 48, "HS256"), "signature"),
        (lambda: jwt.encode(claims(), "", "none"), "algorithm 'none'"),
        (lambda: "not.a.jwt", "rejected"),
        (lambda: jwt.encode({k: v for k, v in claims().items() if k != "exp"}, SECRET, "HS256"),
         "exp"),
    ],
)  # fmt: skip
def test_bad_tokens_are_refused_with_the_reason(
    hs: Authenticator, token: Any, message: str
) -> None:
    with pytest.raises(AuthError, match=message):
        hs.identify(bearer(token()), "10.0.0.7")


def test_clock_skew_is_allowed(hs: Authenticator) -> None:
    token = jwt.encode(claims(exp=int(time.time()) - 30), SECRET, "HS256")  # leeway 60 s
    assert hs.identify(bearer(token), "10.0.0.7").user == "alice"


def test_malformed_authorization_header_is_an_error(hs: Authenticator) -> None:
    with pytest.raises(AuthError, match="Bearer"):
        hs.identify({"authorization": "Basic YWxpY2U6cHc="}, "10.0.0.7")


def test_rs256_and_es256_through_a_jwks_file(tmp_path: Path) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    keys = []
    for kid, key, alg in (("r1", rsa_key, "RS256"), ("e1", ec_key, "ES256")):
        algo = jwt.get_algorithm_by_name(alg)
        jwk = json.loads(algo.to_jwk(key.public_key()))
        keys.append({**jwk, "kid": kid, "alg": alg, "use": "sig"})
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": keys}))
    auth = Authenticator(JwtSettings(jwks_file=str(jwks), audience=AUD, groups_claim="roles"))
    rs = jwt.encode(claims(roles=["viewers"]), rsa_key, "RS256", headers={"kid": "r1"})
    es = jwt.encode(claims(preferred_username="bob"), ec_key, "ES256", headers={"kid": "e1"})
    assert auth.identify(bearer(rs), "::1").groups == frozenset({"viewers"})
    assert auth.identify(bearer(es), "::1").user == "bob"
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode(claims(), other, "RS256", headers={"kid": "r1"})
    with pytest.raises(AuthError, match="signature"):
        auth.identify(bearer(forged), "::1")
    with pytest.raises(AuthError, match="algorithm 'HS256'"):
        auth.identify(bearer(jwt.encode(claims(), SECRET, "HS256")), "::1")
    with pytest.raises(AuthError, match="key id"):
        auth.identify(bearer(jwt.encode(claims(), rsa_key, "RS256", headers={"kid": "x"})), "::1")


def test_proxy_header_counts_only_from_trusted_proxies() -> None:
    """The address is the right-most forwarded entry that is no trusted proxy: what the client
    wrote itself (192.168.10.5, first) is not it; a trusted hop (10.1.0.9) is walked through."""
    auth = Authenticator(
        trusted_proxies=["10.1.0.0/16"], user_header="X-Remote-User", groups_header="X-Groups"
    )
    headers = {"x-remote-user": "carol", "x-groups": "operators, viewers",
               "x-forwarded-for": "192.168.10.5, 192.0.2.5, 10.1.0.9"}  # fmt: skip
    who = auth.identify(headers, "10.1.2.3")
    assert (who.user, who.groups, who.source, who.address) == (
        "carol",
        frozenset({"operators", "viewers"}),
        "proxy",
        "192.0.2.5",
    )
    untrusted = auth.identify(headers, "192.0.2.77")
    assert untrusted.anonymous and untrusted.address == "192.0.2.77"  # header ignored


def test_no_credentials_is_anonymous_and_a_bearer_without_keys_is_refused() -> None:
    auth = Authenticator()
    assert auth.identify({}, "127.0.0.1").anonymous
    with pytest.raises(AuthError, match="accepts no bearer tokens"):
        auth.identify(bearer("abc"), "127.0.0.1")


def test_short_hs256_secret_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("short")
    with pytest.raises(ValueError, match="32 characters"):
        Authenticator(JwtSettings(secret_file=str(secret)))


def jwks_file(tmp_path: Path) -> tuple[Path, Any]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.get_algorithm_by_name("RS256").to_jwk(key.public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "r1", "alg": "RS256", "use": "sig"}]}))
    return path, key


def test_a_jwks_file_needs_an_audience_unless_any_audience_is_meant(tmp_path: Path) -> None:
    """A realm's keys sign every one of its clients' tokens: a token minted for Grafana must not
    count here just because the keys verify it."""
    path, key = jwks_file(tmp_path)
    with pytest.raises(ValueError, match=r"--jwks-file .*--jwt-audience.*--jwt-authorized-party"):
        Authenticator(JwtSettings(jwks_file=str(path)))
    grafana = jwt.encode(claims(aud="grafana"), key, "RS256", headers={"kid": "r1"})
    for settings in (
        JwtSettings(jwks_file=str(path), audience=AUD),
        JwtSettings(jwks_file=str(path), authorized_parties=("pvwire-page",)),
    ):
        auth = Authenticator(settings)
        with pytest.raises(AuthError) as refused:
            auth.identify(bearer(grafana), "10.0.0.7")
        assert refused.value.reason == "wrong_audience"
    anyone = Authenticator(JwtSettings(jwks_file=str(path), any_audience=True))
    assert anyone.identify(bearer(grafana), "10.0.0.7").user == "alice"


def test_the_server_names_the_audience_options_at_start_and_warns_of_a_bare_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pvwire.cli import _check_bearer_keys
    from pvwire.config import Settings

    path, _ = jwks_file(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        _check_bearer_keys(Settings(jwks_file=str(path)))
    message = str(stopped.value)
    assert message.startswith(f"pvwire-server: --jwks-file {path} needs --jwt-audience")
    assert "--jwt-authorized-party" in message and "--jwt-any-audience" in message
    _check_bearer_keys(Settings(jwks_file=str(path), jwt_audience=AUD))
    _check_bearer_keys(Settings(jwks_file=str(path), jwt_any_audience=True))
    # The issuer's own message names the option that lets any audience through, too.
    with pytest.raises(SystemExit, match="--jwt-any-audience"):
        _check_bearer_keys(Settings(oidc_issuer=ISS))
    _check_bearer_keys(Settings(oidc_issuer=ISS, jwt_any_audience=True))
    # pvwire's own HS256 secret: a warning, not a refusal.
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    with caplog.at_level("WARNING", logger="pvwire.access"):
        _check_bearer_keys(Settings(jwt_secret_file=str(secret)))
    (warned,) = [r.getMessage() for r in caplog.records]
    assert "--jwt-audience" in warned and str(secret) in warned
    caplog.clear()
    with caplog.at_level("WARNING", logger="pvwire.access"):
        _check_bearer_keys(Settings(jwt_secret_file=str(secret), jwt_audience=AUD))
    assert not caplog.records
