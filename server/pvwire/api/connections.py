"""Connections counted at accept: per client address and in the whole process, HTTP and
WebSocket together (DESIGN.md section 7e: time and descriptors are resources too).

The server's protocols (api/http_protocol.py, pvws/wsprotocol.py) ask this table as a connection
is accepted, before one byte of it is read:
- past `max_connections_per_address` from its address, it is answered 429 and closed;
- past the process's capacity (`max_connections`, at most the descriptor limit less
  `reserved_descriptors`) it may ask only `/healthz` and `/readyz`, for `probe_connections` more;
  past those, it is answered 503 and closed. A probe thereby finds a descriptor and an answer
  while clients are refused, until the descriptors run out for good (docs/OPERATIONS.md 16).

Behind a trusted proxy the TCP peer is the proxy: its connections count in the process's total
but under no address at accept. Once a request's headers are in, the connection counts under the
address the proxy forwards (`Authenticator.client_address`, the one rule that says who a client
is) until that request is answered, or for its life once it became a WebSocket. An address
counts by its bound key (access/bound_key.py): an IPv6 client's /64. The table is made by the
application (app.py) and handed to the protocols in the lifespan's state.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..access.bound_key import bound_key
from ..limits import integer

__all__ = [
    "PROBES",
    "STATE_KEY",
    "ConnectionStats",
    "Connections",
    "Refusal",
    "Ticket",
    "capacity",
]

log = logging.getLogger("pvwire.connections")

STATE_KEY = "pvwire.connections"  # where the lifespan's state holds the table
PROBES = (b"/healthz", b"/readyz")  # answered past the capacity too
PROBE_CONNECTIONS = integer("probe_connections")
REFUSAL_REASONS = ("per_address", "capacity")
TIMEOUT_PHASES = ("headers", "body", "response")


def capacity(max_connections: int, reserved: int = integer("reserved_descriptors")) -> int:
    """Connections the process takes: `max_connections`, and at most its descriptor limit less
    `reserved` (at most half of the limit), so that upstream circuits, files and probes still
    find a descriptor when clients have taken all they may."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    room = max(1, min(max_connections, max(soft // 2, soft - reserved)))
    if room < max_connections:
        log.warning(
            "the descriptor limit (ulimit -n, LimitNOFILE) is %d: this process takes %d "
            "connections, not max_connections (%d); raise the limit for more",
            soft, room, max_connections,
        )  # fmt: skip
    return room


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int  # HTTP
    reason: str  # one of REFUSAL_REASONS, for /metrics
    message: str


@dataclass(slots=True)
class Ticket:
    """One connection's place in the table, from accept to close."""

    peer: str
    proxied: bool  # the peer is a trusted proxy: counted under what it forwards
    address: str | None = None  # the address's bound key it counts under now (None: none)
    overflow: bool = False  # past the capacity: probes only
    closed: bool = False


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """What /metrics shows of the table; counters since the start."""

    open: int = 0
    refused: Mapping[str, int] = field(default_factory=dict)
    timeouts: Mapping[str, int] = field(default_factory=dict)


class Connections:
    def __init__(
        self,
        per_address: int,
        capacity: int,
        is_proxy: Callable[[str], bool] = lambda peer: False,
        address_of: Callable[[Mapping[str, str], str], str] = lambda headers, peer: peer,
        probe_room: int = PROBE_CONNECTIONS,
    ) -> None:
        self.per_address = per_address
        self.capacity = capacity
        self.probe_room = probe_room
        self._is_proxy = is_proxy
        self._address_of = address_of
        self.open = 0
        self._by_address: dict[str, int] = {}
        self._refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self._timeouts = dict.fromkeys(TIMEOUT_PHASES, 0)
        # A connection turning WebSocket: its ticket, from the HTTP protocol to the WebSocket's.
        self._handed: dict[Any, Ticket] = {}

    def accept(self, peer: str) -> tuple[Ticket, Refusal | None]:
        """Count a new connection from `peer`; with the refusal to answer it with, if any (it
        stays counted until `release`, as its descriptor is held until then)."""
        self.open += 1
        proxied = self._is_proxy(peer)
        ticket = Ticket(peer, proxied)
        if not proxied:
            refusal = self._count(ticket, peer)
            if refusal is not None:
                return ticket, refusal
        if self.open > self.capacity + self.probe_room:
            return ticket, self._capacity_refusal()
        ticket.overflow = self.open > self.capacity
        return ticket, None

    def forwarded(self, ticket: Ticket, headers: Mapping[str, str]) -> Refusal | None:
        """A request's headers are in: a proxy's connection counts under the address it forwards
        from now on; the refusal if that address has all its connections already."""
        if not ticket.proxied:
            return None
        self._uncount(ticket)
        return self._count(ticket, self._address_of(headers, ticket.peer))

    def answered(self, ticket: Ticket) -> None:
        """A request is answered: a proxy's idle connection counts under no address."""
        if ticket.proxied:
            self._uncount(ticket)

    def release(self, ticket: Ticket) -> None:
        """The connection is closed. Idempotent."""
        if ticket.closed:
            return
        ticket.closed = True
        self._uncount(ticket)
        self.open -= 1

    def refusal_of(self, ticket: Ticket, path: bytes) -> Refusal | None:
        """What a request for `path` on a connection past the capacity is answered with."""
        if ticket.overflow and path not in PROBES:
            return self._capacity_refusal()
        return None

    def hand_over(self, key: Any, ticket: Ticket) -> None:
        """The connection `key` (its transport) becomes a WebSocket: `take_over` gets `ticket`."""
        self._handed[key] = ticket

    def take_over(self, key: Any) -> Ticket | None:
        return self._handed.pop(key, None)

    def timed_out(self, phase: str) -> None:
        self._timeouts[phase] = self._timeouts.get(phase, 0) + 1

    def from_address(self, address: str) -> int:
        """Connections counted under `address` (its bound key) now."""
        return self._by_address.get(bound_key(address), 0)

    def stats(self) -> ConnectionStats:
        return ConnectionStats(self.open, dict(self._refused), dict(self._timeouts))

    def _count(self, ticket: Ticket, address: str) -> Refusal | None:
        key = bound_key(address)
        held = self._by_address.get(key, 0) + 1
        self._by_address[key] = held
        ticket.address = key
        if held > self.per_address:
            self._refused["per_address"] += 1
            return Refusal(
                429,
                "per_address",
                f"{self.per_address} connections from {key} already "
                "(max_connections_per_address); close one, or try again later",
            )
        return None

    def _uncount(self, ticket: Ticket) -> None:
        address, ticket.address = ticket.address, None
        if address is None:
            return
        left = self._by_address.pop(address, 1) - 1
        if left > 0:
            self._by_address[address] = left

    def _capacity_refusal(self) -> Refusal:
        self._refused["capacity"] += 1
        return Refusal(
            503,
            "capacity",
            f"this server holds {self.capacity} connections, its most (max_connections, "
            "within its descriptor limit); try again later",
        )
