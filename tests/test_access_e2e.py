"""Who may do what, end to end: a real server with a JWT secret, a rules file and an audit file,
in front of the shared test IOC, over real HTTP and WebSocket. JWTs are minted here."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from pvwire_client import wire
from pvwire_dev.ioc import IocProcess

from tests.server_process import ServerProcess
from tests.stream_client import RawStream

SECRET = "operators-and-viewers-share-this-secret-0123456789"
RULES = """
default = "READ"
[[rule]]
channels = ["ca://PVW:AO"]
groups = ["operators"]
access = "WRITE"
[[rule]]
channels = ["ca://PVW:LONG"]
groups = ["engineers"]
fields = ["PROC"]
access = "WRITE"
[[rule]]
channels = ["ca://PVW:MBBO"]
groups = ["viewers"]
access = "NONE"
[[rule]]
channels = ["pva://PVW:AO"]
groups = ["operators"]
access = "WRITE"
"""


class Access:
    def __init__(self, server: ServerProcess, rules: Path, audit: Path) -> None:
        self.server, self.rules, self.audit = server, rules, audit

    def graphql(
        self,
        query: str,
        variables: dict[str, Any] | None = None,
        token: str | None = None,
        origin: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if origin is not None:
            headers["Origin"] = origin
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.server.url}/graphql", data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            with exc:  # it holds the response, and with it the socket
                return exc.code, json.loads(exc.read())


# Long enough for the tokens below, minted when the module is collected at the session's start
# and used up to a loaded run's length later (CI stops at 90 min).
SESSION_TTL = 4 * 3600


def mint(user: str, *groups: str, ttl: float = SESSION_TTL) -> str:
    now = int(time.time())
    claims = {"sub": user, "preferred_username": user, "groups": list(groups), "iat": now,
              "exp": now + int(ttl), "aud": "pvwire"}  # fmt: skip
    return jwt.encode(claims, SECRET, "HS256")


OPERATOR, VIEWER, ENGINEER = (
    mint("olga", "operators"),
    mint("vic", "viewers"),
    mint("enzo", "engineers"),
)


@pytest.fixture(scope="module")
def access(epics_env: IocProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Access]:
    folder = tmp_path_factory.mktemp("access")
    (folder / "secret").write_text(SECRET)
    (folder / "rules.toml").write_text(RULES)
    server = ServerProcess(
        "--jwt-secret-file", str(folder / "secret"), "--jwt-audience", "pvwire",
        "--access-rules", str(folder / "rules.toml"), "--audit-log", str(folder / "audit.jsonl"),
        "--admin-group", "admins", "--log-level", "warning",
        env={"PVWIRE_ALLOWED_ORIGINS": "http://screens.example.org"},
    )  # fmt: skip
    with server:
        yield Access(server, folder / "rules.toml", folder / "audit.jsonl")


PUT = "mutation($id: String!, $v: JSON!) { put(id: $id, value: $v, wait: true) { ok } }"


def audit_lines(access: Access) -> list[dict[str, Any]]:
    return [json.loads(line) for line in access.audit.read_text().splitlines()]


def test_an_operator_writes_a_viewer_cannot_and_both_are_audited(access: Access) -> None:
    before = len(audit_lines(access)) if access.audit.exists() else 0
    status, doc = access.graphql(PUT, {"id": "ca://PVW:AO", "v": 3.5}, OPERATOR)
    assert status == 200 and doc["data"]["put"]["ok"], doc
    _, doc = access.graphql(PUT, {"id": "ca://PVW:AO", "v": 4.5}, VIEWER)
    (err,) = doc["errors"]
    assert err["extensions"]["code"] == "WRITE_DENIED" and "vic" in err["message"]
    _, doc = access.graphql(PUT, {"id": "ca://PVW:AO", "v": 5.5})  # anonymous: read-only
    assert doc["errors"][0]["extensions"]["code"] == "WRITE_DENIED"
    lines = audit_lines(access)[before:]
    assert [(x["user"], x["result"] == "ok", x["new"]) for x in lines] == [
        ("olga", True, 3.5), ("vic", False, 4.5), (None, False, 5.5)
    ]  # fmt: skip
    assert lines[0]["groups"] == ["operators"] and lines[0]["address"] == "127.0.0.1"
    assert lines[1]["code"] == "WRITE_DENIED" and lines[0]["latency_ms"] >= 0


def test_field_writes_need_a_rule_naming_the_field(access: Access) -> None:
    _, doc = access.graphql(PUT, {"id": "ca://PVW:AO.PROC", "v": 1}, OPERATOR)
    err = doc["errors"][0]
    assert err["extensions"]["code"] == "WRITE_DENIED" and "field .PROC" in err["message"]
    _, doc = access.graphql(PUT, {"id": "ca://PVW:LONG.PROC", "v": 1}, ENGINEER)
    assert doc["data"]["put"]["ok"], doc
    _, doc = access.graphql(PUT, {"id": "ca://PVW:LONG.DISA", "v": 1}, ENGINEER)
    assert doc["errors"][0]["extensions"]["code"] == "WRITE_DENIED"


def test_a_denied_channel_is_invisible_and_refused(access: Access) -> None:
    _, doc = access.graphql('query { search(pattern: "ca://PVW:*", limit: 100) }', token=VIEWER)
    assert "ca://PVW:MBBO" not in doc["data"]["search"]
    _, doc = access.graphql('query { channel(id: "ca://PVW:MBBO") { value } }', token=VIEWER)
    assert doc["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    _, doc = access.graphql(
        'mutation { subscribe(ids: ["ca://PVW:AO", "ca://PVW:MBBO"]) { token } }', token=VIEWER
    )
    err = doc["errors"][0]
    assert err["extensions"]["code"] == "FORBIDDEN" and "ca://PVW:MBBO" in err["message"]
    _, doc = access.graphql('query { channel(id: "ca://PVW:MBBO") { value } }', token=OPERATOR)
    assert "errors" not in doc


def test_subscribe_tells_each_channel_access(access: Access) -> None:
    query = 'mutation { subscribe(ids: ["ca://PVW:AO", "ca://PVW:AI"]) { channels { id access } } }'
    _, doc = access.graphql(query, token=OPERATOR)
    assert [c["access"] for c in doc["data"]["subscribe"]["channels"]] == ["WRITE", "READ"]
    _, doc = access.graphql(query, token=VIEWER)
    assert [c["access"] for c in doc["data"]["subscribe"]["channels"]] == ["READ", "READ"]


async def stream_writable(access: Access, ids: list[str], token: str | None) -> list[bool]:
    """Each channel's `writable` as the stream's metadata says it to `token`'s identity."""
    ids_text = ", ".join(f'"{i}"' for i in ids)
    _, doc = access.graphql(f"mutation {{ subscribe(ids: [{ids_text}]) {{ token }} }}", token=token)
    s = await RawStream.connect(access.server.ws_url)
    try:
        _, snapshot = await s.attach(doc["data"]["subscribe"]["token"])
        meta = {e.sid: e.metadata for e in snapshot.entries if e.metadata is not None}
        while len(meta) < len(ids):  # a channel not connected yet sends its META later
            data = await s.next_data(30)
            meta.update({e.sid: e.metadata for g in data.groups for e in g.entries if e.metadata})
        return [meta[sid]["writable"] for sid in range(len(ids))]
    finally:
        await s.close()


async def test_stream_metadata_says_writable_by_the_rules_and_the_upstream(
    access: Access,
) -> None:
    """PROTOCOL.md section 5: `writable` is in every metadata map, the rules' answer for the
    attaching identity AND the upstream's; PVA exposes no access rights, so there the rules
    decide. The same channels, attached by three identities, say three things."""
    # Not ca://PVW:AI: the rules reload test below needs that channel's first value.
    ids = ["pva://PVW:AO", "pva://PVW:AI", "ca://PVW:AO", "ca://PVW:STR"]
    assert await stream_writable(access, ids, OPERATOR) == [True, False, True, False]
    assert await stream_writable(access, ids, VIEWER) == [False, False, False, False]
    assert await stream_writable(access, ids, None) == [False, False, False, False]


@pytest.mark.parametrize(
    ("token", "message"),
    [(mint("olga", "operators", ttl=-600), "expired"), ("x.y.z", "rejected"),
     (jwt.encode({"sub": "mallory", "exp": int(time.time()) + 60}, "", "none"), "'none'")],
)  # fmt: skip
def test_bad_bearer_tokens_get_401(access: Access, token: str, message: str) -> None:
    status, doc = access.graphql("query { server { version } }", token=token)
    assert status == 401 and doc["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert message in doc["errors"][0]["message"]


def test_origin_list_refuses_other_sites_but_not_scripts(access: Access) -> None:
    status, _ = access.graphql("query { server { version } }", origin="https://evil.example")
    assert status == 403
    status, _ = access.graphql("query { server { version } }")  # no Origin: not a browser
    assert status == 200
    status, _ = access.graphql("query { server { version } }", origin="http://screens.example.org")
    assert status == 200


def test_client_details_need_an_admin(access: Access) -> None:
    _, doc = access.graphql("query { server { version clients { address } } }", token=OPERATOR)
    assert doc["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    _, doc = access.graphql("query { server { version clients { address } } }",
                            token=mint("ada", "admins"))  # fmt: skip
    assert "errors" not in doc and isinstance(doc["data"]["server"]["clients"], list)


async def test_rules_reload_ends_attachments_the_identity_may_no_longer_read(
    access: Access,
) -> None:
    query = 'mutation { subscribe(ids: ["ca://PVW:COUNTER"]) { token } }'
    _, doc = access.graphql(query, token=VIEWER)
    stream_token = doc["data"]["subscribe"]["token"]
    s = await RawStream.connect(access.server.ws_url)
    other = await RawStream.connect(access.server.ws_url)
    try:
        attached, _ = await s.attach(stream_token)
        _, doc = access.graphql(
            'mutation { subscribe(ids: ["ca://PVW:AI"]) { token } }', token=VIEWER
        )
        await s.attach(doc["data"]["subscribe"]["token"])  # a second attachment that stays
        await other.attach(stream_token)
        denied = (
            RULES
            + '[[rule]]\nchannels = ["ca://PVW:COUNTER"]\ngroups = ["viewers"]\naccess = "NONE"\n'
        )
        access.rules.write_text(denied.replace('default = "READ"', 'default = "READ"\n'))
        assert access.server._proc is not None
        os.kill(access.server._proc.pid, signal.SIGHUP)
        # This attachment ends with ERROR 4403 naming the channel, then DETACHED; no close.
        while not isinstance(msg := await s.recv(30), wire.Error):
            pass
        assert (msg.req, msg.code) == (None, 4403) and "ca://PVW:COUNTER" in msg.message
        while not isinstance(msg := await s.recv(30), wire.Detached):
            pass
        assert msg.att == attached.att
        # A new ATTACH of the same token is refused for that attachment only.
        await s.send(16, 99, stream_token)
        while not isinstance(msg := await s.recv(30), wire.Error):
            pass
        assert (msg.req, msg.code) == (99, 4403)
        data = await s.next_data(30)  # the other attachment goes on
        assert all(g.att != attached.att for g in data.groups)
    finally:
        access.rules.write_text(RULES)
        os.kill(access.server._proc.pid, signal.SIGHUP)  # type: ignore[union-attr]
        await s.close()
        await other.close()
