"""Who the client is behind trusted proxies: the right-most forwarded address that is not itself
a trusted proxy, as nginx's `real_ip_recursive` finds it.

A proxy appends the address it took the request from: nginx's `$proxy_add_x_forwarded_for` to
the `X-Forwarded-For` it got, HAProxy's `option forwardfor` as a header line of its own. So what
a client wrote comes first and what the nearest proxy wrote comes last. Walking from the right,
an entry is believed while the hop that wrote it is trusted: the TCP peer (a trusted proxy)
wrote the last entry, an entry that is itself a trusted proxy wrote the one before it. The first
entry that is not a trusted proxy is the client; entries left of it are the client's own words
and are never read. When every entry is a trusted proxy, the left-most is the client (a
request the proxies made themselves), as nginx has it.

An entry that does not parse as an address (`unknown`, an obfuscated name, garbage) ends the
walk: the client is the last trusted hop, which wrote it, never a string a client chose. The
walk reads at most `forwarded_hops` entries from the right, each at most
`forwarded_entry_bytes` long, so a header of thousands of entries costs what a few do.

`Forwarded` (RFC 7239) is read the same way, its elements' `for=` nodes as the entries, but only
when a request carries no `X-Forwarded-For` at all: proxies write `X-Forwarded-For` (nginx and
HAProxy append, ingress-nginx replaces it by default) and pass a client's `Forwarded` through
untouched, so were `Forwarded` preferred, a client could write every entry of it.
Elements are split at every comma, quoted or not (no `for=` node holds one), so an unclosed
quote spoils only the client's own elements, not the ones a proxy appended after them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..limits import integer

__all__ = [
    "Address",
    "TrustedProxies",
    "client_address",
    "forwarded_nodes",
    "parse_node",
    "xff_entries",
]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

HOPS = integer("forwarded_hops")
ENTRY_BYTES = integer("forwarded_entry_bytes")


class TrustedProxies:
    """The `--trusted-proxy` networks. A client whose address is one of them is a proxy that
    named nobody behind it (a frontend in TCP mode, a proxy that does not append, its own health
    check): who sent the request is not known, so neither the loopback check of the admin views
    nor a `hosts` rule takes it for an address of its own (core/hub.py, access/rules.py)."""

    def __init__(self, cidrs: Iterable[str] = ()) -> None:
        self.networks = tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def holds(self, ip: Address) -> bool:
        return any(ip in net for net in self.networks)

    def lists(self, address: str) -> bool:
        """`address` (a TCP peer, a client's address) is in one of the networks."""
        if not self.networks:
            return False
        ip = parse_node(address)
        return ip is not None and self.holds(ip)


def client_address(
    peer: str,
    x_forwarded_for: Sequence[str],
    forwarded: Sequence[str],
    trusted: Callable[[Address], bool],
) -> str:
    """The client's address for a request from `peer`, a trusted proxy, with these header lines
    (each header's lines in the order received)."""
    entries = xff_entries(x_forwarded_for) if x_forwarded_for else forwarded_nodes(forwarded)
    address = peer
    for entry in entries:
        ip = parse_node(entry)
        if ip is None:
            return address  # the last trusted hop wrote something that is no address
        address = str(ip)
        if not trusted(ip):
            return address
    return address


def _from_right(lines: Sequence[str]) -> Iterator[str]:
    """The comma-separated entries of `lines` taken as one list, the last first, at most
    `HOPS`; an entry longer than `ENTRY_BYTES` is given as "" (and parses as nothing)."""
    given = 0
    for line in reversed(lines):
        end = len(line)
        while True:
            # Never more than one entry's bound of the line is looked at per entry.
            comma = line.rfind(",", max(0, end - ENTRY_BYTES - 1), end)
            if comma < 0 and end > ENTRY_BYTES:
                yield ""
                return
            yield line[comma + 1 : end].strip()
            given += 1
            if given >= HOPS:
                return
            if comma < 0:
                break
            end = comma


def xff_entries(lines: Sequence[str]) -> Iterator[str]:
    """`X-Forwarded-For` entries, the right-most first."""
    return _from_right(lines)


def forwarded_nodes(lines: Sequence[str]) -> Iterator[str]:
    """The `for=` node of each `Forwarded` element, the right-most first; "" for an element
    without exactly one, or whose value is malformed."""
    for element in _from_right(lines):
        nodes = []
        for pair in element.split(";"):
            name, eq, value = pair.partition("=")
            if eq and name.strip().lower() == "for":
                nodes.append(value.strip())
        yield _unquoted(nodes[0]) if len(nodes) == 1 else ""


def _unquoted(value: str) -> str:
    if value.startswith('"'):
        inner = value[1:-1] if len(value) >= 2 and value.endswith('"') else '"'
        # A quoted-pair would be no address anyway.
        return "" if '"' in inner or "\\" in inner else inner
    return "" if '"' in value else value


def parse_node(text: str) -> Address | None:
    """The address of an entry: `192.0.2.7`, `192.0.2.7:4711`, `2001:db8::7`, `[2001:db8::7]`,
    `[2001:db8::7]:4711` (IPv4-mapped IPv6 as IPv4); None for anything else (`unknown`, an
    obfuscated `_name`, a host name, garbage)."""
    if text.startswith("["):
        host, close, port = text[1:].partition("]")
        ip = _ip(host) if close and (not port or _PORT.fullmatch(port)) else None
        if not isinstance(ip, ipaddress.IPv6Address):
            return None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
        ip = _ip(host) if _PORT.fullmatch(":" + port) else None
        if not isinstance(ip, ipaddress.IPv4Address):
            return None
    else:
        ip = _ip(text)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


# A port, or RFC 7239's obfuscated one (`_name`).
_PORT = re.compile(r":(?:[0-9]{1,5}|_[A-Za-z0-9._-]+)")


def _ip(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
