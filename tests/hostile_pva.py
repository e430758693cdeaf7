"""A hostile PVA server on loopback, in the test's process: a real TCP and UDP server speaking
enough PVA for pvxs's gets and pvwire's own puts (upstream/pvaproto.py), that answers a PUT INIT
with what a test asks for (a type that doubles at every cached level, a long chain of cached
types), sends what nobody asked for first (PUT INIT replies of ioids never used, MESSAGEs), and
forges search answers from an address nobody searched.

It binds 127.0.0.1 only, on ports the kernel picks for it (held while it runs: no other process
can take them), and answers searches only on its own UDP port: a server under test reaches it
through an EPICS_PVA_ADDR_LIST naming that port (`address_list`), so no other test's searches
come here. It runs on a thread and event loop of its own, so a test's blocking calls never stall
it. The types here are the wire bytes tests/test_pvaproto.py and the fuzz parse as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pvwire.upstream.pvaproto import (
    CMD_CONNECTION_VALIDATED,
    CMD_CONNECTION_VALIDATION,
    CMD_CREATE_CHANNEL,
    CMD_ECHO,
    CMD_MESSAGE,
    CMD_PUT,
    CMD_SEARCH,
    CMD_SEARCH_RESPONSE,
    FLAG_CONTROL,
    FLAG_SERVER,
    STRING,
    STRUCT,
    FieldDesc,
    Reader,
    Status,
    Writer,
    header,
    struct_of,
)

__all__ = [
    "NT_DOUBLE",
    "HostilePva",
    "Name",
    "Search",
    "chain_type",
    "doubling_type",
    "message",
    "message_flood",
    "search_reply",
    "type_bytes",
    "unsolicited_types",
]

CMD_GET = 10
CMD_DESTROY_REQUEST = 15
INIT = 0x08
DOUBLE = FieldDesc(0x43)
_ALARM = struct_of("alarm_t", severity=FieldDesc(0x22), status=FieldDesc(0x22),
                   message=FieldDesc(STRING))  # fmt: skip
_TIME = struct_of("time_t", secondsPastEpoch=FieldDesc(0x23), nanoseconds=FieldDesc(0x22),
                  userTag=FieldDesc(0x22))  # fmt: skip
# What a get of any name here answers: an NTScalar of a double, 0.0, no alarm.
NT_DOUBLE = struct_of("epics:nt/NTScalar:1.0", value=DOUBLE, alarm=_ALARM, timeStamp=_TIME)


# --- what is sent, as bytes ------------------------------------------------------------------


def message(cmd: int, body: bytes | bytearray) -> bytes:
    """A server's message, little-endian."""
    return header(cmd, FLAG_SERVER, len(body), False) + bytes(body)


def type_bytes(desc: FieldDesc) -> bytes:
    w = Writer(False)
    w.type_desc(desc)
    return bytes(w.buf)


def _member_struct(w: Writer, name: str, key: int, members: Iterable[tuple[str, int]]) -> None:
    """Member `name`: a structure stored as cache `key`, of references to cached types."""
    pairs = list(members)
    w.string(name)
    w.buf += b"\xfd"
    w.pack("H", key)
    w.buf.append(STRUCT)
    w.string("")
    w.size(len(pairs))
    for member, ref in pairs:
        w.string(member)
        w.buf += b"\xfe"
        w.pack("H", ref)


def _levels(levels: int, refs: tuple[str, ...]) -> bytes:
    """A structure whose member `lK` (K >= 1) is a cached structure whose members `refs` each
    refer to `lK-1`; `l0` a structure of one double, `value` last."""
    w = Writer(False)
    w.buf.append(STRUCT)
    w.string("")
    w.size(levels + 1)
    w.string("l0")
    w.buf += b"\xfd"
    w.pack("H", 0)
    w.type_desc(struct_of("", x=DOUBLE))
    for k in range(1, levels):
        _member_struct(w, f"l{k}", k, [(ref, k - 1) for ref in refs])
    w.string("value")
    w.buf.append(DOUBLE.code)
    return bytes(w.buf)


def doubling_type(levels: int) -> bytes:
    """Each level two references to the one before: ~20 bytes a level, 2**K nodes unfolded at
    level K; `value` last, so that finding it sizes every level before it. 42 levels are ~830
    bytes."""
    return _levels(levels, ("a", "b"))


def chain_type(levels: int) -> bytes:
    """Each level one reference to the one before: read shallow, `levels` deep unfolded."""
    return _levels(levels, ("n",))


def init_reply(ioid: int, desc: bytes, cmd: int = CMD_PUT) -> bytes:
    """The answer to the INIT of a PUT (or GET) `ioid`: its type."""
    w = Writer(False)
    w.pack("IB", ioid, INIT)
    w.status(Status())
    return message(cmd, bytes(w.buf) + desc)


def unsolicited_types(count: int, members: int, first_ioid: int = 0x7000_0000) -> Iterator[bytes]:
    """`count` PUT INIT replies for ioids nobody asked for, each storing a structure of
    `members` strings in the type cache under a key of its own (~6 bytes a member)."""
    w = Writer(False)
    w.size(members)
    for m in range(members):
        w.string(f"m{m}")
        w.buf.append(STRING)
    fields = bytes(w.buf)
    for i in range(count):
        head = Writer(False)
        head.buf += b"\xfd"
        head.pack("H", i % 0x10000)
        head.buf.append(STRUCT)
        head.string(f"flood{i}")
        yield init_reply(first_ioid + i, bytes(head.buf) + fields)


def message_flood(count: int, size: int, ioid: int = 0) -> Iterator[bytes]:
    """`count` MESSAGEs of `size` bytes of words each."""
    text = (b"the IOC says so " * (size // 16 + 1))[:size]
    for _ in range(count):
        w = Writer(False)
        w.pack("IB", ioid, 1)
        w.size(len(text))
        yield message(CMD_MESSAGE, bytes(w.buf) + text)


def search_reply(seq: int, cids: Iterable[int], tcp_port: int) -> bytes:
    """A positive tcp SEARCH_RESPONSE naming 127.0.0.1:`tcp_port`."""
    ids = list(cids)
    w = Writer(False)
    w.buf += b"hostile-guid"  # 12 bytes
    w.pack("I", seq)
    w.buf += bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
    w.pack("H", tcp_port)
    w.string("tcp")
    w.buf.append(1)
    w.pack("H", len(ids))
    for cid in ids:
        w.pack("I", cid)
    return message(CMD_SEARCH_RESPONSE, w.buf)


# --- the server --------------------------------------------------------------------------------


@dataclass
class Name:
    """What the server does for one PV name: the type a PUT INIT is answered with, and what it
    sends first (given the INIT's ioid). Gets are answered with NT_DOUBLE whatever the name."""

    put_type: bytes = field(default_factory=lambda: type_bytes(NT_DOUBLE))
    before_init: Callable[[int], Iterable[bytes]] = lambda ioid: ()


@dataclass(frozen=True)
class Search:
    """A SEARCH the server received."""

    source: tuple[str, int]
    seq: int
    reply_port: int
    cids: tuple[int, ...]
    names: tuple[str, ...]


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: HostilePva) -> None:
        self.server = server

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        with contextlib.suppress(Exception):  # not a search: nothing to say
            self.server.searched(_parse_search(data, (str(addr[0]), int(addr[1]))))


def _parse_search(data: bytes, source: tuple[str, int]) -> Search:
    if data[0] != 0xCA or data[3] != CMD_SEARCH:
        raise ValueError("not a search")
    r = Reader(data[8:], bool(data[2] & 0x80))
    seq = int(r.unpack("I"))
    r.take(4 + 16)  # flags, reply address
    port = int(r.unpack("H"))
    for _ in range(r.size()):
        r.string()  # protocols
    cids, names = [], []
    for _ in range(int(r.unpack("H"))):
        cids.append(int(r.unpack("I")))
        names.append(r.string())
    return Search(source, seq, port, tuple(cids), tuple(names))


class HostilePva:
    """The server: `names` it serves (a search for any other name gets no answer from it), on
    127.0.0.1 ports of its own; `with HostilePva(...) as h:` runs it on its own thread."""

    def __init__(self, names: dict[str, Name]) -> None:
        self.names = names
        self.searches: list[Search] = []  # every search received, in order
        self.connections = 0  # TCP connections accepted
        self.puts: list[tuple[str, int]] = []  # (name, ioid) of every PUT INIT received
        self.forged = 0  # forged search answers sent
        self.forging: asyncio.Task[None] | None = None
        self.relay_from: tuple[str, int] | None = None  # searches copied as forged answers
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.tcp_port = 0
        self.udp_port = 0
        self._udp: asyncio.DatagramTransport | None = None
        self._forger: socket.socket | None = None

    # -- the test's side (any thread) -------------------------------------------------------

    def __enter__(self) -> HostilePva:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    @property
    def address_list(self) -> str:
        """This server's entry in an EPICS_PVA_ADDR_LIST."""
        return f"127.0.0.1:{self.udp_port}"

    def forge(self, target: tuple[str, int], seqs: Iterable[int], cids: Iterable[int]) -> None:
        """From a socket of its own (an address nobody searched): one search answer per seq to
        `target`, each naming every cid of `cids` as found here."""
        ids = list(cids)
        data = [search_reply(seq, ids, self.tcp_port) for seq in seqs]

        def send() -> None:
            for d in data:
                self._forge(d, target)

        self._loop.call_soon_threadsafe(send)

    def start_forging(
        self, target: tuple[str, int], cids: Iterable[int], seqs: Iterable[int] = (0,)
    ) -> None:
        """Until `stop_forging`: forged answers to `target` naming every cid of `cids` (one
        datagram per seq), as fast as the socket takes them; and every search from `target`
        answered at once with a forged copy (its own seq and cids)."""
        ids, seq_list = list(cids), list(seqs)

        async def flood() -> None:
            data = [search_reply(seq, ids, self.tcp_port) for seq in seq_list]
            while True:
                for d in data:
                    self._forge(d, target)
                await asyncio.sleep(0.0005)

        def start() -> None:
            self.relay_from = target
            self.forging = self._loop.create_task(flood())

        self._loop.call_soon_threadsafe(start)

    def stop_forging(self) -> None:
        def stop() -> None:
            self.relay_from = None
            if self.forging is not None:
                self.forging.cancel()

        self._loop.call_soon_threadsafe(stop)

    # -- the server's side (its own loop) ---------------------------------------------------

    def _forge(self, data: bytes, target: tuple[str, int]) -> None:
        assert self._forger is not None
        with contextlib.suppress(OSError):  # a full buffer: the next one is sent
            self._forger.sendto(data, target)
            self.forged += 1

    async def _start(self) -> None:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.tcp_port = server.sockets[0].getsockname()[1]
        self._server = server
        transport, _ = await self._loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=("127.0.0.1", 0)
        )
        self._udp = transport
        self.udp_port = transport.get_extra_info("sockname")[1]
        self._forger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._forger.bind(("127.0.0.1", 0))
        self._forger.setblocking(False)

    async def _close(self) -> None:
        if self.forging is not None:
            self.forging.cancel()
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._udp is not None:
            self._udp.close()
        if self._forger is not None:
            self._forger.close()

    def searched(self, search: Search) -> None:
        self.searches.append(search)
        if self.relay_from == (search.source[0], search.reply_port):
            self._forge(search_reply(search.seq, search.cids, self.tcp_port), self.relay_from)
        ours = [cid for cid, name in zip(search.cids, search.names, strict=True)
                if name in self.names]  # fmt: skip
        if ours and self._udp is not None:
            reply = search_reply(search.seq, ours, self.tcp_port)
            self._udp.sendto(reply, (search.source[0], search.reply_port))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        channels: dict[int, str] = {}  # sid -> name
        try:
            writer.write(header(2, FLAG_SERVER | FLAG_CONTROL, 0, False))  # SET_ENDIAN
            w = Writer(False)
            w.pack("IH", 0x10000, 0x7FFF)
            w.size(2)
            w.string("anonymous")
            w.string("ca")
            writer.write(message(CMD_CONNECTION_VALIDATION, w.buf))
            while True:
                head = await reader.readexactly(8)
                (length,) = struct.unpack("<I" if not head[2] & 0x80 else ">I", head[4:])
                body = await reader.readexactly(length)
                await self._answer(head[3], body, writer, channels)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:  # the server closes: a task cancelled is logged
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _answer(
        self, cmd: int, body: bytes, writer: asyncio.StreamWriter, channels: dict[int, str]
    ) -> None:
        if cmd == CMD_CONNECTION_VALIDATION:
            writer.write(message(CMD_CONNECTION_VALIDATED, b"\xff"))
        elif cmd == CMD_ECHO:
            writer.write(message(CMD_ECHO, body))
        elif cmd == CMD_CREATE_CHANNEL:
            r = Reader(body, False)
            r.take(2)
            cid, name = int(r.unpack("I")), r.string()
            sid = len(channels) + 1
            w = Writer(False)
            w.pack("II", cid, sid)
            if name in self.names:
                channels[sid] = name
                w.status(Status())
            else:
                w.status(Status(2, f"no channel {name} here", ""))
            writer.write(message(CMD_CREATE_CHANNEL, w.buf))
        elif cmd in (CMD_GET, CMD_PUT):
            sid, ioid, subcmd = struct.unpack("<IIB", body[:9])
            name = channels.get(sid, "")
            if cmd == CMD_PUT and subcmd & INIT:
                self.puts.append((name, ioid))
                behaviour = self.names.get(name, Name())
                for data in behaviour.before_init(ioid):
                    writer.write(data)
                    await writer.drain()
                writer.write(init_reply(ioid, behaviour.put_type))
            elif subcmd & INIT:  # a get's INIT
                writer.write(init_reply(ioid, type_bytes(NT_DOUBLE), CMD_GET))
            elif cmd == CMD_GET:
                w = Writer(False)
                w.pack("IB", ioid, subcmd)
                w.status(Status())
                w.bitset([0])  # the whole structure
                w.pack("d", 0.0)
                w.pack("ii", 0, 0)
                w.string("")
                w.pack("qii", 0, 0, 0)
                writer.write(message(CMD_GET, w.buf))
            else:  # a put: done
                w = Writer(False)
                w.pack("IB", ioid, subcmd)
                w.status(Status())
                writer.write(message(CMD_PUT, w.buf))
        await writer.drain()
