"""Fault isolation in the hub, in memory: nothing one channel, view, session or option does may
change what another client receives or when. Ticks are driven by hand where order matters; the
maxRate case runs the hub's own timer, because the timer is what once went wrong."""

from __future__ import annotations

import asyncio
from typing import Any

from pvwire.access.identity import ANONYMOUS
from pvwire.config import Settings
from pvwire.core.hub import Hub
from pvwire.model import ConnState, Metadata
from pvwire.wire.tokens import TokenSigner

from .eventually import eventually_async
from .hub_doubles import KEYS, Client, FakeBackend, attach


def values(frames: list[Any], att: int, sid: int = 0) -> list[Any]:
    """The VALUE field of every entry of `sid` in DATA frames for `att`."""
    out = []
    for f in frames:
        if f[0] != 3:
            continue
        for group_att, entries in f[2]:
            out += [e[2] for e in entries if group_att == att and e[0] == sid and e[1] & 1]
    return out


async def test_a_max_rate_client_does_not_slow_another_client(
    hub: Hub, backend: FakeBackend
) -> None:
    slow, fast = Client(hub), Client(hub)
    # A period of 20 s: before the fix the next tick waited for this view to be due, and every
    # other client's changes waited with it.
    slow_att = attach(slow, hub, ["fake://b"], max_rate=0.05)  # its last group: the opening
    fast_att = attach(fast, hub, ["fake://a"])
    backend.update("b", 2.0)  # held back for 20 s
    for i in range(5):
        backend.update("a", float(i))
        await eventually_async(lambda: bool(fast.drain()), interval=0.01)
        assert values(fast.received, fast_att)[-1] == float(i)
    assert not values(slow.drain(), slow_att), "the held-back view was not due yet"


async def test_a_value_the_wire_cannot_carry_fails_only_its_channel(
    hub: Hub, backend: FakeBackend
) -> None:
    c = Client(hub)
    att = attach(c, hub, ["fake://a", "fake://b"])
    backend.update("a", object())  # no wire form: the encoder raises
    backend.update("b", 1.0)
    hub.ticker.tick()
    (frame,) = c.drain()
    entries = {e[0]: e for e in frame[2][0][1]}
    bad = entries[0]
    assert bad[1] & 16 and bad[2] is None  # CONN field present, value nil
    assert bad[-2] == int(ConnState.FAILED) and "cannot be sent" in bad[-1]
    assert entries[1][2] == 1.0
    for i in range(3):  # the tick goes on for the other channel and the failed one stays failed
        backend.update("a", object())
        backend.update("b", float(i))
        hub.ticker.tick()
    assert values(c.drain(), att, 1) == [0.0, 1.0, 2.0]
    assert hub.snapshot().failures["channel"] >= 1
    late = Client(hub)  # a late joiner sees the same failed state
    late_att = attach(late, hub, ["fake://a"])
    assert late_att and hub.registry.channels["fake://a"].reading() is None


async def test_a_failing_session_is_closed_and_the_others_go_on(
    hub: Hub, backend: FakeBackend
) -> None:
    broken, healthy = Client(hub), Client(hub)
    attach(broken, hub, ["fake://a"])
    att = attach(healthy, hub, ["fake://a"])

    def explode() -> None:
        raise RuntimeError("injected")

    broken.session.flush_tick = explode  # type: ignore[method-assign]
    backend.update("a", 1.0)
    hub.ticker.tick()
    backend.update("a", 2.0)
    hub.ticker.tick()
    assert values(healthy.drain(), att) == [1.0, 2.0]
    assert broken.session.close_request is not None and broken.session.close_request[0] == 1011
    assert hub.snapshot().failures["session"] >= 1


async def test_a_failing_view_closes_its_clients_only(hub: Hub, backend: FakeBackend) -> None:
    a, b = Client(hub), Client(hub)
    attach(a, hub, ["fake://a"])
    b_att = attach(b, hub, ["fake://a", "fake://b"])
    view = hub.registry.views[next(k for k in hub.registry.views if k.ids == ("fake://a",))]
    writes = view.writes
    view.writes = b""  # a corrupt view: its entries cannot be made
    backend.update("a", 1.0)
    hub.ticker.tick()
    backend.update("a", 2.0)
    hub.ticker.tick()
    view.writes = writes
    assert values(b.drain(), b_att) == [1.0, 2.0]
    assert a.session.close_request is not None and a.session.close_request[0] == 1011
    assert hub.snapshot().failures["view"] >= 1


async def test_a_channel_no_server_answers_turns_not_found(hub: Hub, backend: FakeBackend) -> None:
    backend.silent.add("missing")
    c = Client(hub)
    att = attach(c, hub, ["fake://missing"])
    loop = asyncio.get_running_loop()
    hub.registry.check_not_found(loop.time())  # not yet
    hub.ticker.tick()
    assert not [f for f in c.drain() if f[0] == 3]
    hub.registry.check_not_found(loop.time() + hub.settings.not_found_s)
    hub.ticker.tick()
    (frame,) = c.drain()
    entry = frame[2][0][1][0]
    assert frame[2][0][0] == att and entry[1] == 16
    assert entry[2:] == [4, "not found (no IOC answered for 5 s)"]
    # It appears later: the channel is CONNECTED and its first value arrives with its alarm.
    backend.connect("missing")
    backend.update("missing", 3.0)
    hub.ticker.tick()
    (frame,) = c.drain()
    (entry,) = frame[2][0][1]
    assert entry[1] == 1 | 2 | 4 | 8 | 16 and entry[2] == 3.0


async def test_writable_unknown_upstream_follows_the_write_rules(backend: FakeBackend) -> None:
    backend.meta = Metadata(type="float64", writable=None)  # PVA cannot tell
    settings = Settings(default_scheme="fake", write_rules=["fake://a"])
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    c = Client(hub)
    attach(c, hub, ["fake://a", "fake://b"])
    assert hub.registry.channels["fake://a"].meta.writable is None  # the stream says: unknown
    assert (await hub.get("fake://a", 1.0, ANONYMOUS))[1].meta.writable is True
    assert (await hub.get("fake://b", 1.0, ANONYMOUS))[1].meta.writable is False


async def test_an_all_mode_client_does_not_change_what_a_plain_client_gets(
    hub: Hub, backend: FakeBackend
) -> None:
    plain, all_mode = Client(hub), Client(hub)
    plain_att = attach(plain, hub, ["fake://a"])
    attach(all_mode, hub, ["fake://a"], mode="ALL")
    for tick in range(3):
        for i in range(50):  # 50 updates per tick: ALL mode keeps each, LATEST only the last
            backend.update("a", float(tick * 100 + i))
        hub.ticker.tick()
    frames = plain.drain()
    assert values(frames, plain_att) == [49.0, 149.0, 249.0]  # one entry per tick, the latest
    assert len(values(all_mode.drain(), 1)) == 150


async def test_a_huge_subscription_does_not_change_what_a_plain_client_gets(
    hub: Hub, backend: FakeBackend
) -> None:
    plain, huge = Client(hub), Client(hub)
    plain_att = attach(plain, hub, ["fake://a"])
    attach(huge, hub, [f"fake://h{i}" for i in range(10_000)])
    for i in range(3):
        backend.update("a", float(i))
        for k in range(0, 10_000, 7):
            backend.update(f"h{k}", float(i))
        hub.ticker.tick()
    assert values(plain.drain(), plain_att) == [0.0, 1.0, 2.0]
    assert sum(len(g[1]) for f in huge.drain() if f[0] == 3 for g in f[2]) == 3 * 1429


class _MasksOnly:
    """A session of the pvws kind: it collects views and reads their masks, never their entries."""

    number = 99

    def __init__(self) -> None:
        self.masks: list[dict[int, int]] = []
        self.views: list[Any] = []

    def collect(self, att: int, view: Any) -> bool:
        self.views.append(view)
        return len(self.views) == 1

    def flush_tick(self) -> None:
        self.masks += [dict(v.tick_masks) for v in self.views]
        self.views = []

    def request_close(self, code: int, reason: str) -> None:
        raise AssertionError(f"closed {code} {reason}")


async def test_entries_nobody_reads_are_not_encoded(hub: Hub, backend: FakeBackend) -> None:
    """A view read only by sessions that send masks and channel state (pvws) encodes nothing;
    a stream session on the same channels still gets every value."""
    stream = Client(hub)
    att = attach(stream, hub, ["fake://a"])
    reader = _MasksOnly()
    key = next(k for k in hub.registry.views if k.ids == ("fake://a",))
    masks_view = hub.registry.open_view(
        type(key)(("fake://a", "fake://b"), "LATEST", 0.0),
        reader,  # type: ignore[arg-type]  # a double of the parts of Client a view reads
        1,
    )
    hub.ticker.tick()
    reader.masks.clear()
    for v in (1.0, 2.0):
        backend.update("a", v)
        hub.ticker.tick()
        assert masks_view.tick_encoded is None
    assert [m.get(0, 0) & 1 for m in reader.masks] == [1, 1]
    assert values(stream.drain(), att) == [1.0, 2.0]
