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
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ..errors import ChannelNotFound, IocDenied, PutRejected, TypeMismatch
from ..limits import (
    PVA_IDENTITY_ADDRESSES,
    PVA_IDENTITY_CHANNELS,
    PVA_IDENTITY_CONNECTIONS,
    PVA_IDENTITY_IDLE_S,
    PVA_IDENTITY_MESSAGE_BYTES,
)
from .ca_identity import check_user_name
from .pvaproto import (
    ChannelCreated,
    ChannelDestroyed,
    ClientProtocol,
    Event,
    FieldDesc,
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

__all__ = ["Address", "IdentityConnections", "PvaSearch", "Unreachable"]

log = logging.getLogger(__name__)

_READ_SIZE = 65536
DEFAULT_BROADCAST_PORT = 5076
_SEARCH_VARIABLES = ("EPICS_PVA_ADDR_LIST", "EPICS_PVA_AUTO_ADDR_LIST", "EPICS_PVA_BROADCAST_PORT")
# Words in a refusal that mean the server's access security said no (QSRV: "Put not permitted").
_DENIED = ("not permitted", "denied", "permission", "read-only", "no write access")


class Unreachable(PutRejected):
    """No connection could be made to the server: nothing was sent, so a put may be retried
    elsewhere (the server may have moved)."""


def _is_refusal(status: Status) -> bool:
    text = status.message.lower()
    return any(w in text for w in _DENIED)


class _Connection(LinkBase):
    """One TCP connection to one PVA server under one user's name."""

    ended = "connection closed"

    def __init__(self, user: str, address: Address, host_name: str, max_channels: int) -> None:
        super().__init__(user, address)
        self.max_channels = max_channels
        self._proto = ClientProtocol(user, host_name, PVA_IDENTITY_MESSAGE_BYTES)
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[Status] = loop.create_future()
        # name -> (cid, sid); (name, wait) -> (ioid, the put's structure)
        self._channels: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._puts: dict[tuple[str, bool], tuple[int, FieldDesc]] = {}
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
        sid = await self._channel(name, deadline)
        key = (name, wait)
        op = self._puts.get(key)
        if op is None:
            op = await self._put_init(name, sid, wait, deadline)
        ioid, desc = op
        try:
            message = self._proto.put(sid, ioid, desc, path, value)
        except LocalProtocolError as exc:
            raise TypeMismatch(f"cannot write {value!r:.60} to {uri}: {exc}") from None
        done = await self._request(ioid, message, deadline, f"{uri}: put did not complete")
        status = done.status
        if not status.ok:
            if _is_refusal(status):
                raise IocDenied(f"{uri}: the IOC denies write access to {self.user}")
            raise PutRejected(f"{uri}: {status.message}")

    @property
    def channels(self) -> int:
        return len(self._channels)

    def keepalive(self) -> None:
        if self._writer is not None and self._proto.state == "ready" and not self.closed:
            self._writer.write(self._proto.echo())

    # -- inside ----------------------------------------------------------------------------------

    async def _channel(self, name: str, deadline: float) -> int:
        found = self._channels.get(name)
        if found is not None:
            self._channels.move_to_end(name)
            return found[1]
        cid = self._proto.new_id()
        created: ChannelCreated = await self._request(
            cid,
            self._proto.create_channel(cid, name),
            deadline,
            f"pva://{name}: the IOC did not create the channel",
        )
        if not created.status.ok:
            raise ChannelNotFound(f"pva://{name}: {created.status.message or 'no such channel'}")
        existing = self._channels.get(name)
        if existing is not None:  # a concurrent put to the same name created it first
            self._send(self._proto.destroy_channel(created.sid, cid))
            return existing[1]
        self._channels[name] = (cid, created.sid)
        while len(self._channels) > self.max_channels:
            old, (old_cid, old_sid) = self._channels.popitem(last=False)
            self._forget(old)
            self._send(self._proto.destroy_channel(old_sid, old_cid))
        return int(created.sid)

    async def _put_init(
        self, name: str, sid: int, wait: bool, deadline: float
    ) -> tuple[int, FieldDesc]:
        ioid = self._proto.new_id()
        init: PutInitialized = await self._request(
            ioid,
            self._proto.put_init(sid, ioid, wait),
            deadline,
            f"pva://{name}: the IOC did not prepare the put",
        )
        if not init.status.ok or init.desc is None:
            if _is_refusal(init.status):
                raise IocDenied(f"pva://{name}: the IOC denies write access to {self.user}")
            raise PutRejected(f"pva://{name}: {init.status.message or 'put refused'}")
        if name in self._channels:  # not destroyed while we waited
            self._puts[(name, wait)] = (ioid, init.desc)
        return ioid, init.desc

    def _forget(self, name: str) -> None:
        self._puts.pop((name, True), None)
        self._puts.pop((name, False), None)

    async def _request(self, key: int, message: bytes, deadline: float, what: str) -> Any:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[key] = answer
        try:
            self._send(message)
            return await self._wait(answer, deadline, what)
        finally:
            self._pending.pop(key, None)

    def _send(self, data: bytes) -> None:
        if self._writer is None or self.closed:
            raise self._error(f"connection to {self._where()}")
        self._writer.write(data)

    async def _talk(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(_READ_SIZE)
            if not data:
                raise ConnectionError("the IOC closed the connection")
            events = self._proto.receive(data)
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
        elif isinstance(event, ChannelDestroyed):
            for name, (cid, _) in list(self._channels.items()):
                if cid == event.cid:
                    del self._channels[name]
                    self._forget(name)
        elif isinstance(event, ServerMessage):
            log.info("%r: the IOC says %s", self, event.text)

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
        self._connections: UserLinks[_Connection] = UserLinks(
            lambda user, address: _Connection(user, address, host_name, max_channels),
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
        out.append((address, not address[0].endswith(".255")))
    if env.get("EPICS_PVA_AUTO_ADDR_LIST", "YES").upper() != "NO":
        out.append((("255.255.255.255", port), False))
    return out


class _SearchReplies(asyncio.DatagramProtocol):
    def __init__(self, search: PvaSearch) -> None:
        self._search = search

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        try:
            found = search_response(data)
        except RemoteProtocolError as exc:
            log.debug("a bad search reply from %s: %s", addr, exc)
            return
        if found is not None:
            address = (found.host or str(addr[0]), found.port)
            for cid in found.cids:
                waiter = self._search.waiting.get(cid)
                if waiter is not None and not waiter.done():
                    waiter.set_result(address)


class PvaSearch:
    """Finds the server of a PV name by PVA's UDP search; remembers the answers (bounded)."""

    def __init__(
        self, env: Mapping[str, str] | None = None, max_names: int = PVA_IDENTITY_ADDRESSES
    ) -> None:
        """`env`: where EPICS_PVA_* are read, when a search starts; by default os.environ."""
        self._env = env
        self.max_names = max_names
        self._known: OrderedDict[str, Address] = OrderedDict()
        self.waiting: dict[int, asyncio.Future[Address]] = {}
        self._transport: asyncio.DatagramTransport | None = None
        self._next = 0
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
        self._next = self._next % 0xFFFFFFFF + 1
        cid = self._next
        found: asyncio.Future[Address] = asyncio.get_running_loop().create_future()
        self.waiting[cid] = found
        try:
            pause = 0.05
            while not found.done():  # resent with a growing pause, as pvxs does
                for address, unicast in destinations:
                    transport.sendto(search_request(cid, cid, name, port, unicast), address)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelNotFound(f"pva://{name}: no server answered within {timeout:g} s")
                await asyncio.wait([found], timeout=min(pause, left))
                pause = min(pause * 2, 1.0)
        finally:
            self.waiting.pop(cid, None)
        address = found.result()
        self._known[name] = address
        while len(self._known) > self.max_names:
            self._known.popitem(last=False)
        return address

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
