"""An ATTACH (or a pvws `subscribe`) naming a channel this server cannot open: refused for that
request alone, holding nothing, however often the client retries. In memory, with the real hub,
sessions and endpoints (tests/hub_doubles.py's backend, which the test makes refuse some names;
tests/test_connection.py's socket)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pvwire.core.hub import Hub
from pvwire.errors import BackendUnavailable, BadChannelId
from pvwire.upstream.base import ChannelSink
from pvwire.wire.codes import BAD_TOKEN

from .eventually import eventually_async
from .hub_doubles import Client, FakeBackend, FakeMonitor, attach
from .test_connection import FakeSocket, connected, pvws


class RefusingBackend(FakeBackend):
    """`bad-id` is refused when resolved; `no-monitor` when its monitor is opened."""

    def check(self, name: str) -> None:
        if name == "bad-id":
            raise BadChannelId(f"{name!r} is no channel of this server")

    def monitor(self, name: str, sink: ChannelSink) -> FakeMonitor:
        if name == "no-monitor":
            raise BackendUnavailable("this server cannot monitor 'no-monitor'")
        return super().monitor(name, sink)


@pytest.fixture
def backend() -> FakeBackend:
    return RefusingBackend()


@pytest.mark.parametrize("bad", ["fake://bad-id", "fake://no-monitor"])
async def test_a_channel_that_cannot_open_refuses_its_attach_and_holds_nothing(
    hub: Hub, backend: FakeBackend, bad: str
) -> None:
    c = Client(hub)
    c.drain()
    token = hub.signer.issue(["fake://a", "fake://b", bad]).token
    for req in range(1, 4):  # the client's retries hold nothing more either
        c.send(16, req, token)
        ((kind, answered, code, message),) = c.drain()
        assert (kind, answered, code) == (5, req, BAD_TOKEN), message
        assert bad.removeprefix("fake://") in message
    assert not c.session.close_request and not c.session.attachments
    # The channels acquired before the one that failed are released: their monitors close.
    await eventually_async(lambda: not hub.registry.channels, "every channel released")
    assert all(m.closed for m in backend.monitors) and backend.monitors
    assert not hub.registry.views
    # The connection goes on: a token it can serve attaches.
    att = attach(c, hub, ["fake://a"])
    assert c.session.attachments.keys() == {att}
    assert hub.registry.channels["fake://a"].refs == 1


async def test_a_channel_shared_with_another_view_keeps_its_holder(
    hub: Hub, backend: FakeBackend
) -> None:
    holder = Client(hub)
    attach(holder, hub, ["fake://a"])
    c = Client(hub)
    c.drain()
    c.send(16, 1, hub.signer.issue(["fake://a", "fake://no-monitor"]).token)
    assert c.drain()[0][:3] == [5, 1, BAD_TOKEN]
    assert hub.registry.channels["fake://a"].refs == 1
    assert "fake://no-monitor" not in hub.registry.channels


async def test_a_pvws_subscribe_that_cannot_open_is_an_error_and_the_connection_goes_on(
    hub: Hub, backend: FakeBackend
) -> None:
    ws = FakeSocket()
    task = await connected(hub, pvws, ws)

    async def subscribe(name: str) -> None:
        text = json.dumps({"type": "subscribe", "pvs": [name]})
        await ws.incoming.put({"type": "websocket.receive", "text": text})

    def said(*words: str) -> bool:
        return any(all(w in m for w in words) for m in ws.sent if isinstance(m, str))

    # A PV first: a client whose only message is one subscribe gets no `error` yet (pvws.py).
    await subscribe("fake://a")
    await eventually_async(lambda: "fake://a" in hub.registry.channels, "the first PV open")
    await subscribe("fake://no-monitor")
    await eventually_async(lambda: said('"error"', "no-monitor"), "an error naming the PV")
    assert "fake://no-monitor" not in hub.registry.channels
    backend.update("a", 42.0)
    await eventually_async(lambda: said('"fake://a"', "42"), "the first PV's next value")
    assert not ws.closes
    await ws.incoming.put({"type": "websocket.disconnect", "code": 1000})
    await asyncio.wait_for(task, 30)
    assert hub.snapshot().closes_by_code == {1000: 1}
