"""Every bound kept per client address counts an IPv6 client by its /64 (access/bound_key.py):
the key itself, then each structure that keys on it, in memory. Over a real server, IPv6
loopback and a trusted proxy forwarding the addresses of one /64: tests/test_ipv6.py."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from pvwire.access.bound_key import bound_key
from pvwire.access.identity import Authenticator, Identity
from pvwire.access.ratelimit import RateLimiter
from pvwire.access.refusals import RefusalLog
from pvwire.api.connections import Connections
from pvwire.core.address_channels import AddressChannels
from pvwire.limits import integer
from starlette.datastructures import Headers

PREFIX = integer("ipv6_bound_prefix")
NET = "2001:db8:7:7::/64"
PROXY = "10.9.9.9"


def in_net(i: int, net: str = NET) -> str:
    """The `i`-th address of `net` from its other end: as one client with a /64 picks them."""
    return str(ipaddress.ip_network(net)[-1 - i])


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("127.0.0.1", "127.0.0.1"),
        ("2001:db8:7:7::1", NET),
        ("2001:db8:7:7:ffff:ffff:ffff:ffff", NET),
        ("2001:DB8:7:7:0:0:0:9", NET),  # however it is written
        ("::1", "::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        # What a dual-stack socket gives an IPv4 peer: that IPv4 address, not the mapped /64,
        # which would hold every IPv4 client at once.
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("::ffff:127.0.0.5", "127.0.0.5"),
        ("testclient", "testclient"),  # no address: its own key
        ("", ""),
    ],
)
def test_the_bound_key_of(address: str, key: str) -> None:
    assert bound_key(address) == key
    assert bound_key(key) == key  # a key is its own key: counting it again changes nothing


def test_addresses_differing_within_the_prefix_are_other_clients() -> None:
    """Past the prefix (the last of its bits, then every later one): one key; a bit inside it
    flipped: another client's."""
    base = int(ipaddress.IPv6Address("2001:db8:7:7::"))
    same = {bound_key(str(ipaddress.IPv6Address(base ^ (1 << b)))) for b in range(128 - PREFIX)}
    assert same == {NET}
    assert (
        bound_key(str(ipaddress.IPv6Address(base ^ (1 << (128 - PREFIX))))) == "2001:db8:7:6::/64"
    )
    assert bound_key("192.0.2.7") != bound_key("192.0.2.8")  # IPv4: the whole address


def test_the_identity_spends_its_address_key_s_budget_or_its_user_s() -> None:
    a, b = Identity("", address=in_net(0)), Identity("", address=in_net(1))
    assert a.bound_key == b.bound_key == a.rate_key == NET
    assert a.address != b.address  # the audit file's and the rules' address stays whole
    assert Identity("alice", address=in_net(0)).rate_key == "alice"
    limiter = RateLimiter(rate=1.0, burst=3.0, clock=lambda: 0.0)
    spent = [limiter.take(Identity("", address=in_net(i)).rate_key) for i in range(10)]
    assert spent == [True] * 3 + [False] * 7


def test_connections_of_one_64_share_one_address_s_bound() -> None:
    t = Connections(per_address=3, capacity=100)
    answers = [t.accept(in_net(i)) for i in range(4)]
    assert [r is None for _, r in answers] == [True, True, True, False]
    refusal = answers[-1][1]
    assert refusal is not None and refusal.status == 429 and NET in refusal.message
    assert t.accept("2001:db8:7:8::1")[1] is None  # the next /64 is another client
    assert t.from_address(in_net(99)) == 4
    for ticket, _ in answers:
        t.release(ticket)
    assert t.from_address(NET) == 0


def test_a_proxy_s_clients_of_one_64_share_one_address_s_bound() -> None:
    auth = Authenticator(trusted_proxies=[f"{PROXY}/32"])
    t = Connections(2, 100, auth.is_proxy, auth.client_address)
    tickets = [t.accept(PROXY)[0] for _ in range(3)]
    refusals = [
        t.forwarded(k, Headers({"x-forwarded-for": in_net(i)})) for i, k in enumerate(tickets)
    ]
    assert [r is None for r in refusals] == [True, True, False]


def test_channels_of_one_64_share_one_address_s_budget() -> None:
    held = AddressChannels(limit=3)
    for i in range(3):
        assert held.take(in_net(i), [f"ca://X:{i}"]) is None
    refused = held.take(in_net(3), ["ca://X:3"])
    assert refused is not None and NET in refused and "max_channels_per_address" in refused
    assert held.held_by(in_net(77)) == 3
    assert held.take("2001:db8:7:8::1", ["ca://X:3"]) is None  # another /64's own budget
    for i in range(3):
        held.give_back(in_net(i), [f"ca://X:{i}"])
    assert held.held_by(NET) == 0


def test_refusals_of_one_64_are_one_source_and_each_line_names_its_whole_address() -> None:
    now = [1000.0]
    written: list[dict[str, Any]] = []
    log = RefusalLog(written.append, clock=lambda: now[0])
    for i in range(200):  # 2 s, a new address of the /64 each time
        log.refused("bad_signature", in_net(i), "query")
        now[0] += 0.01
    lines = [x for x in written if x["event"] == "auth_refused"]
    # One source's burst and rate, not the reason's (100, which fresh sources would each get).
    assert len(lines) <= log.burst + log.rate * 2 + 1, len(lines)
    named = [x["address"] for x in lines]
    assert len(set(named)) == len(named) and set(named) <= {in_net(i) for i in range(200)}


def test_a_dual_stack_socket_s_ipv4_client_is_its_ipv4_address() -> None:
    """A server listening on `::` sees an IPv4 client as `::ffff:a.b.c.d`: the address every
    rule, audit line and bound sees is the IPv4 one, a trusted proxy's clients' too."""
    auth = Authenticator(trusted_proxies=["127.0.0.2/32"])
    assert auth.client_address(Headers({}), "::ffff:127.0.0.5") == "127.0.0.5"
    assert auth.client_address(Headers({}), "::ffff:127.0.0.2") == "127.0.0.2"
    forwarded = Headers({"x-forwarded-for": "192.0.2.9"})
    assert auth.client_address(forwarded, "::ffff:127.0.0.2") == "192.0.2.9"
    assert auth.client_address(forwarded, "::ffff:127.0.0.5") == "127.0.0.5"
    assert auth.identify(Headers({}), "::ffff:10.1.2.3").address == "10.1.2.3"
