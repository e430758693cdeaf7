"""pvwire_client and the ``pvwire`` command with identities, against a real server with a JWT
secret and an access rules file, in front of the shared test IOC. JWTs are minted here (HS256).

Operators may write ca://PVW:AO; viewers may read everything but ca://PVW:MBBO; anonymous reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from pvwire_client import (
    Client,
    Forbidden,
    StreamRefused,
    Unauthenticated,
    Update,
    WriteDenied,
)
from pvwire_client.sync import SyncClient
from pvwire_dev.ioc import IocProcess

from tests.server_process import ServerProcess

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]

SECRET = "identity-e2e-secret-not-for-production-0123456789"
RULES = """
default = "READ"
[[rule]]
channels = ["ca://PVW:AO"]
groups = ["operators"]
access = "WRITE"
[[rule]]
channels = ["ca://PVW:MBBO"]
groups = ["viewers"]
access = "NONE"
"""
PVWIRE = str(Path(sys.executable).with_name("pvwire"))


# Long enough for the tokens below, minted when the module is collected at the session's start
# and used up to a loaded run's length later (CI stops at 90 min).
SESSION_TTL = 4 * 3600


def mint(user: str, *groups: str, ttl: float = SESSION_TTL) -> str:
    now = int(time.time())
    claims = {"sub": user, "preferred_username": user, "groups": list(groups), "iat": now,
              "exp": now + int(ttl), "iss": "https://idp.example", "aud": "pvwire"}  # fmt: skip
    return jwt.encode(claims, SECRET, "HS256")


OPERATOR, VIEWER = mint("olga", "operators"), mint("vic", "viewers")
WRONG_KEY = jwt.encode(
    {"sub": "x", "aud": "pvwire"}, "a-wrong-secret-of-thirty-two-bytes!", "HS256"
)


def server_args(folder: Path) -> list[str]:
    (folder / "secret").write_text(SECRET)
    if not (folder / "rules.toml").exists():
        (folder / "rules.toml").write_text(RULES)
    return [
        "--jwt-secret-file", str(folder / "secret"), "--jwt-issuer", "https://idp.example",
        "--jwt-audience", "pvwire", "--access-rules", str(folder / "rules.toml"),
        "--log-level", "warning",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("identity")


@pytest.fixture(scope="module")
def server(epics_env: IocProcess, folder: Path) -> Iterator[ServerProcess]:
    with ServerProcess(*server_args(folder)) as s:
        yield s


async def take(it: AsyncIterator[Update], n: int, timeout: float = 20) -> list[Update]:
    out: list[Update] = []
    async with asyncio.timeout(timeout):
        async for u in it:
            out.append(u)
            if len(out) == n:
                break
    return out


async def test_an_operator_writes_a_viewer_and_anonymous_cannot(server: ServerProcess) -> None:
    target = round(random.uniform(-50, 50), 3)
    async with Client(server.url, token=OPERATOR) as c:
        assert (await c.put("ca://PVW:AO", target, wait=True)).ok
        assert (await c.get("ca://PVW:AO")).value == target
    for token in (VIEWER, ""):
        async with Client(server.url, token=token) as c:
            with pytest.raises(WriteDenied):
                await c.put("ca://PVW:AO", target + 1)
            assert (await c.get("ca://PVW:AO")).value == target


async def test_monitor_shows_the_access_of_this_identity(server: ServerProcess) -> None:
    async with Client(server.url, token=OPERATOR) as c:
        ao, ai = (u.channel for u in await take(c.monitor(["ca://PVW:AO", "ca://PVW:AI"]), 2))
        assert (ao.access, ao.writable, ai.access, ai.writable) == ("WRITE", True, "READ", False)
        # What the stream says the upstream allows, and GraphQL computed for this identity.
        assert ao.metadata.get("writable") is not False
        assert (await c.get("ca://PVW:AO")).writable
    async with Client(server.url, token=VIEWER) as c:
        (u,) = await take(c.monitor("ca://PVW:AO"), 1)
        assert (u.channel.access, u.channel.writable) == ("READ", False)
        assert not (await c.get("ca://PVW:AO")).writable


async def test_a_channel_denied_to_the_identity_is_refused(server: ServerProcess) -> None:
    async with Client(server.url, token=VIEWER) as c:
        with pytest.raises(Forbidden, match="ca://PVW:MBBO"):
            await take(c.monitor(["ca://PVW:AI", "ca://PVW:MBBO"]), 1)
        with pytest.raises(Forbidden):
            await c.get("ca://PVW:MBBO")


async def test_a_bad_or_expired_token_is_unauthenticated(server: ServerProcess) -> None:
    for token in (
        "x.y.z",
        mint("olga", "operators", ttl=-600),
        WRONG_KEY,
    ):
        async with Client(server.url, token=token) as c:
            with pytest.raises(Unauthenticated):
                await c.search("*")


async def test_the_token_source_is_asked_for_every_request(server: ServerProcess) -> None:
    calls = 0

    async def token() -> str:
        nonlocal calls
        calls += 1
        return mint("olga", "operators", ttl=60)

    async with Client(server.url, token=token) as c:
        await c.get("ca://PVW:AI")
        await c.search("*PVW*")
        await take(c.monitor("ca://PVW:COUNTER"), 1)
    assert calls == 3


def test_sync_client_with_a_token(server: ServerProcess) -> None:
    with SyncClient(server.url, token=VIEWER) as c:
        assert c.get("ca://PVW:AI").connected
        with pytest.raises(WriteDenied):
            c.put("ca://PVW:AO", 1.0)


def pvwire(
    server: ServerProcess, *args: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PVWIRE_URL": server.url}
    env.pop("PVWIRE_TOKEN", None)
    if token is not None:
        env["PVWIRE_TOKEN"] = token
    return subprocess.run([PVWIRE, *args], env=env, capture_output=True, text=True, timeout=60)


def test_cli_exit_status_says_who_may_do_what(server: ServerProcess, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(OPERATOR + "\n")
    p = pvwire(server, "put", "--token-file", str(token_file), "ca://PVW:AO", "7.25")
    assert (p.returncode, p.stderr) == (0, "") and "7.250 mm" in p.stdout
    p = pvwire(server, "put", "--token", VIEWER, "ca://PVW:AO", "8")
    assert p.returncode == 6 and "vic" in p.stderr and p.stderr.count("\n") == 1
    p = pvwire(server, "get", "ca://PVW:AI", "ca://PVW:MBBO", token=VIEWER)
    assert p.returncode == 5 and p.stderr == "vic may not read ca://PVW:MBBO\n"
    assert p.stdout.startswith("ca://PVW:AI  ")  # one channel refused does not hide the other
    p = pvwire(server, "monitor", "ca://PVW:MBBO", "--count", "1", token=VIEWER)
    assert p.returncode == 5 and "ca://PVW:MBBO" in p.stderr
    p = pvwire(server, "search", "*", "--token", "x.y.z")
    assert p.returncode == 4 and p.stderr.startswith("pvwire: not authenticated: ")
    p = pvwire(server, "monitor", "ca://PVW:COUNTER", "--count", "2", token=VIEWER)
    assert (p.returncode, len(p.stdout.splitlines())) == (0, 2), p.stderr


async def test_rules_reload_ends_only_the_monitor_of_the_channel_now_denied(
    server: ServerProcess, folder: Path
) -> None:
    rules = folder / "rules.toml"
    async with Client(server.url, token=VIEWER) as c:
        counter = c.monitor("ca://PVW:COUNTER")
        ai = c.monitor("ca://PVW:AI")
        await take(counter, 1)
        await take(ai, 1)
        denied = '[[rule]]\nchannels = ["ca://PVW:AI"]\ngroups = ["viewers"]\naccess = "NONE"\n'
        rules.write_text(RULES + denied)
        try:
            assert server.pid is not None
            os.kill(server.pid, signal.SIGHUP)
            with pytest.raises(StreamRefused, match="ca://PVW:AI") as e:
                await take(ai, 1, timeout=30)
            assert (e.value.stream_code, e.value.code) == (4403, "FORBIDDEN")
            # The other monitor, on the same WebSocket, goes on.
            ups = await take(counter, 3)
            assert all(u.channel.connected for u in ups)
        finally:
            rules.write_text(RULES)
            os.kill(server.pid, signal.SIGHUP)  # type: ignore[arg-type]
        await counter.aclose()


async def test_a_server_restarted_with_another_key_gets_fresh_tokens(
    epics_env: IocProcess, tmp_path: Path
) -> None:
    # Its stream tokens are then unknown (ERROR 4401 for each ATTACH): the monitor registers
    # again, asking the token source for a fresh JWT, and goes on.
    calls = 0

    def token() -> str:
        nonlocal calls
        calls += 1
        return mint("olga", "operators", ttl=120)

    first = ServerProcess(*server_args(tmp_path))
    first.start()
    try:
        async with Client(first.url, token=token, reconnect_max=1.0) as c:
            it = c.monitor("ca://PVW:COUNTER")
            await take(it, 1)
            await asyncio.to_thread(first.stop)
            second = ServerProcess(*server_args(tmp_path), port=first.port, token_key="another-key")
            await asyncio.to_thread(second.start)
            try:
                # Updates queued before the stop come first, and the IOC's channel may blink on
                # a loaded machine: wait for the stream's loss, then the recovery.
                lost = False
                async with asyncio.timeout(60):
                    async for u in it:
                        if u.channel.connection == "DISCONNECTED":
                            lost = lost or u.channel.reason.startswith("stream closed")
                        elif lost and u.channel.connected:
                            break
                assert u.channel.access == "READ" and calls == 2  # WRITE is for AO only
            finally:
                await it.aclose()
                second.stop()
    finally:
        first.stop()


def request(server: ServerProcess, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    """GET (or POST `body` as JSON) with a bearer token: the status and the JSON answer."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    req = urllib.request.Request(server.url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_jwt_inside_its_leeway_after_exp_reads_but_cannot_subscribe(
    server: ServerProcess,
) -> None:
    # 5 s past its exp, within the server's 60 s of clock skew (jwt_leeway_s): it still
    # identifies its caller, but a stream token outlives no credentials (PROTOCOL.md section 7)
    # and would be expired at once: subscribe says so instead of handing out a dead token.
    late = mint("olga", "operators", ttl=-5)
    exp = jwt.decode(late, options={"verify_signature": False})["exp"]
    status, doc = request(
        server, "/graphql", late, {"query": '{ channel(id: "ca://PVW:AI") { id } }'}
    )
    assert (status, doc.get("errors")) == (200, None)
    query = 'mutation { subscribe(ids: ["ca://PVW:AI"]) { token expiresAt } }'
    status, doc = request(server, "/graphql", late, {"query": query})
    assert status == 200 and doc["data"] is None
    (error,) = doc["errors"]
    assert error["extensions"] == {"code": "UNAUTHENTICATED"}
    assert error["message"] == (
        f"your credentials expired at {exp} (POSIX seconds): "
        "get a fresh token from your identity provider and subscribe again"
    )


async def test_the_client_stops_on_expired_credentials(server: ServerProcess) -> None:
    late = mint("olga", "operators", ttl=-5)
    async with Client(server.url, token=late) as client:
        with pytest.raises(Unauthenticated, match="credentials expired"):
            async for _ in client.monitor(["ca://PVW:AI"]):
                break


def test_pvget_applies_the_access_rules(server: ServerProcess) -> None:
    status, denied = request(server, "/pvws/pvget?name=ca://PVW:MBBO", VIEWER)
    assert status == 403
    assert denied == {
        "type": "error", "pv": "ca://PVW:MBBO", "code": "FORBIDDEN",
        "message": "vic may not read ca://PVW:MBBO",
    }  # fmt: skip
    status, update = request(server, "/pvws/pvget?name=ca://PVW:MBBO", OPERATOR)
    assert (status, update["type"], update["vtype"]) == (200, "update", "VEnum")
    # readonly as a /pvws/pv client of this identity is told: operators may write PVW:AO only.
    assert update["readonly"] is True
    assert request(server, "/pvws/pvget?name=ca://PVW:AO", OPERATOR)[1]["readonly"] is False
    assert request(server, "/pvws/pvget?name=ca://PVW:AO", VIEWER)[1]["readonly"] is True
    status, refused = request(server, "/pvws/pvget?name=ca://PVW:AO", WRONG_KEY)
    assert (status, refused["code"]) == (401, "UNAUTHENTICATED")
