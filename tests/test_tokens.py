"""What a stream token carries (PROTOCOL.md section 7)."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

from pvwire.wire.tokens import TokenSigner

SIGNER = TokenSigner({"k1": b"key"}, "k1", clock=lambda: 1_700_000_000.0)


def payload(token: str) -> dict[str, Any]:
    body = token.split(".")[2]
    data: dict[str, Any] = json.loads(
        zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    )
    return data


def test_an_anonymous_token_has_no_identity_keys_but_keeps_the_address() -> None:
    token = SIGNER.issue(["ca://X"], address="192.0.2.7").token
    assert set(payload(token)) == {"ids", "mode", "maxRate", "iat", "exp", "adr"}
    claims = SIGNER.verify(token)
    assert (claims.user, claims.groups, claims.auth, claims.address) == (
        "",
        (),
        "anonymous",
        "192.0.2.7",
    )


def test_an_anonymous_token_without_an_address_has_only_the_subscription() -> None:
    assert set(payload(SIGNER.issue(["ca://X"]).token)) == {"ids", "mode", "maxRate", "iat", "exp"}


def test_an_identified_token_carries_who_registered_it() -> None:
    token = SIGNER.issue(
        ["ca://X"], user="ada", groups=["ops", "bl01"], auth="jwt", address="::1"
    ).token
    p = payload(token)
    assert (p["sub"], p["grp"], p["src"], p["adr"]) == ("ada", ["bl01", "ops"], "jwt", "::1")
    claims = SIGNER.verify(token)
    assert (claims.user, claims.groups, claims.auth) == ("ada", ("bl01", "ops"), "jwt")
