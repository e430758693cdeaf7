"""The connection table (api/connections.py), in memory: connections counted at accept per
address and in the process, a trusted proxy's clients counted by what it forwards, probes past
the capacity. The real protocols over real sockets: tests/test_slow_senders.py."""

from __future__ import annotations

import resource

import pytest
from pvwire.access.identity import Authenticator
from pvwire.api.connections import Connections, capacity
from pvwire.limits import integer
from starlette.datastructures import Headers

PROXY = "10.9.9.9"


def table(per_address: int = 2, room: int = 100, probe_room: int = 2) -> Connections:
    auth = Authenticator(trusted_proxies=[f"{PROXY}/32"])
    return Connections(per_address, room, auth.is_proxy, auth.client_address, probe_room)


def forwarded_for(address: str) -> Headers:
    return Headers({"x-forwarded-for": address})


def test_one_address_past_its_bound_is_refused_at_accept_and_others_are_not() -> None:
    t = table(per_address=2)
    tickets = [t.accept("10.0.0.1") for _ in range(3)]
    assert [r is None for _, r in tickets] == [True, True, False]
    refusal = tickets[2][1]
    assert refusal is not None and refusal.status == 429 and refusal.reason == "per_address"
    assert "max_connections_per_address" in refusal.message and "10.0.0.1" in refusal.message
    assert t.accept("10.0.0.2")[1] is None  # a neighbour is served
    # The refused one holds its descriptor until it is closed: counted until released.
    assert t.from_address("10.0.0.1") == 3 and t.open == 4
    t.release(tickets[2][0])
    t.release(tickets[2][0])  # closed twice: released once
    assert t.from_address("10.0.0.1") == 2 and t.open == 3
    t.release(tickets[0][0])
    assert t.accept("10.0.0.1")[1] is None  # room again
    assert t.stats().refused == {"per_address": 1, "capacity": 0}


def test_a_proxy_s_connections_count_under_the_addresses_it_forwards() -> None:
    t = table(per_address=2)
    proxied = [t.accept(PROXY) for _ in range(5)]
    # At accept the proxy's connections count in the process, under no address.
    assert all(r is None for _, r in proxied) and t.from_address(PROXY) == 0 and t.open == 5
    a, b, c, d, e = (ticket for ticket, _ in proxied)
    assert t.forwarded(a, forwarded_for("192.0.2.1")) is None
    assert t.forwarded(b, forwarded_for("192.0.2.1")) is None
    refusal = t.forwarded(c, forwarded_for("192.0.2.1"))
    assert refusal is not None and refusal.status == 429 and "192.0.2.1" in refusal.message
    assert t.forwarded(d, forwarded_for("192.0.2.2")) is None  # another client of the proxy
    assert t.from_address("192.0.2.1") == 3 and t.from_address("192.0.2.2") == 1
    # An answered request leaves its kept-alive connection counted under no address, and the
    # next request on it counts under the address that one forwards.
    t.answered(a)
    assert t.from_address("192.0.2.1") == 2
    assert t.forwarded(a, forwarded_for("192.0.2.3")) is None
    assert t.from_address("192.0.2.3") == 1 and t.from_address("192.0.2.1") == 2
    for ticket in (a, b, c, d, e):
        t.release(ticket)
    assert t.open == 0 and not any(t.from_address(x) for x in ("192.0.2.1", "192.0.2.2"))


def test_a_direct_connection_keeps_its_peer_whatever_its_headers_say() -> None:
    t = table(per_address=1)
    ticket, _ = t.accept("10.0.0.1")
    assert t.forwarded(ticket, forwarded_for("192.0.2.1")) is None
    t.answered(ticket)
    assert t.from_address("10.0.0.1") == 1 and t.from_address("192.0.2.1") == 0


def test_past_the_capacity_only_probes_are_answered_then_nothing() -> None:
    t = table(per_address=100, room=3, probe_room=2)
    within = [t.accept(f"10.0.1.{i}")[0] for i in range(3)]
    assert all(t.refusal_of(x, b"/graphql") is None for x in within)
    over = [t.accept(f"10.0.2.{i}") for i in range(2)]
    assert all(r is None and x.overflow for x, r in over)
    ticket = over[0][0]
    assert t.refusal_of(ticket, b"/healthz") is None and t.refusal_of(ticket, b"/readyz") is None
    refusal = t.refusal_of(ticket, b"/graphql")
    assert refusal is not None and refusal.status == 503 and "max_connections" in refusal.message
    # Past the probes' room: refused at accept, before anything is read.
    refused, refusal = t.accept("10.0.3.1")
    assert refusal is not None and refusal.status == 503 and refusal.reason == "capacity"
    assert t.stats().refused["capacity"] == 2
    # Once connections close, a new one is within the capacity again.
    for x in (refused, within[0], over[0][0], over[1][0]):
        t.release(x)
    again, refusal = t.accept("10.0.3.2")
    assert refusal is None and not again.overflow and t.open == 3


def test_a_connection_turning_websocket_hands_its_place_over() -> None:
    t = table()
    ticket, _ = t.accept("10.0.0.1")
    transport = object()
    t.hand_over(transport, ticket)
    assert t.take_over(transport) is ticket and t.take_over(transport) is None
    assert t.from_address("10.0.0.1") == 1


def test_the_capacity_leaves_descriptors_to_the_rest_of_the_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reserved = integer("reserved_descriptors")
    limits = {"limit": (20_000, 20_000)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits["limit"])
    assert capacity(16_384) == 16_384
    assert capacity(100_000) == 20_000 - reserved
    limits["limit"] = (1_024, 4_096)  # systemd's default soft limit: half of it for clients
    caplog.clear()
    assert capacity(16_384) == 512
    assert "this process takes 512 connections" in caplog.text  # said at start, with the fix
    limits["limit"] = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert capacity(16_384) == 16_384
