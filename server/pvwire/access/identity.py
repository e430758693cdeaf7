"""Who a request is: a bearer JWT, a trusted proxy's user header, or anonymous.

JWTs are checked with PyJWT (a well-kept library; no home-made crypto): the signature (HS256 with
a shared secret, or RS256/ES256 with the keys of a JWKS file or of an OIDC issuer followed over
HTTP, access/oidc.py, as a site's OIDC provider issues them), `exp` and `nbf` with a clock-skew
leeway, `iss` and `aud` when configured. `alg: none` and any algorithm not configured are
refused. A present but bad token is an error, never a silent fall back to anonymous: a user
whose token expired must be told, not quietly demoted.

A reverse proxy that authenticated the user passes the name in a header; it is believed only from
the listed proxy networks. Behind those, the client's real address is the right-most
`X-Forwarded-For` entry that is no listed proxy (access/forwarded.py): the one address every
rule, bound and audit line keys on, so `client_address` is the only place it is derived.

Every refusal, and a user header from an address that is no trusted proxy, goes to `refusals`
(access/refusals.py: audited with the reason and the request's operation, counted, bounded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

from ..limits import number
from . import forwarded
from .bound_key import bound_key
from .oidc import (
    ALGORITHMS,
    IssuerKeys,
    ProviderInfo,
    check_audience,
    check_issuer,
    usable_keys,
)
from .refusals import RefusalLog

__all__ = ["ANONYMOUS", "AuthError", "Authenticator", "Identity", "JwtSettings"]


class AuthError(Exception):
    """The request's credentials are present but not acceptable (HTTP 401 UNAUTHENTICATED)."""

    code = "UNAUTHENTICATED"

    def __init__(self, message: str, reason: str = "malformed_token") -> None:
        super().__init__(message)
        self.reason = reason  # one of refusals.REASONS: what the audit file and metrics say


@dataclass(frozen=True, slots=True)
class Identity:
    user: str  # "" for anonymous
    groups: frozenset[str] = frozenset()
    source: str = "anonymous"  # jwt | proxy | anonymous
    address: str = ""  # the real client address (behind a trusted proxy: the forwarded one)
    expires_at: float | None = None  # POSIX seconds; a stream token never outlives it

    @property
    def anonymous(self) -> bool:
        return not self.user

    def describe(self) -> str:
        return self.user or "anonymous"

    @property
    def bound_key(self) -> str:
        """What the bounds kept per address count this client under (its IPv6 /64)."""
        return bound_key(self.address)

    @property
    def rate_key(self) -> str:
        """Whose budget a rate-limited request spends: the user's, else its address's."""
        return self.user or bound_key(self.address)


ANONYMOUS = Identity("")


@dataclass(frozen=True, slots=True)
class JwtSettings:
    secret_file: str = ""  # HS256 shared secret
    jwks_file: str = ""  # RS256/ES256 public keys
    oidc_issuer: str = ""  # an OIDC provider whose keys are fetched and followed
    oidc_refresh_s: float = number("oidc_refresh_s")  # keys fetched again this often
    oidc_min_interval_s: float = number(
        "oidc_min_interval_s"
    )  # and on an unknown key id, at most this often
    issuer: str = ""
    audience: str = ""
    authorized_parties: tuple[str, ...] = ()  # accepted `azp`s (the clients tokens are for)
    # Keys that sign other clients' tokens too (a JWKS, an issuer's) with neither of the two
    # above: refused at start unless this says any audience is meant.
    any_audience: bool = False
    oidc_allow_http: bool = False  # an issuer (and its JWKS) over plain http off loopback
    groups_claim: str = "groups"
    user_claim: str = "preferred_username"  # falls back to `sub`
    leeway_s: float = number("jwt_leeway_s")

    @property
    def enabled(self) -> bool:
        return bool(self.secret_file or self.jwks_file or self.oidc_issuer)

    @property
    def expected_issuer(self) -> str:
        """The `iss` a token must carry: the one configured, else the OIDC issuer's."""
        return self.issuer or self.oidc_issuer


@dataclass
class Authenticator:
    jwt_settings: JwtSettings = field(default_factory=JwtSettings)
    trusted_proxies: Sequence[str] = ()  # CIDRs
    user_header: str = ""  # e.g. X-Remote-User, believed only from trusted proxies
    groups_header: str = ""  # comma-separated groups from the proxy, optional
    refusals: RefusalLog = field(default_factory=RefusalLog)

    def __post_init__(self) -> None:
        self._proxies = forwarded.TrustedProxies(self.trusted_proxies)
        self._secret: str | None = None  # HS256
        self._jwks: dict[str, jwt.PyJWK] = {}  # key id ("" when the JWKS has none) -> key
        self._algorithms: list[str] = []
        self.issuer_keys: IssuerKeys | None = None
        s = self.jwt_settings
        if s.secret_file:
            secret = Path(s.secret_file).read_text().strip()
            if len(secret) < 32:
                # RFC 7518 section 3.2: an HS256 key must be at least 256 bits.
                raise ValueError(f"{s.secret_file}: an HS256 secret needs at least 32 characters")
            self._secret = secret
            self._algorithms.append("HS256")
        if s.jwks_file:
            check_audience(f"--jwks-file {s.jwks_file}", s.audience, s.authorized_parties,
                           s.any_audience)  # fmt: skip
            jwks = jwt.PyJWKSet.from_json(Path(s.jwks_file).read_text())
            for key in jwks.keys:
                if key.algorithm_name not in ALGORITHMS:
                    raise ValueError(f"{s.jwks_file}: key {key.key_id!r} is not RS256 or ES256")
            self._jwks = usable_keys(jwks)
            for key in self._jwks.values():
                if key.algorithm_name not in self._algorithms:
                    self._algorithms.append(key.algorithm_name)
        if s.oidc_issuer:
            check_issuer(
                s.oidc_issuer, s.audience, s.authorized_parties, s.oidc_allow_http, s.any_audience
            )
            self.issuer_keys = IssuerKeys(
                s.oidc_issuer, s.oidc_refresh_s, s.oidc_min_interval_s,
                allow_http=s.oidc_allow_http,
            )  # fmt: skip
            self._algorithms += [a for a in ALGORITHMS if a not in self._algorithms]

    @property
    def provider(self) -> ProviderInfo | None:
        """The OIDC provider's endpoints, once its discovery document was read."""
        return self.issuer_keys.provider if self.issuer_keys else None

    async def start(self) -> None:
        if self.issuer_keys is not None:
            await self.issuer_keys.start()

    async def stop(self) -> None:
        if self.issuer_keys is not None:
            await self.issuer_keys.stop()
        self.refusals.close()

    async def authenticate(
        self, headers: Mapping[str, str], peer: str, operation: str | Callable[[], str] = ""
    ) -> Identity:
        """`identify`, after fetching the issuer's keys again if the token names a key id they
        do not hold (when the rate limit allows): the first token signed with a provider's new
        key is accepted, not refused until the next scheduled fetch."""
        keys = self.issuer_keys
        if keys is not None and keys.may_refresh():
            kid = self._unknown_kid(headers.get("authorization", ""))
            if kid is not None:
                await keys.refresh()
        return self.identify(headers, peer, operation)

    def _unknown_kid(self, auth: str) -> str | None:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or self.issuer_keys is None:
            return None
        try:
            kid = jwt.get_unverified_header(token.strip()).get("kid")
        except jwt.PyJWTError:
            return None
        if isinstance(kid, str) and kid not in self._jwks and kid not in self.issuer_keys.keys:
            return kid
        return None

    @property
    def configured(self) -> bool:
        """Whether any way to tell users apart is set up."""
        return bool(self._algorithms) or bool(self._proxies and self.user_header)

    def client_address(self, headers: Mapping[str, str], peer: str) -> str:
        """The real client's address: the TCP peer, or when that is a trusted proxy, the
        right-most `X-Forwarded-For` entry (all its lines, in order) that is no trusted proxy
        (`Forwarded`'s `for=` when there is no `X-Forwarded-For`; access/forwarded.py). An
        IPv4-mapped IPv6 peer (a dual-stack socket's IPv4 client) is its IPv4 address."""
        ip = forwarded.parse_node(peer)
        plain = peer if ip is None else str(ip)
        if ip is None or not self._proxies.holds(ip):
            return plain
        return forwarded.client_address(
            plain, _lines(headers, "x-forwarded-for"), _lines(headers, "forwarded"), self._is_proxy
        )

    def identify(
        self, headers: Mapping[str, str], peer: str, operation: str | Callable[[], str] = ""
    ) -> Identity:
        """The identity of a request with these headers from the TCP peer `peer`.

        `operation` names what the request asks (a GraphQL operation, `pvws`) for the audit
        line of a refusal; a function is called only then."""
        trusted = self._trusted(peer)
        address = self.client_address(headers, peer)
        auth = headers.get("authorization", "")
        if auth:
            try:
                scheme, _, token = auth.partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    raise AuthError(
                        "Authorization header must be 'Bearer <token>'", "malformed_header"
                    )
                return self._from_jwt(token.strip(), address)
            except AuthError as exc:
                self._refused(exc.reason, address, operation, str(exc))
                raise
        user = headers.get(self.user_header.lower(), "").strip() if self.user_header else ""
        if user and trusted:
            groups = headers.get(self.groups_header.lower(), "") if self.groups_header else ""
            names = frozenset(g.strip() for g in groups.split(",") if g.strip())
            return Identity(user, names, "proxy", address)
        if user:
            # Ignored, as it must be: only a trusted proxy vouches for a user. But someone
            # tried to be `user`, and that is worth a line.
            detail = f"{self.user_header} from {peer}, which is no trusted proxy"
            self._refused("untrusted_proxy_header", address, operation, detail, user[:100])
        return Identity("", frozenset(), "anonymous", address)

    def _refused(
        self,
        reason: str,
        address: str,
        operation: str | Callable[[], str],
        detail: str,
        user: str = "",
    ) -> None:
        op = operation if isinstance(operation, str) else operation()
        self.refusals.refused(reason, address, op, detail, user)

    def _trusted(self, peer: str) -> bool:
        return self._proxies.lists(peer)

    def _is_proxy(self, ip: forwarded.Address) -> bool:
        return self._proxies.holds(ip)

    def _from_jwt(self, token: str, address: str) -> Identity:
        if not self._algorithms:
            raise AuthError(
                "this server accepts no bearer tokens (no JWT secret or JWKS configured)",
                "no_keys",
            )
        s = self.jwt_settings
        try:
            header = jwt.get_unverified_header(token)
            alg = header.get("alg")
            if alg not in self._algorithms:
                # Also refuses `alg: none`: PyJWT would too, this says why in plain words.
                raise AuthError(
                    f"token algorithm {alg!r} not accepted ({self._algorithms})", "bad_algorithm"
                )
            key = self._secret if alg == "HS256" else self._public_key(header.get("kid"))
            if key is None:
                raise AuthError(
                    f"token key id {header.get('kid')!r} is not among the server's keys"
                    + (f" (JWKS {s.jwks_file})" if s.jwks_file else "")
                    + (f" (issuer {s.oidc_issuer})" if s.oidc_issuer else ""),
                    "unknown_key",
                )
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=self._algorithms,
                audience=s.audience or None,
                issuer=s.expected_issuer or None,
                leeway=s.leeway_s,
                options={
                    "require": ["exp"],
                    "verify_aud": bool(s.audience),
                    "verify_iss": bool(s.expected_issuer),
                },
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("token expired", "expired") from None
        except jwt.ImmatureSignatureError:
            raise AuthError("token not valid yet (nbf)", "not_yet_valid") from None
        except jwt.InvalidAudienceError:
            raise AuthError(f"token audience is not {s.audience!r}", "wrong_audience") from None
        except jwt.MissingRequiredClaimError as exc:
            if exc.claim != "aud":
                raise AuthError(f"token rejected: {exc}") from None
            # Another client's token, as a provider issues them without an audience mapper.
            raise AuthError(f"token names no audience, not {s.audience!r}",
                            "wrong_audience") from None  # fmt: skip
        except jwt.InvalidIssuerError:
            raise AuthError(f"token issuer is not {s.expected_issuer!r}", "wrong_issuer") from None
        except jwt.InvalidAlgorithmError:
            raise AuthError(
                f"token algorithm not accepted (accepted: {self._algorithms})", "bad_algorithm"
            ) from None
        except jwt.InvalidSignatureError:
            raise AuthError("token signature does not verify", "bad_signature") from None
        except jwt.PyJWTError as exc:
            raise AuthError(f"token rejected: {exc}") from None
        if s.authorized_parties and (azp := claims.get("azp")) not in s.authorized_parties:
            # Not 'None' for a token without `azp`: the user should see the claim is missing.
            client = "(none named: no azp claim)" if azp is None else repr(str(azp)[:100])
            raise AuthError(
                f"token was issued to client {client}, not one of {list(s.authorized_parties)}",
                "wrong_audience",
            )
        user = str(claims.get(s.user_claim) or claims.get("sub") or "")
        if not user:
            raise AuthError(
                f"token names no user (claims {s.user_claim!r} and 'sub' are empty)", "no_user"
            )
        raw_groups = claims.get(s.groups_claim, [])
        if isinstance(raw_groups, str):
            raw_groups = raw_groups.split()
        groups = (
            frozenset(str(g) for g in raw_groups) if isinstance(raw_groups, list) else frozenset()
        )
        return Identity(user, groups, "jwt", address, float(claims["exp"]))

    def _public_key(self, kid: object) -> Any:
        """The key for a token's key id, from the JWKS file or the issuer's keys; a token
        without one is fine while a single key is held."""
        held = dict(self._jwks)
        if self.issuer_keys is not None:
            held.update(self.issuer_keys.keys)
        if isinstance(kid, str) and kid:
            found = held.get(kid)
            if found is None and self.issuer_keys is not None:
                self.issuer_keys.want(kid)
            return found.key if found is not None else None
        return next(iter(held.values())).key if len(held) == 1 else None

    def is_proxy(self, peer: str) -> bool:
        """`peer` is a listed trusted proxy: who the client is, it says in the headers
        (`client_address`); the connection table counts its clients by that (api/connections.py)."""
        return self._trusted(peer)


def _lines(headers: Mapping[str, str], name: str) -> list[str]:
    """Every line of header `name`, in order: Starlette's headers hold them all (`getlist`),
    where `get` gives the first alone; a plain mapping holds one."""
    getlist = getattr(headers, "getlist", None)
    if getlist is not None:
        return list(getlist(name))
    value = headers.get(name)
    return [] if value is None else [value]
