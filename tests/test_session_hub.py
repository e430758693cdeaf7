"""The session state machine and the hub, in memory: no sockets, no IOC (a test-double backend).

Ticks are driven by hand so every assertion is exact; the same code runs under the real pump in
tests/test_server_*.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pvwire import limits
from pvwire.access.identity import ANONYMOUS, Identity
from pvwire.config import Settings
from pvwire.core.hub import Hub
from pvwire.core.subscribe import StreamOptions
from pvwire.errors import CredentialsExpired, WriteDenied
from pvwire.model import ConnState, Metadata, Reading
from pvwire.wire.session import SessionLimits
from pvwire.wire.tokens import TokenSigner

from .eventually import eventually_async
from .hub_doubles import KEYS, Client, FakeBackend, attach


async def test_attach_sends_attached_then_a_full_snapshot(hub: Hub, backend: FakeBackend) -> None:
    first = Client(hub)
    attach(first, hub, ["fake://a"])
    backend.update("a", 1.5)
    c = Client(hub)  # a late joiner gets the cached state
    c.drain()  # HELLO
    c.send(16, 5, hub.signer.issue(["fake://a", "fake://b"]).token)
    msgs = c.drain()
    assert msgs[0] == [1, 5, 1, ["fake://a", "fake://b"]]
    kind, seq, att, entries = msgs[1]
    assert (kind, seq, att) == (2, 1, 1)
    # sid 0 has a value: VALUE|TIME|ALARM|META|CONN; sid 1 none yet: META|CONN only.
    assert entries[0][:2] == [0, 31] and entries[0][2] == 1.5
    assert entries[1][:2] == [1, 8 | 16]
    assert entries[1][2]["units"] == "mm" and entries[1][3] == 1


async def test_each_tick_sends_only_changes_with_increasing_seq(
    hub: Hub, backend: FakeBackend
) -> None:
    c = Client(hub)
    att = attach(c, hub, ["fake://a", "fake://b"])
    backend.update("a", 1.0)
    backend.update("a", 2.0)  # conflated within one tick: latest wins, serial 2
    hub.ticker.tick()
    backend.update("b", 3.0, severity=2)
    hub.ticker.tick()
    hub.ticker.tick()  # nothing changed: no frame
    frames = c.drain()
    assert [f[0] for f in frames] == [3, 3]
    assert frames[1][1] == frames[0][1] + 1
    # The first value carries its alarm even when it is NO_ALARM (the initial state is a state).
    assert frames[0][2] == [[att, [[0, 7, 2.0, 2, 1700000000, 0, 0, 0, ""]]]]
    assert frames[1][2] == [[att, [[1, 3 | 4, 3.0, 1, 1700000000, 0, 2, 0, ""]]]]


async def test_clients_share_one_upstream_monitor_and_one_encoding(
    hub: Hub, backend: FakeBackend
) -> None:
    clients = [Client(hub) for _ in range(3)]
    for c in clients:
        attach(c, hub, ["fake://a"])
    assert backend.opened == ["a"]
    assert len(hub.registry.views) == 1
    backend.update("a", 7.0)
    hub.ticker.tick()
    frames = [c.drain() for c in clients]
    # Same groups for everyone (seq is per connection).
    assert frames[0][0][2] == frames[1][0][2] == frames[2][0][2]
    assert frames[0][0][2][0][1][0][2] == 7.0


async def test_metadata_travels_once_and_again_only_when_changed(
    hub: Hub, backend: FakeBackend
) -> None:
    c = Client(hub)
    attach(c, hub, ["fake://a"])
    sink = backend.sinks["a"]
    sink.on_meta(Metadata(type="float64", units="mm", precision=2, writable=True))  # same
    backend.update("a", 1.0)
    hub.ticker.tick()
    sink.on_meta(Metadata(type="float64", units="um", precision=2, writable=True))
    hub.ticker.tick()
    frames = c.drain()
    assert frames[0][2][0][1][0][1] == 7  # first value: value+time+alarm, no META
    assert frames[1][2][0][1][0][1] == 8 and frames[1][2][0][1][0][2]["units"] == "um"


async def test_write_rules_decide_writable_for_the_caller_not_on_the_stream(
    backend: FakeBackend,
) -> None:
    settings = Settings(default_scheme="fake", write_rules=["fake://a"])
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    a, b = hub.registry.acquire("fake://a"), hub.registry.acquire("fake://b")
    # The stream carries the upstream's answer; who may write is per identity (subscribe, get).
    assert a.meta.writable is True and b.meta.writable is True
    assert (await hub.get("fake://a", 1.0, ANONYMOUS))[1].meta.writable is True
    assert (await hub.get("fake://b", 1.0, ANONYMOUS))[1].meta.writable is False


async def test_slow_client_conflates_and_catches_up_without_delaying_others(
    hub: Hub, backend: FakeBackend
) -> None:
    limits = SessionLimits(send_budget=200)
    slow, fast = Client(hub, limits), Client(hub, limits)
    attach(slow, hub, ["fake://a", "fake://b"])
    attach(fast, hub, ["fake://a", "fake://b"])
    for i in range(50):
        backend.update("a", float(i))
        backend.update("b", float(-i))
        hub.ticker.tick()
        fast.drain()  # the fast client reads every frame
    assert slow.session.behind
    assert len([f for f in fast.received if f[0] == 3]) == 50
    unsent = slow.pop_unsent()  # what was queued before it fell behind
    assert 0 < len(unsent) < 50
    # Writer drained: one catch-up DATA with the latest values and serials showing the gaps.
    slow.session.sent(slow.session.queued_bytes)
    catch_up = slow.drain()
    assert len(catch_up) == 1 and catch_up[0][0] == 3
    entries = {e[0]: e for e in catch_up[0][2][0][1]}
    assert entries[0][2] == 49.0 and entries[0][3] == 50
    assert entries[1][2] == -49.0
    assert slow.session.conflated > 0 and not slow.session.behind


async def test_stalled_client_is_closed_with_slow(hub: Hub, backend: FakeBackend) -> None:
    now = [1000.0]
    c = Client(hub, SessionLimits(send_budget=100, stall_timeout=10.0), clock=lambda: now[0])
    attach(c, hub, ["fake://a"])
    backend.update("a", 1.0)
    hub.ticker.tick()
    c.session.next_frame()  # the writer took a frame and never finished sending it
    now[0] += 5
    c.session.housekeeping(now[0])
    assert c.session.close_request is None
    now[0] += 6
    c.session.housekeeping(now[0])
    assert c.session.close_request is not None and c.session.close_request[0] == 4008


async def test_idle_client_gets_heartbeats(hub: Hub) -> None:
    now = [0.0]
    c = Client(hub, SessionLimits(heartbeat=15.0), clock=lambda: now[0])
    c.drain()
    attach(c, hub, ["fake://a"])  # as pvwire's clients do on HELLO
    now[0] = 14.0
    c.session.housekeeping(now[0])
    assert c.drain() == []
    now[0] = 15.5
    c.session.housekeeping(now[0])
    assert c.drain() == [[6]]


async def test_a_client_that_never_speaks_is_closed_after_its_first_message_time(
    hub: Hub,
) -> None:
    """A half handshake: HELLO sent, nothing ever comes back; the socket is not held for ever
    (the heartbeat would keep it alive)."""
    now = [0.0]
    first = limits.number("stream_first_message_s")
    assert SessionLimits().first_message == first
    silent = Client(hub, clock=lambda: now[0])
    speaking = Client(hub, clock=lambda: now[0])
    speaking.send(18, 1)  # any message will do: a PING
    now[0] = first - 1
    for c in (silent, speaking):
        c.session.housekeeping(now[0])
    assert silent.session.close_request is None
    now[0] = first
    for c in (silent, speaking):
        c.session.housekeeping(now[0])
    assert silent.session.close_request is not None
    code, reason = silent.session.close_request
    assert code == 4000 and "stream_first_message_s" in reason, reason
    assert speaking.session.close_request is None


@pytest.mark.parametrize(
    ("token", "code"),
    [("garbage", 4401), ("pvw1.k1.e30.AAAA", 4401), ("pvw1.nokey.e30.AAAA", 4401)],
)
async def test_bad_tokens_fail_only_their_attachment(hub: Hub, token: str, code: int) -> None:
    c = Client(hub)
    c.drain()
    c.send(16, 7, token)
    (err,) = c.drain()
    assert err[:3] == [5, 7, code] and c.session.close_request is None
    assert attach(c, hub, ["fake://a"])  # the connection goes on


async def test_expired_token_gets_4402_for_that_attach(hub: Hub) -> None:
    old = TokenSigner(KEYS, "k1", ttl=10, clock=lambda: 0.0).issue(["fake://a"]).token
    c = Client(hub)
    c.drain()
    c.send(16, 3, old)
    (err,) = c.drain()
    assert err[:3] == [5, 3, 4402] and "expired" in err[3]


async def test_token_from_another_key_is_refused(hub: Hub) -> None:
    forged = TokenSigner({"k1": b"other"}, "k1").issue(["fake://a"]).token
    c = Client(hub)
    c.drain()
    c.send(16, 1, forged)
    assert c.drain() == [[5, 1, 4401, "token signature does not match"]]


async def test_malformed_messages_get_errors_and_the_session_goes_on(
    hub: Hub, backend: FakeBackend
) -> None:
    c = Client(hub)
    c.drain()
    c.session.receive(b"\xc1garbage")
    c.send(99)
    c.session.receive_text()
    c.send(17, 3, 42)
    errors = c.drain()
    assert [e[0] for e in errors] == [5, 5, 5, 5]
    assert [e[2] for e in errors] == [4400, 4400, 4400, 4404]
    assert errors[3][1] == 3 and "att 42" in errors[3][3]
    assert c.session.close_request is None
    attach(c, hub, ["fake://a"])  # still works


async def test_ping_is_answered_in_order(hub: Hub) -> None:
    c = Client(hub)
    c.drain()
    c.send(18, "t-1")
    assert c.drain() == [[7, "t-1"]]


async def test_detach_releases_the_channel_after_linger(hub: Hub, backend: FakeBackend) -> None:
    import asyncio

    c = Client(hub)
    att = attach(c, hub, ["fake://a"])
    c.send(17, 9, att)
    assert c.drain() == [[4, 9, att]]
    assert not hub.registry.views
    await asyncio.sleep(0.05)  # linger_s = 0 in this fixture
    assert backend.monitors[0].closed and "fake://a" not in hub.registry.channels


async def test_reattach_within_linger_reuses_the_monitor(backend: FakeBackend) -> None:
    settings = Settings(default_scheme="fake", linger_s=60.0)
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    hub.start()
    c = Client(hub)
    att = attach(c, hub, ["fake://a"])
    c.send(17, 2, att)
    attach(c, hub, ["fake://a"])
    assert backend.opened == ["a"] and not backend.monitors[0].closed
    await hub.stop()


async def test_too_many_channels_is_refused(backend: FakeBackend) -> None:
    settings = Settings(default_scheme="fake")
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    c = Client(hub, SessionLimits(max_channels=2))
    c.drain()
    c.send(16, 1, hub.signer.issue(["fake://a", "fake://b", "fake://c"]).token)
    (err,) = c.drain()
    assert err[0] == 5 and err[2] == 4413
    assert not hub.registry.channels


async def test_max_rate_limits_emissions(hub: Hub, backend: FakeBackend) -> None:

    c = Client(hub)
    # The opening delta was this view's last group. 2 s to the next: a pause of the test (a busy
    # machine) as long as that would make the view due before the checks below.
    attach(c, hub, ["fake://a"], max_rate=0.5)
    backend.update("a", 1.0)
    hub.ticker.tick()
    backend.update("a", 2.0)
    hub.ticker.tick()  # both held back until 2 s after the last group, then merged
    assert not c.drain()
    # The hub scheduled a tick for when the view is due; wait for it (bounded, not a sleep).
    later = await eventually_async(c.drain, "the scheduled tick", interval=0.01)
    (entry,) = later[0][2][0][1]
    assert len(later) == 1 and entry[2] == 2.0 and entry[3] == 2  # latest wins, serial counts


async def test_all_mode_sends_every_update_in_order(hub: Hub, backend: FakeBackend) -> None:
    c = Client(hub)
    attach(c, hub, ["fake://a"], mode="ALL")
    for i in range(5):
        backend.update("a", float(i))
    hub.ticker.tick()
    (frame,) = c.drain()
    entries = frame[2][0][1]
    assert [e[2] for e in entries] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [e[3] for e in entries] == [1, 2, 3, 4, 5]


async def test_two_attachments_share_a_frame_with_two_groups(
    hub: Hub, backend: FakeBackend
) -> None:
    c = Client(hub)
    a1 = attach(c, hub, ["fake://a"])
    a2 = attach(c, hub, ["fake://b", "fake://a"])
    backend.update("a", 5.0)
    hub.ticker.tick()
    (frame,) = c.drain()
    groups = {g[0]: g[1] for g in frame[2]}
    assert set(groups) == {a1, a2}
    assert groups[a1][0][0] == 0 and groups[a2][0][0] == 1


async def test_disconnect_and_reconnect_are_streamed(hub: Hub, backend: FakeBackend) -> None:
    c = Client(hub)
    attach(c, hub, ["fake://a"])
    backend.update("a", 1.0)
    hub.ticker.tick()
    sink = backend.sinks["a"]
    sink.on_connection(ConnState.DISCONNECTED, "IOC gone")
    hub.ticker.tick()
    sink.on_connection(ConnState.CONNECTED)
    backend.update("a", 2.0)
    hub.ticker.tick()
    frames = c.drain()
    assert frames[1][2][0][1][0] == [0, 16, 2, "IOC gone"]
    last = frames[2][2][0][1][0]
    assert last[1] == 1 | 2 | 16 and last[2] == 2.0 and last[3] == 1  # serial restarted


async def test_get_of_a_monitored_channel_comes_from_the_cache(
    hub: Hub, backend: FakeBackend
) -> None:
    c = Client(hub)
    attach(c, hub, ["fake://a"])
    backend.update("a", 4.5)
    cid, reading = await hub.get("a", 1.0, ANONYMOUS)
    assert (cid, reading.value) == ("fake://a", 4.5)
    assert hub.control.stats.cache_gets == 1 and hub.control.stats.upstream_gets == 0
    await hub.get("b", 1.0, ANONYMOUS)
    assert hub.control.stats.upstream_gets == 1


async def test_arrays_travel_as_typed_bytes(hub: Hub, backend: FakeBackend) -> None:
    c = Client(hub)
    attach(c, hub, ["fake://a"])
    backend.update("a", np.arange(1000, dtype=np.float64))
    hub.ticker.tick()
    (frame,) = c.drain()
    value = frame[2][0][1][0][2]
    assert value.dtype == np.dtype("<f8") and value.shape == (1000,) and value[999] == 999.0


async def test_search_globs_over_active_and_backend_names(hub: Hub) -> None:
    c = Client(hub)
    attach(c, hub, ["fake://zz"])
    assert hub.search("fake://*", 10, ANONYMOUS) == ["fake://a", "fake://b", "fake://zz"]
    assert hub.search("z*", 10, ANONYMOUS) == ["fake://zz"]
    assert hub.search("*", 2, ANONYMOUS) == ["fake://a", "fake://b"]


async def test_updates_merged_upstream_count_in_the_serial(hub: Hub, backend: FakeBackend) -> None:
    c = Client(hub)
    attach(c, hub, ["fake://a"])
    backend.sinks["a"].on_update(1.0, 1, 0, 0, 0, "")
    hub.ticker.tick()
    backend.sinks["a"].on_update(2.0, 2, 0, 0, 0, "", 3)  # the library merged 3 before this one
    hub.ticker.tick()
    first, second = c.drain()
    assert first[2][0][1][0][3] == 1
    assert second[2][0][1][0][3] == 5  # the client counts 3 conflated updates


async def test_rules_reload_after_a_slow_close_still_releases_the_view(
    backend: FakeBackend, tmp_path: Path
) -> None:
    # One housekeeping pass closes a stalled client (4008), then reloads rules that deny its
    # channel: the attachment ends while the connection is closing, and its view and upstream
    # monitor must still be released when the pump hands the session back.
    rules = tmp_path / "rules.toml"
    rules.write_text('default = "READ"\n')
    settings = Settings(default_scheme="fake", linger_s=0.0, access_rules=str(rules))
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    now = [1000.0]
    c = Client(hub, SessionLimits(send_budget=100, stall_timeout=10.0), clock=lambda: now[0])
    attach(c, hub, ["fake://a"])
    backend.update("a", 1.0)
    hub.ticker.tick()
    c.session.next_frame()  # the writer took a frame and never finished sending it
    now[0] += 11
    c.session.housekeeping(now[0])
    assert c.session.close_request is not None and c.session.close_request[0] == 4008
    rules.write_text('default = "NONE"\n')
    hub.reload_rules(force=True)
    hub.remove_session(c.session)  # what the pump does once the socket is closed
    assert not hub.registry.views
    assert hub.registry.channels["fake://a"].refs == 0  # lingers, then its monitor closes
    await hub.stop()


async def test_a_session_failing_a_rules_reload_is_closed_and_the_others_are_checked(
    backend: FakeBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('default = "READ"\n')
    settings = Settings(default_scheme="fake", linger_s=0.0, access_rules=str(rules))
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    clients = [Client(hub) for _ in range(3)]
    atts = [attach(c, hub, ["fake://a"]) for c in clients]
    broken = clients[1].session

    def fails(att: int, code: int, message: str) -> None:
        raise RuntimeError("end_attachment broke")

    broken.end_attachment = fails  # type: ignore[method-assign]
    rules.write_text('default = "NONE"\n')
    hub.reload_rules(force=True)  # whatever the order of the sessions, every one is dealt with
    assert broken.close_request == (1011, "internal error; reconnect to resume")
    for c, att in zip(clients, atts, strict=True):
        if c.session is not broken:
            error, detached = c.drain()
            assert error[:3] == [5, None, 4403] and detached == [4, None, att]
    assert hub.snapshot().failures["session"] == 1
    assert [r.message for r in caplog.records if "new rules" in r.message] == [
        f"checking session {broken.number} against the new rules failed"
    ]
    await hub.stop()


@pytest.mark.parametrize("late", [0, 5])
async def test_subscribe_refuses_credentials_past_their_expiry(
    backend: FakeBackend, late: int
) -> None:
    # A JWT accepted inside its leeway after `exp` (or at it) would make a token that has expired
    # already: ATTACH would answer 4402, and registering again with the same JWT would loop.
    now = 1_800_000_000.0
    signer = TokenSigner(KEYS, "k1", clock=lambda: now)
    hub = Hub({"fake": backend}, Settings(default_scheme="fake"), signer)
    expired = Identity("olga", frozenset({"operators"}), "jwt", "10.0.0.1", now - late)
    with pytest.raises(CredentialsExpired, match=f"expired at {int(now) - late} ") as refused:
        hub.subscribe(["fake://a"], expired, StreamOptions())
    assert refused.value.code == "UNAUTHENTICATED"
    await hub.stop()


async def test_a_token_expires_with_the_credentials_and_attaches_until_then(
    backend: FakeBackend,
) -> None:
    now = [1_800_000_000.0]
    hub = Hub(
        {"fake": backend},
        Settings(default_scheme="fake"),
        TokenSigner(KEYS, "k1", clock=lambda: now[0]),
    )
    valid = Identity("olga", frozenset(), "jwt", "10.0.0.1", now[0] + 1)
    registration = hub.subscribe(["fake://a"], valid, StreamOptions())
    assert registration.expires_at == now[0] + 1
    c = Client(hub)
    c.drain()
    c.send(16, 1, registration.token)
    assert c.drain()[0] == [1, 1, 1, ["fake://a"]]  # ATTACHED
    now[0] += 1
    c.send(16, 2, registration.token)
    assert c.drain()[0][:3] == [5, 2, 4402]
    with pytest.raises(CredentialsExpired):
        hub.subscribe(["fake://a"], valid, StreamOptions())
    await hub.stop()


class ForwardingBackend(FakeBackend):
    """Puts as the user, recording every call that would reach the upstream server."""

    forwards_identity = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, ...]] = []

    async def get(self, name: str, timeout: float) -> Reading:
        self.calls.append(("get", name))
        return await super().get(name, timeout)

    async def put_as(self, user: str, name: str, value: object, wait: bool, timeout: float) -> None:
        self.calls.append(("put_as", user, name))


async def test_a_user_name_the_ioc_would_misread_is_refused_before_the_backend_works() -> None:
    """A NUL or a control character (`olga\\0vic` is olga to the IOC): refused before the
    backend reads the type or searches for the server, as it is before anything is sent."""
    backend = ForwardingBackend()
    settings = Settings(default_scheme="fake", write_rules=["fake://*"], forward_identity=True)
    hub = Hub({"fake": backend}, settings, TokenSigner(KEYS, "k1"))
    try:
        for forged in ("olga\x00vic", "olga\n", "o" * 300):
            with pytest.raises(WriteDenied):
                await hub.control.put("fake://a", 1.0, True, 5.0, Identity(forged, source="jwt"))
        assert backend.calls == []
        await hub.control.put("fake://a", 1.0, True, 5.0, Identity("olga", source="jwt"))
        assert backend.calls == [("put_as", "olga", "a")]
    finally:
        await hub.stop()
