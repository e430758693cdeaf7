"""CA circuits that carry an authenticated user's name, for puts on that user's behalf.

Channel Access names its client once per TCP circuit: after the version exchange the client sends
CA_PROTO_HOST_NAME and CA_PROTO_CLIENT_NAME, and the IOC's access security (its ACF) decides every
request on that circuit with them. libca reads the name from the process's account when a context
is created (`osiGetUserName`: getpwuid(getuid())) and shares one circuit per server among all the
channels of the context, so no libca call can put as several users. Here each (user, server)
pair gets a circuit of its own, built with caproto's sans-I/O VirtualCircuit (it makes and parses
the messages and checks their order) over an asyncio TCP stream this module owns: opened by the
first put, closed after `idle_s` without one, at most `max_circuits` at once (the least recently
used is closed first). Only puts travel here; monitors stay on pvwire's shared libca circuits.

The server's address is not searched for here: the caller learns it from pvwire's own libca
channel for the name (`ca_host_name`), so name resolution follows the site's EPICS_CA_* settings
exactly as monitors do. Measured on loopback (bench/identity_puts.py, medians): a user's first put
on a new circuit 2.1 ms, later ones 0.31 ms, a put through libca 0.24 ms.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

from caproto import (  # type: ignore[import-untyped]
    CLIENT,
    DEFAULT_PROTOCOL_VERSION,
    DISCONNECTED,
    AccessRightsResponse,
    ClientChannel,
    ClientNameRequest,
    CreateChanResponse,
    CreateChFailResponse,
    EchoRequest,
    EchoResponse,
    ErrorResponse,
    HostNameRequest,
    ServerDisconnResponse,
    VersionRequest,
    VersionResponse,
    VirtualCircuit,
    WriteNotifyResponse,
)
from caproto._status import eca_value_to_status  # type: ignore[import-untyped]

from ..errors import ChannelNotFound, IocDenied, PutRejected, WriteDenied
from ..limits import integer, number
from .user_links import Address, LinkBase, UserLinks

__all__ = ["Address", "IdentityCircuits", "check_user_name"]

log = logging.getLogger(__name__)


# Circuits held at once: one per user writing to an IOC. Beyond it the least recently used one
# is closed (its puts in flight fail); the operators writing at once, times the IOCs each one
# writes to, stay well below it.
MAX_CIRCUITS = integer("ca_identity_circuits")
# A circuit unused this long is closed: an operator's burst of puts reuses it, a user who went
# home leaves no TCP connection at the IOC (each costs the IOC a client structure and a thread).
IDLE_S = number("ca_identity_idle_s")
# Channels kept open per circuit (least recently used cleared first): a user's puts to the same
# setpoints skip the channel creation round trip.
MAX_CHANNELS = integer("ca_identity_channels")
_READ_SIZE = 65536
MAX_NAME_BYTES = integer("identity_name_bytes")
ECA_NORMAL = 1
ECA_NOWTACCESS = 376  # caerr.h: DEFMSG(CA_K_WARNING, 47)


def check_user_name(user: str) -> None:
    """Refuse a name the IOC would read as another: it stops at a NUL ("olga\\0x" is olga to the
    IOC), and no account name holds control characters or runs to hundreds of bytes."""
    if (
        not user
        or len(user.encode()) > MAX_NAME_BYTES
        or any(ord(c) < 32 or c == "\x7f" for c in user)
    ):
        raise WriteDenied(f"the user name {user[:40]!r} cannot be sent to an IOC")


class _Circuit(LinkBase):
    """One TCP circuit to one CA server under one user's name."""

    ended = "circuit closed"

    def __init__(self, user: str, address: Address, host_name: str) -> None:
        super().__init__(user, address)
        self._host_name = host_name
        self._vc = VirtualCircuit(CLIENT, address, 0)
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[None] = loop.create_future()
        self._channels: OrderedDict[str, Any] = OrderedDict()  # name -> connected ClientChannel
        self._creating: dict[int, asyncio.Future[Any]] = {}  # cid -> channel once created
        self._writes: dict[int, asyncio.Future[int]] = {}  # ioid -> ECA status
        self._start()

    def __repr__(self) -> str:
        return f"<CA circuit of {self.user!r} to {self.address[0]}:{self.address[1]}>"

    async def put(
        self, name: str, data: Any, data_type: int, count: int, wait: bool, deadline: float
    ) -> None:
        uri = f"ca://{name}"
        await self._wait(self._ready, deadline, f"{uri}: no circuit to {self._where()}")
        chan = self._channels.get(name)
        if chan is None:
            chan = await self._create(name, deadline)
        else:
            self._channels.move_to_end(name)
        if not chan.access_rights & 2:  # AccessRights.WRITE
            raise IocDenied(f"{uri}: the IOC denies write access to {self.user}")
        ioid = self._vc.new_ioid()
        command = chan.write(data, data_type=data_type, data_count=count, ioid=ioid, notify=wait)
        if not wait:
            await self._send(command)
            return
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._writes[ioid] = done
        try:
            await self._send(command)
            status = await self._wait(done, deadline, f"{uri}: put did not complete")
        finally:
            self._writes.pop(ioid, None)
        if status == ECA_NOWTACCESS:
            raise IocDenied(f"{uri}: the IOC denies write access to {self.user}")
        if status != ECA_NORMAL:
            known = eca_value_to_status.get(status)
            raise PutRejected(f"{uri}: {known.description if known else f'CA status {status}'}")

    def keepalive(self) -> None:
        """Nothing to send: an IOC keeps a quiet circuit, which is closed when idle here."""

    # -- inside ----------------------------------------------------------------------------------

    async def _create(self, name: str, deadline: float) -> Any:
        chan = ClientChannel(name, self._vc)
        created: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._creating[chan.cid] = created
        try:
            await self._send(chan.create())
            await self._wait(created, deadline, f"ca://{name}: the IOC did not create the channel")
        finally:
            self._creating.pop(chan.cid, None)
        existing = self._channels.get(name)
        if existing is not None:  # a concurrent put to the same name created it first
            await self._send(chan.clear())
            return existing
        self._channels[name] = chan
        while len(self._channels) > MAX_CHANNELS:
            _, old = self._channels.popitem(last=False)
            await self._send(old.clear())
        return chan

    async def _send(self, *commands: Any) -> None:
        if self._writer is None or self.closed:
            raise self._error(f"circuit to {self._where()}")
        self._writer.write(b"".join(self._vc.send(*commands)))
        await self._writer.drain()

    async def _talk(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # What libca sends first on every circuit, with this user's name (caproto sends
        # text as UTF-8 with its NUL; the IOC compares the bytes with its ACF's).
        writer.write(
            b"".join(
                self._vc.send(
                    VersionRequest(0, DEFAULT_PROTOCOL_VERSION),
                    HostNameRequest(self._host_name),
                    ClientNameRequest(self.user),
                )
            )
        )
        while True:
            data = await reader.read(_READ_SIZE)
            commands, _ = self._vc.recv(data)
            for command in commands:
                if command is DISCONNECTED:
                    raise ConnectionError("the IOC closed the circuit")
                self._vc.process_command(command)
                self._handle(command)

    def _handle(self, command: Any) -> None:
        if isinstance(command, VersionResponse):
            if not self._ready.done():
                self._ready.set_result(None)
        elif isinstance(command, CreateChanResponse):
            created = self._creating.get(command.cid)
            if created is not None and not created.done():
                created.set_result(self._vc.channels[command.cid])
        elif isinstance(command, CreateChFailResponse):
            created = self._creating.get(command.cid)
            if created is not None and not created.done():
                chan = self._vc.channels.get(command.cid)
                what = f"ca://{chan.name}" if chan is not None else "channel"
                created.set_exception(ChannelNotFound(f"{what}: the IOC has no such channel"))
        elif isinstance(command, WriteNotifyResponse):
            done = self._writes.get(command.ioid)
            if done is not None and not done.done():
                done.set_result(int(command.header.parameter1))
        elif isinstance(command, ServerDisconnResponse):
            for name, chan in list(self._channels.items()):
                if chan.cid == command.cid:
                    del self._channels[name]
        elif isinstance(command, EchoRequest):
            assert self._writer is not None
            self._writer.write(b"".join(self._vc.send(EchoResponse())))
        elif isinstance(command, ErrorResponse):
            log.info("%r: the IOC answers an error: %s", self, command.error_message)
        elif not isinstance(command, AccessRightsResponse):
            log.debug("%r: %r ignored", self, command)

    def _waiting(self) -> list[asyncio.Future[Any]]:
        return [self._ready, *self._creating.values(), *self._writes.values()]


class IdentityCircuits:
    """Puts as a named user, each on that user's own circuit to the IOC."""

    def __init__(
        self, host_name: str, max_circuits: int = MAX_CIRCUITS, idle_s: float = IDLE_S
    ) -> None:
        self.host_name = host_name
        self._circuits: UserLinks[_Circuit] = UserLinks(
            lambda user, address: _Circuit(user, address, host_name), max_circuits, idle_s
        )

    def __len__(self) -> int:
        return len(self._circuits)

    async def put(
        self,
        user: str,
        address: Address,
        name: str,
        data: Any,
        data_type: int,
        count: int,
        wait: bool,
        timeout: float,
    ) -> None:
        """Write `data` (already converted: caproto's encoding of DBR `data_type`) as `user`.

        Raises IocDenied when the IOC's access security refuses, ChannelTimeout, PutRejected.
        """
        deadline = time.monotonic() + timeout
        check_user_name(user)
        with self._circuits.using(user, address) as circuit:
            await circuit.put(name, data, data_type, count, wait, deadline)

    def close(self) -> None:
        self._circuits.close()
