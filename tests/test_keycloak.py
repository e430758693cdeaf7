"""pvwire following a real identity provider (Keycloak, tests/keycloak.py): tokens it issues for
pvwire are accepted by `--oidc-issuer`, those it issues to another of its clients are not, and a
key rotation at the provider is followed without a restart."""

from __future__ import annotations

import asyncio
import html
import json
import os
import random
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import httpx
import jwt
import pytest
from pvwire_client import Client, Unauthenticated
from pvwire_client.login import login, stored_token

from tests.keycloak import OTHER, OTHER_SECRET, SERVICE, SERVICE_SECRET, Keycloak, dump
from tests.server_process import ServerProcess

# Keycloak's start (35-90 s here, tests/keycloak.py) counts against the first test that asks.
pytestmark = pytest.mark.timeout(600)

PVWIRE = str(Path(sys.executable).with_name("pvwire"))
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
        "--oidc-issuer", keycloak.issuer, "--oidc-client-id", "pvwire-page",
        "--jwt-audience", "pvwire",
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


async def test_a_token_the_provider_issued_to_another_client_is_refused(
    keycloak: Keycloak, server: ServerProcess
) -> None:
    """Signed with the realm's keys, naming an operator, but not meant for pvwire (its `aud`
    lacks `pvwire`): refused, as a token of any other application of the realm."""
    token = keycloak.service_token(OTHER, OTHER_SECRET)["access_token"]
    claims = dump(token)
    assert (claims["iss"], claims["azp"], claims["groups"]) == (
        keycloak.issuer, OTHER, ["operators"],
    )  # fmt: skip
    audience = claims.get("aud") or []
    assert "pvwire" not in ([audience] if isinstance(audience, str) else audience)
    async with Client(server.url, token=token) as c:
        with pytest.raises(Unauthenticated, match="audience"):
            await c.put("loc://kc_other", 1.0)


async def test_the_authorized_party_check_accepts_the_clients_it_names_only(
    keycloak: Keycloak, tmp_path: Path
) -> None:
    """`--jwt-authorized-party` instead of an audience (no mapper needed at the provider): the
    token's `azp`, the client it was issued to, must be one of those named."""
    (tmp_path / "rules.toml").write_text(RULES)
    with ServerProcess(
        "--oidc-issuer", keycloak.issuer, "--jwt-authorized-party", SERVICE,
        "--access-rules", str(tmp_path / "rules.toml"), "--log-level", "warning",
    ) as server:  # fmt: skip
        await put(server, keycloak.service_token()["access_token"])
        other = keycloak.service_token(OTHER, OTHER_SECRET)["access_token"]
        async with Client(server.url, token=other) as c:
            with pytest.raises(Unauthenticated, match=f"issued to client '{OTHER}'"):
                await c.put("loc://kc_rotation", 1.0)


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


# --- pvwire login ---------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's cache directory, and no PVWIRE_TOKEN: the clients use what login stored."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PVWIRE_TOKEN", raising=False)
    return tmp_path / "cache" / "pvwire" / "token.json"


def pvwire(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PVWIRE, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))  # fmt: skip


async def test_a_service_logs_in_with_its_secret_and_the_clients_use_the_token(
    keycloak: Keycloak, server: ServerProcess, cache: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret").write_text(SERVICE_SECRET + "\n")
    done = pvwire("login", "--server", server.url, "--client-id", SERVICE,
                  "--client-secret-file", str(tmp_path / "secret"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    stored = json.loads(cache.read_text())
    assert stored["issuer"] == keycloak.issuer
    # The command line and the Python client, with no token given: the stored one.
    assert pvwire("put", "--server", server.url, "loc://kc_login", "7.5").returncode == 0
    async with Client(server.url) as c:
        assert (await c.get("loc://kc_login")).value == 7.5
        assert (await c.put("loc://kc_login", 8.5, wait=True)).ok
    # Expired: renewed with the secret before the next request, and stored again.
    stored["expires_at"] = time.time() - 1
    cache.write_text(json.dumps(stored))
    async with Client(server.url) as c:
        assert (await c.put("loc://kc_login", 9.5, wait=True)).ok
    renewed = json.loads(cache.read_text())
    assert renewed["access_token"] != stored["access_token"]
    assert renewed["expires_at"] > time.time()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600


def approve(url: str, user: str, password: str) -> None:
    """What the person does in a browser: open the verification URL, sign in, grant access.

    Redirects are followed here, not by httpx: Keycloak marks its cookies Secure, which a cookie
    jar keeps from plain-HTTP requests, where a browser makes an exception for loopback."""
    with httpx.Client(timeout=60) as browser:

        def go(method: str, target: str, form: dict[str, str] | None = None) -> httpx.Response:
            r = browser.request(method, target, data=form)
            while True:
                for cookie in browser.cookies.jar:
                    cookie.secure = False
                if r.status_code not in (301, 302, 303, 307):
                    return r
                r = browser.get(urljoin(str(r.url), r.headers["location"]))

        page = go("GET", url)
        for _ in range(4):  # the login form, then the consent form
            action = re.search(r'<form[^>]*action="([^"]+)"', page.text)
            if action is None:
                break
            form = dict(
                re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text)
            )
            if 'name="password"' in page.text:
                form |= {"username": user, "password": password}
            else:
                form |= {"accept": "Yes"}
            page = go("POST", urljoin(str(page.url), html.unescape(action.group(1))), form)
        assert page.url.path.endswith("/device/status"), page.text[-2000:]


async def test_a_person_logs_in_with_the_device_grant(
    keycloak: Keycloak, server: ServerProcess, cache: Path
) -> None:
    shown: list[str] = []

    def show(text: str) -> None:
        """Approved before login polls: the poll then finds the token at once."""
        shown.append(text)
        url = re.search(r"https?://\S+", text)
        assert url is not None
        approve(url.group(0), "operator", "operator-pass")

    stored = await asyncio.to_thread(login, server.url, client_id="pvwire-cli", show=show)
    assert "enter the code" in shown[0]
    assert dump(stored["access_token"])["preferred_username"] == "operator"
    assert stored["refresh_token"]
    async with Client(server.url) as c:
        assert (await c.put("loc://kc_device", 3.25, wait=True)).ok
    # Expired: renewed with the refresh token.
    stored["expires_at"] = time.time() - 1
    cache.write_text(json.dumps(stored))
    assert stored_token() not in (None, stored["access_token"])
