"""PVA connections that carry an authenticated user's name, for puts on that user's behalf.

PVAccess names its client once per TCP connection: in its reply to the server's
CONNECTION_VALIDATION the client picks the authentication "ca" and sends {user, host}; QSRV takes
the ACF's user from it (and the host from the connection's peer address, not from the string
sent). pvxs (and p4p over it) reads the name from the process's account once per context and
shares one connection per server among all its channels, so no pvxs call puts as several users.
Here each (user, server) pair gets a connection of its own, spoken by pvaproto.py's sans-I/O
machine over an asyncio TCP stream this module owns: opened by the first put, closed after
`idle_s` without one, at most `max_connections` at once (the least recently used is closed
first), ECHOed while open so that the server keeps it. Only puts travel here; monitors stay on
pvwire's shared pvxs context. The same design and bounds as ca_identity.py's CA circuits.

The server's address comes from a PVA search of our own (UDP, to EPICS_PVA_ADDR_LIST and, unless
EPICS_PVA_AUTO_ADDR_LIST=NO, the broadcast address), remembered per name until a connection to
it fails: p4p does not tell which server pvxs found for a channel.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ChannelNotFound, ChannelTimeout, IocDenied, PutRejected, TypeMismatch
from ..limits import (
    PVA_IDENTITY_ADDRESSES,
    PVA_IDENTITY_CHANNELS,
    PVA_IDENTITY_CONNECTIONS,
    PVA_IDENTITY_IDLE_S,
    PVA_IDENTITY_MESSAGE_BYTES,
    integer,
    number,
)
from .ca_identity import check_user_name
from .pvaproto import (
    PROTOCOL_ERRORS,
    STRUCT,
    ChannelCreated,
    ChannelDestroyed,
    ClientProtocol,
    Event,
    LocalProtocolError,
    PutDone,
    PutInitialized,
    RemoteProtocolError,
    ServerMessage,
    Status,
    Validated,
    search_request,
    search_response,
)
from .user_links import Address, LinkBase, UserLinks

__all__ = ["PEER_REASONS", "Address", "IdentityConnections", "PeerRefusals", "PvaSearch",
           "Unreachable"]  # fmt: skip

log = logging.getLogger(__name__)

_READ_SIZE = 65536
DEFAULT_BROADCAST_PORT = 5076
_SEARCH_VARIABLES = ("EPICS_PVA_ADDR_LIST", "EPICS_PVA_AUTO_ADDR_LIST", "EPICS_PVA_BROADCAST_PORT")
# Words in a refusal that mean the server's access security said no (QSRV: "Put not permitted").
_DENIED = ("not permitted", "denied", "permission", "read-only", "no write access")
# What pvwire's own PVA client refuses from servers, for /metrics: a protocol error that closed
# a connection (pvaproto.PROTOCOL_ERRORS), a reply to nothing asked, a search answer to no
# pending search (or from an address not searched), a server MESSAGE left out of the log.
PEER_REASONS = (*PROTOCOL_ERRORS, "unsolicited", "search_reply", "message_log")
MESSAGE_BURST = integer("pva_identity_message_lines")
MESSAGE_INTERVAL_S = number("pva_identity_message_interval_s")


class Unreachable(PutRejected):
    """No connection could be made to the server: nothing was sent, so a put may be retried
    elsewhere (the server may have moved)."""


def _is_refusal(status: Status) -> bool:
    text = status.message.lower()
    return any(w in text for w in _DENIED)


class PeerRefusals:
    """What servers were refused, counted by reason (PEER_REASONS); and the gate of their
    MESSAGEs into the log: `MESSAGE_BURST` lines, then one per `MESSAGE_INTERVAL_S`, over all
    connections (a server may send a MESSAGE of a megabyte in every message it sends)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.counts = dict.fromkeys(PEER_REASONS, 0)
        self._clock = clock
        self._tokens = float(MESSAGE_BURST)
        self._at = clock()

    def count(self, reason: str, n: int = 1) -> None:
        self.counts[reason] += n

    def message(self, where: object, event: ServerMessage) -> None:
        now = self._clock()
        self._tokens = min(MESSAGE_BURST, self._tokens + (now - self._at) / MESSAGE_INTERVAL_S)
        self._at = now
        if self._tokens < 1:
            self.count("message_log")
            return
        self._tokens -= 1
        left_out = self.counts["message_log"]
        cut = f" ({event.length} bytes, cut)" if event.length > len(event.text) else ""
        since = f"; {left_out} left out so far" if left_out else ""
        log.info("%r: the IOC says %r%s%s", where, event.text, cut, since)


@dataclass(eq=False)
class _Channel:
    """One PV on the connection. Puts to it take turns (`turn`): one PVA operation runs one
    request at a time, so the answer that comes is the waiting put's own."""

    cid: int = 0  # of the latest CREATE_CHANNEL (a fresh one each time)
    sid: int = -1  # until the server created it, and again once it destroyed it
    operations: dict[bool, int] = field(default_factory=dict)  # wait -> its ioid, initialised
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # puts holding or waiting for the turn: never destroyed while any is


class _Connection(LinkBase):
    """One TCP connection to one PVA server under one user's name."""

    ended = "connection closed"

    def __init__(
        self,
        user: str,
        address: Address,
        host_name: str,
        max_channels: int,
        refusals: PeerRefusals,
    ) -> None:
        super().__init__(user, address)
        self.max_channels = max_channels
        self._refusals = refusals
        self._proto = ClientProtocol(user, host_name, PVA_IDENTITY_MESSAGE_BYTES)
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[Status] = loop.create_future()
        self._channels: OrderedDict[str, _Channel] = OrderedDict()
        self._pending: dict[int, asyncio.Future[Any]] = {}  # cid or ioid -> its answer
        self._start()

    def __repr__(self) -> str:
        return f"<PVA connection of {self.user!r} to {self.address[0]}:{self.address[1]}>"

    async def put(self, name: str, path: str, value: Any, wait: bool, deadline: float) -> None:
        uri = f"pva://{name}"
        try:
            status = await self._wait(self._ready, deadline, f"{uri}: no connection")
        except PutRejected:
            # The cause once, not "pva://X: no connection to ...: pva://X: no connection: ...".
            why = self._failure or "connection closed"
            raise Unreachable(f"{uri}: no connection to {self._where()}: {why}") from None
        if not status.ok:
            raise IocDenied(f"{uri}: the server refuses the name {self.user}: {status.message}")
        channel = self._channel(name)
        channel.users += 1
        try:
            await self._turn(channel, deadline, uri)
        except BaseException:
            channel.users -= 1
            raise
        try:
            if channel.sid < 0:
                await self._create(name, channel, deadline)
            ioid = channel.operations.get(wait)
            if ioid is None:
                ioid = await self._put_init(name, channel, wait, deadline)
            try:
                message = self._proto.put(ioid, path, value)
            except LocalProtocolError as exc:
                raise TypeMismatch(f"cannot write {value!r:.60} to {uri}: {exc}") from None
            done: PutDone = await self._ask(
                ioid, message, deadline, f"{uri}: put did not complete",
                lambda: self._give_up(channel, wait),
            )  # fmt: skip
        finally:
            channel.turn.release()
            channel.users -= 1
        status = done.status
        if not status.ok:
            if _is_refusal(status):
                raise IocDenied(f"{uri}: the IOC denies write access to {self.user}")
            raise PutRejected(f"{uri}: {status.message}")

    @property
    def channels(self) -> int:
        """Channels the server created for this connection."""
        return sum(1 for c in self._channels.values() if c.sid >= 0)

    def keepalive(self) -> None:
        if self._writer is not None and self._proto.state == "ready" and not self.closed:
            self._writer.write(self._proto.echo())

    # -- inside ----------------------------------------------------------------------------------

    def _channel(self, name: str) -> _Channel:
        """`name`'s channel (made, not yet created, if need be); the least recently used ones
        beyond `max_channels` are destroyed, but never one a put is using or waiting for."""
        channel = self._channels.get(name)
        if channel is not None:
            self._channels.move_to_end(name)
            return channel
        channel = self._channels[name] = _Channel()
        for old in list(self._channels)[: max(0, len(self._channels) - self.max_channels)]:
            gone = self._channels[old]
            if gone.users:
                continue
            del self._channels[old]
            if gone.sid >= 0:
                self._send_if_open(self._proto.destroy_channel(gone.sid, gone.cid))
        return channel

    async def _turn(self, channel: _Channel, deadline: float, uri: str) -> None:
        left = deadline - time.monotonic()
        try:
            await asyncio.wait_for(channel.turn.acquire(), max(left, 0.001))
        except TimeoutError:
            raise ChannelTimeout(f"{uri}: the puts before it did not complete in time") from None

    async def _create(self, name: str, channel: _Channel, deadline: float) -> None:
        channel.cid = cid = self._proto.new_id()
        created: ChannelCreated = await self._ask(
            cid, self._proto.create_channel(cid, name), deadline,
            f"pva://{name}: the IOC did not create the channel",
            lambda: self._proto.abandon_channel(cid),
        )  # fmt: skip
        if not created.status.ok:
            raise ChannelNotFound(f"pva://{name}: {created.status.message or 'no such channel'}")
        channel.sid = created.sid

    async def _put_init(self, name: str, channel: _Channel, wait: bool, deadline: float) -> int:
        ioid = self._proto.new_id()
        init: PutInitialized = await self._ask(
            ioid, self._proto.put_init(channel.sid, ioid, wait), deadline,
            f"pva://{name}: the IOC did not prepare the put",
            lambda: self._send_if_open(self._proto.destroy_request(ioid)),
        )  # fmt: skip
        if not init.status.ok or init.desc is None or init.desc.code != STRUCT:
            if _is_refusal(init.status):
                raise IocDenied(f"pva://{name}: the IOC denies write access to {self.user}")
            raise PutRejected(f"pva://{name}: {init.status.message or 'put refused'}")
        channel.operations[wait] = ioid
        return ioid

    def _give_up(self, channel: _Channel, wait: bool) -> None:
        """A put's answer did not come in time: its operation is ended, a late answer dropped,
        and the next put initialises a new one."""
        ioid = channel.operations.pop(wait, None)
        if ioid is not None:
            self._send_if_open(self._proto.destroy_request(ioid))

    async def _ask(
        self, key: int, message: bytes, deadline: float, what: str, give_up: Callable[[], None]
    ) -> Any:
        """Send `message` and wait for the answer to `key` (a cid or ioid) until `deadline`;
        `give_up` when it does not come (or the put is cancelled)."""
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[key] = answer
        try:
            self._send(message)
            return await self._wait(answer, deadline, what)
        except (ChannelTimeout, asyncio.CancelledError):
            give_up()
            raise
        finally:
            self._pending.pop(key, None)

    def _send(self, data: bytes) -> None:
        if self._writer is None or self.closed:
            raise self._error(f"connection to {self._where()}")
        self._writer.write(data)

    def _send_if_open(self, data: bytes) -> None:
        if data and self._writer is not None and not self.closed:
            self._writer.write(data)

    async def _talk(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(_READ_SIZE)
            if not data:
                raise ConnectionError("the IOC closed the connection")
            try:
                events = self._proto.receive(data)
            except RemoteProtocolError as exc:
                self._refusals.count(exc.reason)
                raise
            finally:
                self._refusals.count("unsolicited", self._proto.take_dropped())
            out = self._proto.take_outgoing()
            if out:
                writer.write(out)
            for event in events:
                self._handle(event)

    def _handle(self, event: Event) -> None:
        if isinstance(event, Validated):
            if not self._ready.done():
                self._ready.set_result(event.status)
        elif isinstance(event, ChannelCreated):
            self._answer(event.cid, event)
        elif isinstance(event, PutInitialized | PutDone):
            self._answer(event.ioid, event)
        elif isinstance(event, ChannelDestroyed):  # its operations went with it
            for channel in self._channels.values():
                if channel.cid == event.cid and channel.sid == event.sid:
                    channel.sid = -1
                    channel.operations.clear()
        elif isinstance(event, ServerMessage):
            self._refusals.message(self, event)

    def _answer(self, key: int, event: Event) -> None:
        answer = self._pending.get(key)
        if answer is not None and not answer.done():
            answer.set_result(event)

    def _waiting(self) -> list[asyncio.Future[Any]]:
        return [self._ready, *self._pending.values()]


class IdentityConnections:
    """Puts as a named user, each on that user's own connection to the PVA server."""

    def __init__(
        self,
        host_name: str,
        max_connections: int = PVA_IDENTITY_CONNECTIONS,
        idle_s: float = PVA_IDENTITY_IDLE_S,
        max_channels: int = PVA_IDENTITY_CHANNELS,
    ) -> None:
        self.host_name = host_name
        self.refusals = PeerRefusals()
        self._connections: UserLinks[_Connection] = UserLinks(
            lambda user, address: _Connection(
                user, address, host_name, max_channels, self.refusals
            ),
            max_connections,
            idle_s,
        )

    def __len__(self) -> int:
        """Connections open (one the server closed is dropped at the next sweep)."""
        return len(self._connections)

    def channels(self) -> int:
        """Channels open over all connections."""
        return sum(c.channels for c in self._connections.links())

    async def put(
        self,
        user: str,
        address: Address,
        name: str,
        path: str,
        value: Any,
        wait: bool,
        timeout: float,
    ) -> None:
        """Write `value` (already converted to the field's type) into the field `path` of the
        PV `name`, as `user`.

        Raises IocDenied when the IOC's access security refuses, ChannelNotFound,
        ChannelTimeout, PutRejected; WriteDenied for a name that cannot be sent.
        """
        deadline = time.monotonic() + timeout
        check_user_name(user)
        with self._connections.using(user, address) as connection:
            await connection.put(name, path, value, wait, deadline)

    def close(self) -> None:
        self._connections.close()


# -- where a name is served ----------------------------------------------------------------------


def search_destinations(env: Mapping[str, str]) -> list[tuple[Address, bool]]:
    """Where a search goes, as pvxs sends it: EPICS_PVA_ADDR_LIST's entries (host[:port]) and,
    unless EPICS_PVA_AUTO_ADDR_LIST=NO, the broadcast address; with whether each is unicast."""
    port = int(env.get("EPICS_PVA_BROADCAST_PORT") or DEFAULT_BROADCAST_PORT)
    out: list[tuple[Address, bool]] = []
    for entry in env.get("EPICS_PVA_ADDR_LIST", "").split():
        host, _, p = entry.partition(":")
        try:
            address = (socket.gethostbyname(host), int(p) if p else port)
        except (OSError, ValueError):
            log.warning("EPICS_PVA_ADDR_LIST entry %r ignored", entry)
            continue
        out.append((address, _unicast(address[0])))
    if env.get("EPICS_PVA_AUTO_ADDR_LIST", "YES").upper() != "NO":
        out.append((("255.255.255.255", port), False))
    return out


def _unicast(host: str) -> bool:
    """Whether only `host` can answer a search sent to it. A multicast group or a broadcast
    address is answered by whoever hears it; a subnet's broadcast is told by its last byte, the
    one sign a client sees without the network's mask (a /24's, the usual EPICS subnet)."""
    ip = ipaddress.IPv4Address(host)
    return not (ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255")
                or host.endswith(".255"))  # fmt: skip


class _SearchReplies(asyncio.DatagramProtocol):
    def __init__(self, search: PvaSearch) -> None:
        self._search = search

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self._search.received(data, (str(addr[0]), int(addr[1])))


@dataclass(eq=False, slots=True)
class _Pending:
    """A search waiting for its answer: the answer names its cid and carries its seq, and comes
    from one of `sources` when every destination searched was unicast (None: any address, as a
    broadcast is answered by whoever hears it)."""

    seq: int
    found: asyncio.Future[Address]
    sources: frozenset[Address] | None


class PvaSearch:
    """Finds the server of a PV name by PVA's UDP search; remembers the answers (bounded).

    Any host that receives a search (or guesses one) may answer it, so an answer counts only for
    a search waiting for it: its cid and seq, random 32-bit numbers each (pvxs's cids count up
    from a constant), and from an address searched where every destination is unicast. What
    else comes is dropped and counted (`refused`)."""

    def __init__(
        self, env: Mapping[str, str] | None = None, max_names: int = PVA_IDENTITY_ADDRESSES
    ) -> None:
        """`env`: where EPICS_PVA_* are read, when a search starts; by default os.environ."""
        self._env = env
        self.max_names = max_names
        self._known: OrderedDict[str, Address] = OrderedDict()
        self.waiting: dict[int, _Pending] = {}  # by cid
        self.refused = 0  # answers dropped: to no pending search, or from elsewhere
        self._transport: asyncio.DatagramTransport | None = None
        self._resolved: tuple[tuple[str | None, ...], list[tuple[Address, bool]]] | None = None

    def __len__(self) -> int:
        return len(self._known)

    def known(self, name: str) -> Address | None:
        return self._known.get(name)

    def forget(self, name: str) -> None:
        """The remembered server failed: search again next time."""
        self._known.pop(name, None)

    async def find(self, name: str, timeout: float) -> Address:
        known = self._known.get(name)
        if known is not None:
            self._known.move_to_end(name)
            return known
        deadline = time.monotonic() + timeout
        destinations = await self._destinations()
        transport = await self._open(all(a[0].startswith("127.") for a, _ in destinations))
        port = transport.get_extra_info("sockname")[1]
        cid = secrets.randbits(32)
        while cid in self.waiting:
            cid = secrets.randbits(32)
        unicast = all(u for _, u in destinations)
        pending = _Pending(
            secrets.randbits(32),
            asyncio.get_running_loop().create_future(),
            frozenset(a for a, _ in destinations) if unicast else None,
        )
        self.waiting[cid] = pending
        try:
            pause = 0.05
            while not pending.found.done():  # resent with a growing pause, as pvxs does
                for address, unicast in destinations:
                    transport.sendto(search_request(pending.seq, cid, name, port, unicast), address)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelNotFound(f"pva://{name}: no server answered within {timeout:g} s")
                await asyncio.wait([pending.found], timeout=min(pause, left))
                pause = min(pause * 2, 1.0)
        finally:
            self.waiting.pop(cid, None)
        address = pending.found.result()
        self._known[name] = address
        while len(self._known) > self.max_names:
            self._known.popitem(last=False)
        return address

    def received(self, data: bytes, source: Address) -> None:
        """A datagram on the search socket, from `source`."""
        try:
            found = search_response(data)
        except RemoteProtocolError as exc:
            log.debug("a bad search reply from %s: %s", source, exc)
            self.refused += 1
            return
        if found is None:  # a negative answer, a beacon: nothing to take
            return
        address = (found.host or source[0], found.port)
        taken = False
        for cid in found.cids:
            pending = self.waiting.get(cid)
            if pending is None or pending.seq != found.seq or pending.found.done():
                continue
            if pending.sources is None or source in pending.sources:
                pending.found.set_result(address)
                taken = True
        if not taken:
            self.refused += 1

    async def _destinations(self) -> list[tuple[Address, bool]]:
        """search_destinations, resolved off the event loop and once per value of the
        variables: a host name in EPICS_PVA_ADDR_LIST costs one DNS lookup, not one per search."""
        env = self._env if self._env is not None else os.environ
        values = tuple(env.get(name) for name in _SEARCH_VARIABLES)
        if self._resolved is None or self._resolved[0] != values:
            given = {n: v for n, v in zip(_SEARCH_VARIABLES, values, strict=True) if v is not None}
            self._resolved = (values, await asyncio.to_thread(search_destinations, given))
        return self._resolved[1]

    async def _open(self, loopback: bool) -> asyncio.DatagramTransport:
        """The socket searches go from and answers come to; on loopback only when every
        destination is there (as the test settings and a single-host site have it)."""
        if self._transport is None or self._transport.is_closing():
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sock.bind(("127.0.0.1" if loopback else "0.0.0.0", 0))
            transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
                lambda: _SearchReplies(self), sock=sock
            )
            self._transport = transport
        return self._transport

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
