"""The user's name at the IOC (--forward-identity), end to end: a real IOC enforcing an ACF that
lets only the user olga write ACF:SP (tests/dbs/acf.acf), a real server whose own rules let both
olga and vic write it, GraphQL puts with JWTs minted here. The IOC, not pvwire, refuses vic, and
the audit lines say which of the two refused.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import numpy as np
import pytest
from pvwire.cli import build_parser
from pvwire.config import Settings
from pvwire_client import Client, NotFound, ReadOnly, TypeMismatch, WriteDenied
from pvwire_dev.ioc import IocProcess

from tests.server_process import ServerProcess

pytestmark = pytest.mark.ioc

DBS = Path(__file__).parent / "dbs"
SECRET = "forwarded-identities-share-this-secret-0123456789"
RULES = """
default = "READ"
[[rule]]                      # pvwire's rules let both users write: the IOC decides between them
channels = ["ca://ACF:*", "pva://ACF:*"]
users = ["olga", "vic"]
access = "WRITE"
[[rule]]                      # and anyone may write this one, as far as pvwire's rules go
channels = ["ca://ACF:OPEN"]
access = "WRITE"
"""


def mint(user: str) -> str:
    now = int(time.time())
    # Minted when the module is collected, at the session's start, and used up to a loaded
    # run's length later (CI stops at 90 min).
    claims = {"sub": user, "preferred_username": user, "iat": now, "exp": now + 4 * 3600}
    return jwt.encode(claims, SECRET, "HS256")


OLGA, VIC = mint("olga"), mint("vic")


@pytest.fixture(scope="module")
def acf_ioc() -> Iterator[IocProcess]:
    with IocProcess([DBS / "acf.db"], acf=DBS / "acf.acf") as ioc:
        yield ioc


def start_server(ioc: IocProcess, folder: Path, *extra: str) -> ServerProcess:
    (folder / "secret").write_text(SECRET)
    (folder / "rules.toml").write_text(RULES)
    return ServerProcess(
        "--jwt-secret-file", str(folder / "secret"), "--access-rules", str(folder / "rules.toml"),
        "--audit-log", str(folder / "audit.jsonl"), "--log-level", "warning", *extra,
        env=ioc.ports.client_env(),
    )  # fmt: skip


@pytest.fixture(scope="module")
def forwarding(acf_ioc: IocProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A server with --forward-identity in front of the ACF IOC; yields its folder."""
    folder = tmp_path_factory.mktemp("forwarding")
    with start_server(acf_ioc, folder, "--forward-identity") as server:
        (folder / "url").write_text(server.url)
        yield folder


def url(folder: Path) -> str:
    return (folder / "url").read_text()


def audit(folder: Path) -> list[dict[str, Any]]:
    path = folder / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def test_the_ioc_lets_olga_write_and_refuses_vic(forwarding: Path) -> None:
    before = len(audit(forwarding))
    target = round(random.uniform(-50, 50), 2)
    async with Client(url(forwarding), token=OLGA) as c:
        assert (await c.put("ca://ACF:SP", target, wait=True)).ok
        assert (await c.get("ca://ACF:SP")).value == target
    async with Client(url(forwarding), token=VIC) as c:
        with pytest.raises(ReadOnly, match="vic"):
            await c.put("ca://ACF:SP", target + 1, wait=True)
        with pytest.raises(ReadOnly):  # without wait too: refused before anything is sent
            await c.put("ca://ACF:SP", target + 2)
        assert (await c.get("ca://ACF:SP")).value == target
    lines = audit(forwarding)[before:]
    assert [(x["user"], x["result"] == "ok", x["refused_by"], x["code"]) for x in lines] == [
        ("olga", True, None, ""),
        ("vic", False, "ioc", "READ_ONLY"),
        ("vic", False, "ioc", "READ_ONLY"),
    ]


async def test_pvwire_rules_refuse_before_the_ioc_is_asked(forwarding: Path) -> None:
    before = len(audit(forwarding))
    async with Client(url(forwarding)) as c:  # anonymous: refused by the forwarding rule
        with pytest.raises(WriteDenied, match="anonymous"):
            await c.put("ca://ACF:OPEN", 1.0, wait=True)
    async with Client(url(forwarding), token=OLGA) as c:
        assert (await c.put("ca://ACF:OPEN", 2.0, wait=True)).ok  # the IOC lets anyone write it
        with pytest.raises(WriteDenied):  # no rule for other records: pvwire refuses
            await c.put("ca://PVW:AO", 1.0)
    lines = audit(forwarding)[before:]
    assert [(x["user"], x["refused_by"], x["code"]) for x in lines] == [
        (None, "pvwire", "WRITE_DENIED"),
        ("olga", None, ""),
        ("olga", "pvwire", "WRITE_DENIED"),
    ]


async def test_forwarded_puts_convert_values_as_pvwire_puts_do(forwarding: Path) -> None:
    async with Client(url(forwarding), token=OLGA) as c:
        text = f"set by olga {random.randrange(1000)}"
        await c.put("ca://ACF:STR", text, wait=True)
        assert (await c.get("ca://ACF:STR")).value == text
        await c.put("ca://ACF:MODE", "Auto", wait=True)  # by label
        assert (await c.get("ca://ACF:MODE")).value == 2
        await c.put("ca://ACF:MODE", 1, wait=True)  # by index
        assert (await c.get("ca://ACF:MODE")).value == 1
        await c.put("ca://ACF:WAVE", [3, -4, 5], wait=True)
        wave = (await c.get("ca://ACF:WAVE")).value
        assert np.array_equal(np.asarray(wave), [3, -4, 5])
        with pytest.raises(TypeMismatch, match="valid labels"):
            await c.put("ca://ACF:MODE", "Manual")
        with pytest.raises(NotFound):
            await c.put("ca://ACF:NO_SUCH_RECORD", 1.0, timeout=1.0)


async def test_without_forwarding_the_ioc_sees_pvwires_account(
    acf_ioc: IocProcess, tmp_path: Path
) -> None:
    """The same put by olga, through a server that writes as itself: the IOC's ACF refuses it,
    as it refuses every account but olga's. What --forward-identity changes."""
    with start_server(acf_ioc, tmp_path) as server:
        async with Client(server.url, token=OLGA) as c:
            with pytest.raises(ReadOnly):
                await c.put("ca://ACF:SP", 1.0, wait=True)
    (line,) = audit(tmp_path)
    assert (line["user"], line["refused_by"]) == ("olga", "ioc")


async def test_over_pva_too_the_ioc_lets_olga_write_and_refuses_vic(forwarding: Path) -> None:
    """PVA puts travel on a connection that carries the user's name ("ca" authentication):
    QSRV's access security decides with it, as the CA IOC does."""
    before = len(audit(forwarding))
    target = round(random.uniform(-50, 50), 2)
    async with Client(url(forwarding), token=OLGA) as c:
        assert (await c.put("pva://ACF:SP", target, wait=True)).ok
        assert (await c.get("pva://ACF:SP")).value == target
        await c.put("pva://ACF:MODE", "On", wait=True)  # an enum by label
        assert (await c.get("ca://ACF:MODE")).value == 1
        await c.put("pva://ACF:WAVE", [7, -8], wait=True)
        assert np.array_equal(np.asarray((await c.get("ca://ACF:WAVE")).value), [7, -8])
    async with Client(url(forwarding), token=VIC) as c:
        with pytest.raises(ReadOnly, match="vic"):
            await c.put("pva://ACF:SP", target + 1, wait=True)
        with pytest.raises(ReadOnly, match="vic"):
            await c.put("pva://ACF:SP", target + 2)
        # The host QSRV decides with is pvwire's address; over CA it is the host name sent.
        assert (await c.put("pva://ACF:PEER", 2.0, wait=True)).ok
        with pytest.raises(ReadOnly):
            await c.put("ca://ACF:PEER", 3.0, wait=True)
        assert (await c.get("ca://ACF:SP")).value == target
    async with Client(url(forwarding)) as c:  # anonymous: refused by the forwarding rule
        with pytest.raises(WriteDenied, match="anonymous"):
            await c.put("pva://ACF:SP", 1.0, wait=True)
    lines = audit(forwarding)[before:]
    assert [(x["channel"], x["user"], x["refused_by"], x["code"]) for x in lines] == [
        ("pva://ACF:SP", "olga", None, ""),
        ("pva://ACF:MODE", "olga", None, ""),
        ("pva://ACF:WAVE", "olga", None, ""),
        ("pva://ACF:SP", "vic", "ioc", "READ_ONLY"),
        ("pva://ACF:SP", "vic", "ioc", "READ_ONLY"),
        ("pva://ACF:PEER", "vic", None, ""),
        ("ca://ACF:PEER", "vic", "ioc", "READ_ONLY"),
        ("pva://ACF:SP", None, "pvwire", "WRITE_DENIED"),
    ]


async def test_writable_is_not_pvwires_own_when_forwarding(forwarding: Path) -> None:
    """pvwire's own account may not write ACF:SP, olga may: the stream must not show pvwire's
    rights as hers, so `writable` is the rules' answer alone, as for PVA (PROTOCOL.md section 5),
    and the put box follows pvwire's rules."""
    async with Client(url(forwarding), token=OLGA) as c:
        updates = c.monitor("ca://ACF:SP")
        try:
            async with asyncio.timeout(30):
                update = await anext(updates)
        finally:
            await updates.aclose()
        assert update.channel.metadata.get("writable") is True  # pvwire's own CA rights: False
        assert update.channel.writable and (await c.get("ca://ACF:SP")).writable


def test_forwarding_is_off_unless_asked_for() -> None:
    assert not Settings.load(env={}).forward_identity
    assert Settings.load(env={"PVWIRE_FORWARD_IDENTITY": "1"}).forward_identity
    assert build_parser().parse_args(["serve", "--forward-identity"]).forward_identity
    assert not build_parser().parse_args(["serve"]).forward_identity
