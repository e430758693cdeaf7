"""A reconnect storm costs the hub work in proportion to the clients, not to their square.

Counted, not timed: the sessions here count every comparison made with them (`__eq__`) and every
read of their address, which is what a scan of a list of attachments or of every session does.
The hub is the real one (in memory, tests/hub_doubles.py's backend). Connections per address are
counted at accept, outside the hub (tests/test_connections.py); what the hub keeps per address is
the channels each one holds."""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import pytest
from pvwire.core.hub import Hub
from pvwire.wire.session import Session, SessionLimits

from .hub_doubles import FakeBackend

N = 300  # a scan would make N * N / 2 = 45,000 comparisons; an index makes none


class CountedSession(Session):
    """A real session that counts the comparisons and the address reads made with it."""

    compared = 0
    address_reads = 0

    def __eq__(self, other: object) -> bool:
        CountedSession.compared += 1
        return self is other

    def __hash__(self) -> int:
        return id(self)

    @property
    def address(self) -> str:
        CountedSession.address_reads += 1
        return self._address

    @address.setter
    def address(self, value: str) -> None:
        self._address = value


def storm(hub: Hub, addresses: list[str]) -> list[CountedSession]:
    """One session per address, each attaching the same token (one shared view)."""
    message = msgpack.packb([16, 1, hub.signer.issue(["fake://a", "fake://b"]).token])
    sessions = []
    for i, address in enumerate(addresses):
        s = CountedSession(i + 1, address, hub, b"\x91\x00", SessionLimits(), lambda: None)
        hub.add_session(s)
        s.receive(message)
        assert s.attachments, s.next_frame()
        sessions.append(s)
    return sessions


def reset_counts() -> None:
    CountedSession.compared = CountedSession.address_reads = 0


async def test_n_clients_leaving_one_view_make_no_comparison_per_other_client(
    hub: Hub, backend: FakeBackend
) -> None:
    sessions = storm(hub, ["10.0.0.1"] * N)
    (view,) = hub.registry.views.values()
    assert view.subscribers() == N
    reset_counts()
    for s in reversed(sessions):  # the newest first: the far end of a list
        hub.remove_session(s)
    # A list's `remove` compared each leaving client with every one attached before it.
    assert CountedSession.compared <= N, CountedSession.compared
    assert not hub.registry.views and not hub.sessions


async def test_the_tick_still_serves_attachments_in_the_order_they_came(
    hub: Hub, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = storm(hub, [f"10.0.0.{i}" for i in range(5)])
    for s in sessions[1:4]:
        hub.remove_session(s)
    order: list[Session] = []

    def in_order(s: Session) -> Callable[[int, object], bool]:
        """A `collect` that records which session the tick served."""

        def collect(att: int, view: object) -> bool:
            order.append(s)
            return True

        return collect

    for s in (sessions[0], sessions[4]):
        monkeypatch.setattr(s, "collect", in_order(s))
    backend.update("a", 1.0)
    hub.ticker.tick()
    assert order == [sessions[0], sessions[4]]


async def test_attaching_n_clients_reads_each_address_a_bounded_number_of_times(
    hub: Hub, backend: FakeBackend
) -> None:
    reset_counts()
    sessions = storm(hub, ["10.0.0.1"] * (N // 2) + ["10.0.0.2"] * (N // 2))
    # A scan read every session's address to attach each new one: N * N / 2 reads.
    assert CountedSession.address_reads <= 4 * N, CountedSession.address_reads
    held = hub.address_channels
    assert held.held_by("10.0.0.1") == held.held_by("10.0.0.2") == 2  # two channels each
    for s in sessions[: N // 2 + 1]:
        hub.remove_session(s)
        hub.remove_session(s)  # released twice (server stop, then the connection): once
    assert held.held_by("10.0.0.1") == 0
    assert held.held_by("10.0.0.2") == 2
    for s in sessions[N // 2 + 1 :]:
        hub.remove_session(s)
    assert held.held_by("10.0.0.2") == 0


async def test_an_attachment_gives_back_what_it_held_under_the_address_it_had(
    hub: Hub, backend: FakeBackend
) -> None:
    (s,) = storm(hub, ["10.0.0.1"])
    s.address = "10.0.0.9"  # e.g. a shared feed that learns its viewer's address later
    hub.remove_session(s)
    held = hub.address_channels
    assert held.held_by("10.0.0.1") == held.held_by("10.0.0.9") == 0
