"""pvwire_client with identities: the bearer token on GraphQL, refused tokens per attachment
(ERROR answering the ATTACH, or ERROR + DETACHED ending one), access on the channel state.

Against the scripted fake server of test_pyclient_stream (GraphQL mocked, a real WebSocket).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import msgpack
import pytest
from pvwire_client import (
    ChannelState,
    Client,
    Forbidden,
    StreamRefused,
    Unauthenticated,
    WriteDenied,
)
from pvwire_client.sync import SyncClient
from websockets.asyncio.server import ServerConnection

from tests.test_pyclient_stream import HELLO, Fake, full, pack, take
from tests.test_pyclient_stream import fake_factory as fake_factory  # the fixture

Refusal = tuple[int, str] | None


class Streamer:
    """The stream side: attaches token ``tokN`` to the N-th registration's ids (sid 0's first
    value is the attachment number) unless ``refuse(token)`` answers ``(code, message)``."""

    def __init__(self, refuse: Callable[[str], Refusal] = lambda token: None) -> None:
        self.refuse = refuse
        self.fake: Fake | None = None
        self.ws: ServerConnection | None = None
        self.tokens: list[str] = []
        self.atts: dict[str, int] = {}  # first id of the attachment -> att
        self.seq = 0
        self.attached = asyncio.Event()

    async def send(self, msg: list[Any]) -> None:
        assert self.ws is not None
        if msg[0] in (2, 3):
            self.seq += 1
            msg = [msg[0], self.seq, *msg[1:]]
        await self.ws.send(pack(msg))

    async def script(self, ws: ServerConnection, n: int) -> None:
        self.ws, self.seq = ws, 0
        await ws.send(pack(HELLO))
        async for data in ws:
            msg = msgpack.unpackb(data)
            if msg[0] == 17:
                await ws.send(pack([4, msg[1], msg[2]]))
                continue
            if msg[0] != 16:
                continue
            token = msg[2]
            self.tokens.append(token)
            refusal = self.refuse(token)
            if refusal is not None:
                await ws.send(pack([5, msg[1], *refusal]))
                continue
            assert self.fake is not None
            att = len(self.tokens)
            ids = [f"sim://{i}" for i in self.fake.registrations[int(token[3:]) - 1]]
            self.atts[ids[0]] = att
            await ws.send(pack([1, msg[1], att, ids]))
            await self.send([2, att, [full(sid, att, 1) for sid in range(len(ids))]])
            self.attached.set()


async def streaming(fake_factory: Any, streamer: Streamer, **options: Any) -> Client:
    fake, client = await fake_factory(streamer.script, **options)
    streamer.fake = fake
    assert isinstance(client, Client)
    return client


# --- per-attachment token errors ------------------------------------------------------------


async def test_expired_token_registers_again_and_attaches_on_the_same_socket(
    fake_factory: Any,
) -> None:
    streamer = Streamer(lambda t: (4402, "token expired") if t == "tok2" else None)
    client = await streaming(fake_factory, streamer)
    x = client.monitor("x")
    (ux,) = await take(x, 1)
    (uy,) = await take(client.monitor("y"), 1)
    assert (ux.channel.id, uy.channel.id, uy.channel.value) == ("sim://x", "sim://y", 3)
    assert streamer.tokens == ["tok1", "tok2", "tok3"]
    assert streamer.fake is not None and streamer.fake.registrations == [["x"], ["y"], ["y"]]
    assert streamer.fake.connections == 1
    # The first monitor did not notice: the next update is its own, not a disconnect.
    await streamer.send([3, [[streamer.atts["sim://x"], [[0, 1, 42, 2]]]]])
    (ux,) = await take(x, 1)
    assert (ux.channel.value, ux.channel.connection) == (42, "CONNECTED")
    await x.aclose()


async def test_fresh_token_refused_again_ends_only_that_monitor(fake_factory: Any) -> None:
    streamer = Streamer(lambda t: (4401, "bad signature") if t != "tok1" else None)
    client = await streaming(fake_factory, streamer)
    x = client.monitor("x")
    await take(x, 1)
    with pytest.raises(StreamRefused, match="4401 BAD_TOKEN") as e:
        await take(client.monitor("y"), 1)
    assert (e.value.stream_code, e.value.code) == (4401, "BAD_TOKEN")
    assert "bad signature" in str(e.value)
    assert streamer.tokens == ["tok1", "tok2", "tok3"]  # one re-registration, no loop
    await streamer.send([3, [[streamer.atts["sim://x"], [[0, 1, 7, 2]]]]])
    (ux,) = await take(x, 1)
    assert ux.channel.value == 7
    assert streamer.fake is not None and streamer.fake.connections == 1
    await x.aclose()


async def test_token_accepted_then_refused_after_reconnect_registers_again(
    fake_factory: Any,
) -> None:
    # A restarted server with a new key refuses the token it had accepted: register once more.
    restarted = False

    def refuse(token: str) -> Refusal:
        return (4401, "unknown key") if restarted and token == "tok1" else None

    streamer = Streamer(refuse)
    client = await streaming(fake_factory, streamer)
    x = client.monitor("x")
    await take(x, 1)
    restarted = True
    assert streamer.ws is not None
    await streamer.ws.close(1012, "restart")
    ups = await take(x, 2)
    assert [u.channel.connection for u in ups] == ["DISCONNECTED", "CONNECTED"]
    assert streamer.tokens == ["tok1", "tok1", "tok2"]
    await x.aclose()


async def test_forbidden_attach_ends_the_monitor_without_registering_again(
    fake_factory: Any,
) -> None:
    streamer = Streamer(lambda t: (4403, "sim://x: not readable by alice"))
    client = await streaming(fake_factory, streamer)
    with pytest.raises(StreamRefused, match="4403 FORBIDDEN") as e:
        await take(client.monitor("x"), 1)
    assert e.value.code == "FORBIDDEN" and "sim://x" in str(e.value)
    assert streamer.fake is not None and len(streamer.fake.registrations) == 1


async def test_server_ends_one_attachment_and_says_why(fake_factory: Any) -> None:
    streamer = Streamer()
    client = await streaming(fake_factory, streamer)
    x = client.monitor("x")
    y = client.monitor("y")
    await take(x, 1)
    await take(y, 1)
    # Rules reloaded: y may no longer be read. ERROR naming it, then DETACHED with req nil.
    await streamer.send([5, None, 4403, "sim://y: no longer readable by alice"])
    await streamer.send([4, None, streamer.atts["sim://y"]])
    with pytest.raises(StreamRefused, match="sim://y: no longer readable") as e:
        await take(y, 1)
    assert e.value.stream_code == 4403
    await streamer.send([3, [[streamer.atts["sim://x"], [[0, 1, 9, 2]]]]])
    (ux,) = await take(x, 1)
    assert ux.channel.value == 9
    await x.aclose()


async def test_detached_without_an_error_before_it_ends_the_monitor(fake_factory: Any) -> None:
    streamer = Streamer()
    client = await streaming(fake_factory, streamer)
    x = client.monitor("x")
    await take(x, 1)
    await streamer.send([5, None, 4400, "unrelated"])
    await streamer.send([6])  # the error is not about the DETACHED that comes later
    await streamer.send([4, None, streamer.atts["sim://x"]])
    with pytest.raises(Exception, match="the server ended the subscription") as e:
        await take(x, 1)
    assert not isinstance(e.value, StreamRefused)


# --- the bearer token ------------------------------------------------------------------------


async def test_token_source_is_asked_before_each_registration(fake_factory: Any) -> None:
    issued: list[str] = []

    def token() -> str:
        issued.append(f"jwt-{len(issued) + 1}")
        return issued[-1]

    streamer = Streamer(lambda t: (4402, "expired") if t == "tok1" else None)
    client = await streaming(fake_factory, streamer, token=token)
    await take(client.monitor("x"), 1)
    assert streamer.fake is not None
    assert streamer.fake.authorization == ["Bearer jwt-1", "Bearer jwt-2"]


async def test_async_token_source(fake_factory: Any) -> None:
    async def token() -> str:
        await asyncio.sleep(0)
        return "jwt-async"

    streamer = Streamer()
    client = await streaming(fake_factory, streamer, token=token)
    await take(client.monitor("x"), 1)
    assert streamer.fake is not None and streamer.fake.authorization == ["Bearer jwt-async"]


async def test_token_source_failing_ends_the_monitor_with_its_error(fake_factory: Any) -> None:
    calls = 0

    def token() -> str:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("identity provider unreachable")
        return "jwt"

    streamer = Streamer(lambda t: (4402, "expired") if t == "tok1" else None)
    client = await streaming(fake_factory, streamer, token=token)
    with pytest.raises(RuntimeError, match="identity provider unreachable"):
        await take(client.monitor("x"), 1)


async def test_token_from_the_environment_and_empty_for_anonymous(
    fake_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PVWIRE_TOKEN", "jwt-env")
    env_streamer, anon_streamer = Streamer(), Streamer()
    env_client = await streaming(fake_factory, env_streamer)
    anon_client = await streaming(fake_factory, anon_streamer, token="")
    await take(env_client.monitor("x"), 1)
    await take(anon_client.monitor("x"), 1)
    assert env_streamer.fake is not None and anon_streamer.fake is not None
    assert env_streamer.fake.authorization == ["Bearer jwt-env"]
    assert anon_streamer.fake.authorization == [None]


def _answer(status: int, code: str, message: str) -> httpx.MockTransport:
    body = {"data": None, "errors": [{"message": message, "extensions": {"code": code}}]}
    return httpx.MockTransport(lambda request: httpx.Response(status, json=body))


async def test_graphql_refusals_raise_their_errors() -> None:
    async with Client("http://fake", transport=_answer(401, "UNAUTHENTICATED", "expired")) as c:
        with pytest.raises(Unauthenticated, match="expired"):
            await c.search("*")
    forbidden = _answer(200, "FORBIDDEN", "ca://X may not be read by bob")
    async with Client("http://fake", transport=forbidden) as c:
        with pytest.raises(Forbidden, match="ca://X may not be read"):
            await anext(c.monitor("ca://X"))
    denied = _answer(200, "WRITE_DENIED", "ca://X: bob may not write")
    async with Client("http://fake", transport=denied) as c:
        with pytest.raises(WriteDenied):
            await c.put("ca://X", 1)
    proxy = httpx.MockTransport(lambda request: httpx.Response(401, text="log in first"))
    async with Client("http://fake", transport=proxy) as c:
        with pytest.raises(Unauthenticated, match="HTTP 401"):
            await c.search("*")


def test_sync_client_sends_the_token() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        assert json.loads(request.content)["variables"]["p"] == "*"
        return httpx.Response(200, json={"data": {"search": ["ca://X"]}})

    with SyncClient("http://fake", token="jwt-sync", transport=httpx.MockTransport(handler)) as c:
        assert c.search("*") == ["ca://X"]
    assert seen == ["Bearer jwt-sync"]


# --- access ----------------------------------------------------------------------------------


async def test_access_from_subscribe_is_on_the_channel_state(fake_factory: Any) -> None:
    streamer = Streamer()
    fake, client = await fake_factory(streamer.script)
    streamer.fake = fake
    fake.access = {"w": "WRITE"}
    ups = await take(client.monitor(["w", "r"]), 2)
    w, r = (u.channel for u in ups)
    assert (w.access, w.writable, r.access, r.writable) == ("WRITE", True, "READ", False)


@pytest.mark.parametrize(
    ("access", "upstream", "writable"),
    [
        ("WRITE", None, True),  # the upstream cannot tell (PVA): the grant decides
        ("WRITE", True, True),
        ("WRITE", False, False),  # the IOC refuses writes whatever the rules say
        ("READ", True, False),
        ("READ", None, False),
        (None, True, True),  # read through GraphQL: metadata is the server's answer
        (None, False, False),
        (None, None, False),
    ],
)
def test_writable_combines_access_and_upstream(
    access: str | None, upstream: bool | None, writable: bool
) -> None:
    meta = {} if upstream is None else {"writable": upstream}
    assert ChannelState("ca://X", metadata=meta, access=access).writable is writable
