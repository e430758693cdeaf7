"""The client's address behind trusted proxies (access/forwarded.py through
`Authenticator.client_address`): the right-most `X-Forwarded-For` entry that is no trusted proxy,
over every header line; `Forwarded` read the same way when there is no `X-Forwarded-For`;
malformed entries end the walk at the last trusted hop; a header of any length costs a few
entries' work."""

from __future__ import annotations

import pytest
from pvwire.access import forwarded
from pvwire.access.identity import Authenticator
from starlette.datastructures import Headers

PROXIES = ["10.1.0.0/16", "2001:db8:a::/48"]
EDGE = "10.1.2.3"  # the TCP peer: a trusted proxy


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(trusted_proxies=PROXIES)


def address(auth: Authenticator, *lines: tuple[str, str], peer: str = EDGE) -> str:
    """The client's address for a request from `peer` with these header lines, as Starlette
    hands them to the endpoints (every line kept, in order)."""
    raw = [(name.lower().encode(), value.encode()) for name, value in lines]
    return auth.client_address(Headers(raw=raw), peer)


def xff(value: str) -> tuple[str, str]:
    return ("X-Forwarded-For", value)


def fwd(value: str) -> tuple[str, str]:
    return ("Forwarded", value)


@pytest.mark.parametrize(
    ("lines", "client"),
    [
        # nginx appends the address it saw to what the client wrote: the client's own first
        # entry is not the client (issue's example).
        ([xff("192.168.10.5, 198.51.100.7")], "198.51.100.7"),
        # Trusted hops are walked through, from the right.
        ([xff("192.168.10.5, 198.51.100.7, 10.1.0.9, 10.1.7.7")], "198.51.100.7"),
        # HAProxy's `option forwardfor` adds a line of its own: the lines are one list.
        ([xff("127.0.0.1"), xff("198.51.100.7")], "198.51.100.7"),
        ([xff("127.0.0.1, 203.0.113.1"), xff("198.51.100.7, 10.1.0.9")], "198.51.100.7"),
        # Every entry a trusted proxy: the left-most, as nginx has it (the proxies' own request).
        ([xff("10.1.0.7, 10.1.0.9")], "10.1.0.7"),
        # No header: the proxy itself.
        ([], EDGE),
        # Forms proxies write: ports, brackets, IPv6, IPv4-mapped.
        ([xff("203.0.113.9:51234")], "203.0.113.9"),
        ([xff("[2001:db8::7]:4711")], "2001:db8::7"),
        ([xff("2001:db8::7")], "2001:db8::7"),
        ([xff("::ffff:203.0.113.9")], "203.0.113.9"),
        ([xff("2001:db8::7, 2001:db8:a::1")], "2001:db8::7"),
    ],
)
def test_the_right_most_entry_that_is_no_trusted_proxy_is_the_client(
    auth: Authenticator, lines: list[tuple[str, str]], client: str
) -> None:
    assert address(auth, *lines) == client


@pytest.mark.parametrize(
    ("value", "client"),
    [
        # What a client writes before the first trusted entry is never read.
        ("203.0.113.9, garbage", EDGE),
        ("garbage, 198.51.100.7", "198.51.100.7"),
        # An entry no address (written by the trusted hop right of it) ends the walk there.
        ("203.0.113.9, unknown, 10.1.0.9", "10.1.0.9"),
        ("203.0.113.9, 198.51.100.7:x, 10.1.0.9", "10.1.0.9"),
        ("203.0.113.9, , 10.1.0.9", "10.1.0.9"),
        ("203.0.113.9, host.example.org", EDGE),
        ("203.0.113.9, [203.0.113.1]", EDGE),  # brackets are for IPv6
        ("203.0.113.9, 1.2.3.4.5", EDGE),
        ("", EDGE),
    ],
)
def test_a_malformed_entry_ends_the_walk_at_the_last_trusted_hop(
    auth: Authenticator, value: str, client: str
) -> None:
    assert address(auth, xff(value)) == client


def test_headers_from_a_client_that_is_no_trusted_proxy_are_ignored(auth: Authenticator) -> None:
    for peer in ("198.51.100.7", "127.0.0.1", "", "not-an-address"):
        got = address(auth, xff("10.1.0.9"), fwd("for=10.1.0.9"), peer=peer)
        assert got == peer
    # A peer given in its IPv4-mapped form is still the trusted proxy it is.
    assert address(auth, xff("198.51.100.7"), peer="::ffff:10.1.2.3") == "198.51.100.7"


def test_no_trusted_proxy_means_the_peer_whatever_the_headers() -> None:
    auth = Authenticator()
    assert address(auth, xff("203.0.113.9"), peer="127.0.0.1") == "127.0.0.1"


@pytest.mark.parametrize(
    ("value", "client"),
    [
        ("for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
        ('for="[2001:db8:cafe::17]:4711"', "2001:db8:cafe::17"),
        ('For="192.0.2.60:443"', "192.0.2.60"),
        ("for=192.0.2.43, for=198.51.100.17", "198.51.100.17"),
        ("for=192.0.2.43, for=198.51.100.17;by=10.1.0.1, for=10.1.0.9", "198.51.100.17"),
        # A proxy that hides its client ends the walk at that proxy.
        ("for=192.0.2.43, for=unknown, for=10.1.0.9", "10.1.0.9"),
        ('for=192.0.2.43, for="_hidden", for=10.1.0.9', "10.1.0.9"),
        # An element with no `for=`, or two, says no address.
        ("for=192.0.2.43, proto=https;by=10.1.0.1", EDGE),
        ("for=192.0.2.43;for=192.0.2.44", EDGE),
        # A quote a client leaves open spoils only its own elements.
        ('for="192.0.2.43, for=198.51.100.17', "198.51.100.17"),
        ('for="192.0.2.43', EDGE),
        ('for=192.0.2."43"', EDGE),
    ],
)
def test_forwarded_is_read_the_same_way(auth: Authenticator, value: str, client: str) -> None:
    assert address(auth, fwd(value)) == client


def test_x_forwarded_for_wins_over_forwarded(auth: Authenticator) -> None:
    """The documented proxies append to X-Forwarded-For and pass a client's Forwarded through:
    a request that has both is read by X-Forwarded-For alone."""
    got = address(auth, fwd("for=127.0.0.1"), xff("198.51.100.7"))
    assert got == "198.51.100.7"
    assert address(auth, fwd("for=198.51.100.7"), xff("")) == EDGE


def test_a_header_of_any_length_is_read_a_few_entries_from_the_right(
    auth: Authenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100,000 entries of trusted proxies: the walk stops after forwarded_hops of them (the last
    one read is the client), having parsed no more than those."""
    parsed: list[str] = []
    real = forwarded.parse_node

    def counting(text: str) -> forwarded.Address | None:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(forwarded, "parse_node", counting)
    many = ", ".join(f"10.1.{i >> 8 & 255}.{i & 255}" for i in range(100_000))
    got = address(auth, xff("203.0.113.9, " + many))
    hops = forwarded.HOPS
    assert parsed[0] == EDGE and len(parsed) == 1 + hops  # the peer, then the entries
    i = 100_000 - hops
    assert got == f"10.1.{i >> 8 & 255}.{i & 255}"
    # Over many lines alike.
    parsed.clear()
    address(auth, *[xff("10.1.0.1")] * 5_000)
    assert len(parsed) == 1 + hops


def test_an_entry_past_its_length_bound_is_no_address(auth: Authenticator) -> None:
    long = "1" * (forwarded.ENTRY_BYTES + 1)
    assert address(auth, xff(f"203.0.113.9, {long}")) == EDGE
    assert address(auth, xff(f"{long}, 198.51.100.7")) == "198.51.100.7"
    assert address(auth, fwd(f"for=192.0.2.1;host={'h' * forwarded.ENTRY_BYTES}")) == EDGE
    assert list(forwarded.xff_entries([long])) == [""]


def test_a_plain_mapping_holds_one_line(auth: Authenticator) -> None:
    got = auth.client_address({"x-forwarded-for": "192.168.10.5, 198.51.100.7"}, EDGE)
    assert got == "198.51.100.7"
