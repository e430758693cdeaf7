"""pvwire following a real identity provider (Keycloak, tests/keycloak.py): tokens it issues are
accepted by `--oidc-issuer`, and a key rotation at the provider is followed without a restart."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from pvwire_client import Client, Unauthenticated

from tests.keycloak import Keycloak, dump
from tests.server_process import ServerProcess

# Keycloak's start (75-90 s on a busy machine, more the first time) counts against the first
# test that asks for it.
pytestmark = pytest.mark.timeout(600)

RULES = """
default = "READ"
[[rule]]
channels = ["loc://kc*"]
groups = ["operators"]
access = "WRITE"
"""


@pytest.fixture(scope="module")
def server(keycloak: Keycloak, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder: Path = tmp_path_factory.mktemp("keycloak")
    (folder / "rules.toml").write_text(RULES)
    # The rate limit of refetches on an unknown key id off, so the first token signed with the
    # rotated key is accepted however soon after the start it comes.
    with ServerProcess(
        "--oidc-issuer", keycloak.issuer, "--jwt-audience", "pvwire",
        "--access-rules", str(folder / "rules.toml"), "--log-level", "warning",
        env={"PVWIRE_OIDC_MIN_INTERVAL_S": "0"},
    ) as s:  # fmt: skip
        yield s


async def put(server: ServerProcess, token: str) -> float:
    value = round(random.uniform(-100, 100), 3)
    async with Client(server.url, token=token) as c:
        assert (await c.put("loc://kc_rotation", value, wait=True)).ok
        assert (await c.get("loc://kc_rotation")).value == value
    return value


async def test_the_providers_tokens_name_the_user_and_groups(
    keycloak: Keycloak, server: ServerProcess
) -> None:
    token = keycloak.service_token()["access_token"]
    claims = dump(token)
    assert (claims["iss"], claims["groups"]) == (keycloak.issuer, ["operators"])
    assert "pvwire" in ([claims["aud"]] if isinstance(claims["aud"], str) else claims["aud"])
    await put(server, token)


async def test_a_key_rotation_at_the_provider_is_followed_without_a_restart(
    keycloak: Keycloak, server: ServerProcess
) -> None:
    pid = server.pid
    before = keycloak.service_token()["access_token"]
    await put(server, before)
    old_kid = jwt.get_unverified_header(before)["kid"]

    new_kid = keycloak.rotate_rs256()
    assert new_kid != old_kid
    after = keycloak.service_token()["access_token"]
    assert jwt.get_unverified_header(after)["kid"] == new_kid
    await put(server, after)  # the first token with the new key: accepted
    assert server.pid == pid  # by the same process

    # The old key is gone from the provider, so from the server too.
    async with Client(server.url, token=before) as c:
        with pytest.raises(Unauthenticated, match="key id"):
            await c.put("loc://kc_rotation", 1.0)
