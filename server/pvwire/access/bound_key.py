"""What every bound kept per client address counts a client under: for IPv4 its address, for IPv6
its /64 (`ipv6_bound_prefix`), for an IPv4-mapped IPv6 address (`::ffff:192.0.2.7`, what a
dual-stack socket gives an IPv4 peer) the IPv4 address it maps.

An IPv6 client is given a /64 at least and may use any of its 2^64 addresses (privacy
addresses, or one a connection): counted by the whole address, it had a fresh budget of
connections, channels, MJPEG viewers, refusal lines, puts and pvgets with each one it picked.
Counted by its /64, all of them share one address's. The audit file, the access rules' `hosts`
and the admin views' loopback check keep the whole address (`Identity.address`); only the
bounds count by this key, and a refusal names it, so that a client sees what it is counted as.
"""

from __future__ import annotations

import ipaddress

from ..limits import integer

__all__ = ["bound_key"]

PREFIX = integer("ipv6_bound_prefix")
_HOST_BITS = 128 - PREFIX


def bound_key(address: str) -> str:
    """The key `address` counts under: `192.0.2.7`, `2001:db8:1:2::/64`; a text that is no
    address (a test client's name) is its own key."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> _HOST_BITS << _HOST_BITS, PREFIX)))
