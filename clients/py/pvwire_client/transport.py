"""A minimal RFC 6455 client for the stream: each binary message is read from the socket into one
buffer, and numpy arrays view that buffer.

Why not ``websockets``: its reader appends socket chunks to a bytearray, slices the frame out of
it and converts the slice to bytes, three copies of every message (8 MB each for a 4-megapixel
uint16 frame). Here an :class:`asyncio.BufferedProtocol` hands the transport a slice of a
bytearray allocated at the message's size from the frame header, so ``recv_into`` writes the
payload where it stays: one frame-sized buffer instead of three, and 3.4-3.7 ms of client CPU per
such frame instead of 7-19 ms (bench/pyclient_transport.py). Small frames (headers, control
frames, messages under 64 KiB) go through a 64 KiB staging buffer and are copied out of it.

Only what the pvwire client needs: no extensions (section 1 forbids compression), no client
pings (the server's heartbeat and the client's watchdog find dead connections, section 2.1), no
HTTP proxy (websockets 17 used one named by HTTPS_PROXY/ALL_PROXY; pvwire's own deployments put
the stream behind reverse proxies, which need nothing from the client). The HTTP upgrade is
parsed by ``h11`` (httpx's HTTP/1.1 parser, so already installed), which hands back the bytes that
followed the 101 answer (the server sends HELLO at once).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import os
import ssl as ssl_module
import struct
from collections.abc import Sequence
from urllib.parse import urlsplit

import h11

from .closecodes import ABNORMAL, INVALID_DATA, NORMAL, PROTOCOL_ERROR, TOO_BIG

__all__ = ["Connection", "ConnectionClosed", "HandshakeError", "connect"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
_STAGING = 64 * 1024
# Complete messages held before reading pauses (TCP then pushes back on the server), as
# websockets' default max_queue.
_MAX_QUEUE = 16
CLOSE_TIMEOUT = 10.0  # as websockets: how long a close handshake may take before the abort

_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
# RFC 6455 7.4.1's "no status" code, which pvwire's table does not list (never sent on the wire).
NO_STATUS = 1005

Message = bytearray | str


class HandshakeError(Exception):
    """The server did not upgrade the connection (status, headers or subprotocol wrong)."""


class ConnectionClosed(Exception):
    """The connection is closed: the code and reason received, else those sent, else 1006."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code} {reason}".strip())
        self.code, self.reason = code, reason


class _Fail(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


async def connect(
    url: str,
    *,
    subprotocols: list[str],
    max_size: int,
    open_timeout: float = 10.0,
    ssl: ssl_module.SSLContext | None = None,
) -> Connection:
    """Open ``url`` (``ws://`` or ``wss://``) and complete the upgrade handshake."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise HandshakeError(f"not a ws:// or wss:// URL: {url!r}")
    secure = parts.scheme == "wss"
    port = parts.port or (443 if secure else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    context = (ssl or ssl_module.create_default_context()) if secure else None
    loop = asyncio.get_running_loop()
    conn = Connection(parts.netloc, target, subprotocols, max_size)
    async with asyncio.timeout(open_timeout):
        transport, _ = await loop.create_connection(
            lambda: conn,
            parts.hostname,
            port,
            ssl=context,
            server_hostname=parts.hostname if secure else None,
        )
        try:
            await conn._opened
        except BaseException:
            transport.abort()
            raise
    return conn


class Connection(asyncio.BufferedProtocol):
    """One client connection: :meth:`recv`, :meth:`send`, :meth:`close`."""

    def __init__(self, host: str, target: str, subprotocols: list[str], max_size: int) -> None:
        self.subprotocol: str | None = None
        self._host, self._target, self._offered = host, target, subprotocols
        self._max_size = max_size
        self._key = base64.b64encode(os.urandom(16))
        self._http: h11.Connection | None = h11.Connection(h11.CLIENT)
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._transport: asyncio.Transport | None = None
        self._stage = bytearray(_STAGING)
        self._start = self._end = 0  # unparsed bytes: _stage[_start:_end]
        self._msg: bytearray | None = None  # the message being assembled (fragments appended)
        self._msg_text = False
        self._filled = 0  # bytes of _msg written
        self._direct = 0  # bytes of the current frame still to read straight into _msg
        self._fin = False  # the current frame ends its message
        self._queue: collections.deque[Message] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = asyncio.Event()
        self._sent: tuple[int, str] | None = None
        self._rcvd: tuple[int, str] | None = None
        self._abort: asyncio.TimerHandle | None = None

    # --- the application's side ---------------------------------------------------------------

    async def recv(self) -> Message:
        """The next message: a bytearray (binary) or a str (text); ConnectionClosed at the end."""
        while not self._queue:
            if self._rcvd is not None or self._lost.is_set():
                raise self._closed()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        msg = self._queue.popleft()
        if self._paused and len(self._queue) < _MAX_QUEUE // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return msg

    async def send(self, data: bytes) -> None:
        """Send one binary message."""
        if self._sent is not None or self._rcvd is not None or self._lost.is_set():
            raise self._closed()
        self._write(_BINARY, data)
        await self._writable.wait()

    async def close(self, code: int = NORMAL, reason: str = "") -> None:
        """The close handshake: send Close, wait for the server's and for it to end TCP (aborted
        after CLOSE_TIMEOUT, or at once if this wait is cancelled: a close never leaves the socket
        open)."""
        self.start_close(code, reason)
        if self._lost.is_set():
            return
        try:
            await self._lost.wait()
        except BaseException:
            self.abort()
            raise

    def start_close(self, code: int = NORMAL, reason: str = "") -> None:
        """Send Close (unless sent) and return: the server answers and ends TCP, or the connection
        is aborted after CLOSE_TIMEOUT. Nothing waits on a peer that may be dead."""
        if self._transport is None or self._lost.is_set():
            return
        if self._sent is None:
            self._send_close(code, reason)
        self._abort_later()

    def abort(self) -> None:
        """Drop TCP now, without waiting for the server's end of the close handshake."""
        if self._transport is not None and not self._lost.is_set():
            self._transport.abort()

    @property
    def closed(self) -> bool:
        """TCP has ended: nothing of this connection is left open."""
        return self._lost.is_set()

    def _abort_later(self) -> None:
        if self._abort is None and self._transport is not None:
            self._abort = asyncio.get_running_loop().call_later(CLOSE_TIMEOUT, self.abort)

    def _closed(self) -> ConnectionClosed:
        code, reason = self._rcvd or self._sent or (ABNORMAL, "")
        return ConnectionClosed(code, reason)

    # --- writing ------------------------------------------------------------------------------

    def _write(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0xFE, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0xFF, n)
        mask = os.urandom(4)
        # Client frames are masked (RFC 6455 5.3). One big-integer XOR is the fastest pure-Python
        # way for the client's messages (ATTACH/DETACH, under a kilobyte).
        key = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
        assert self._transport is not None
        self._transport.write(head + mask + masked)

    def _send_close(self, code: int, reason: str) -> None:
        self._sent = (code, reason)
        payload = b"" if code == NO_STATUS else struct.pack("!H", code) + reason.encode()[:123]
        if self._transport is not None and not self._transport.is_closing():
            self._write(_CLOSE, payload)

    def _fail(self, code: int, reason: str) -> None:
        """Fail the connection (RFC 6455 7.1.7): Close with ``code``, then drop it."""
        if self._http is None and self._sent is None and not self._lost.is_set():
            self._send_close(code, reason)  # only once the handshake is done: no frames in HTTP
        if self._transport is not None:
            self._transport.close()

    # --- asyncio's side -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        headers = [
            ("Host", self._host),
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", self._key.decode()),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Protocol", ", ".join(self._offered)),
            ("User-Agent", "pvwire-client"),
        ]
        assert self._http is not None
        request = h11.Request(method="GET", target=self._target, headers=headers)
        # The request has no body: EndOfMessage lets h11 expect the switch of protocols.
        transport.write(
            (self._http.send(request) or b"") + (self._http.send(h11.EndOfMessage()) or b"")
        )

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._direct:
            # The one copy: the socket writes the payload where the message will stay.
            assert self._msg is not None
            return memoryview(self._msg)[self._filled : self._filled + self._direct]
        if self._start and _STAGING - self._end < 4096:
            # At most one small partial frame is moved to the front (same size, no resize).
            n = self._end - self._start
            self._stage[:n] = self._stage[self._start : self._end]
            self._start, self._end = 0, n
        return memoryview(self._stage)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._direct:
                self._filled += nbytes
                self._direct -= nbytes
                if not self._direct and self._fin:
                    self._deliver()
                return
            self._end += nbytes
            if self._http is not None:
                self._handshake()
            if self._http is None:
                self._parse()
        except _Fail as e:
            if not self._opened.done():
                self._opened.set_exception(HandshakeError(e.reason))
            self._fail(e.code, e.reason)

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost.set()
        if self._abort is not None:
            self._abort.cancel()
        self._writable.set()
        if not self._opened.done():
            why = f": {exc}" if exc else ""
            self._opened.set_exception(HandshakeError(f"connection closed during handshake{why}"))
        self._wake()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # --- the upgrade --------------------------------------------------------------------------

    def _handshake(self) -> None:
        http = self._http
        assert http is not None
        http.receive_data(bytes(self._stage[self._start : self._end]))
        self._start = self._end = 0
        while True:
            try:
                event = http.next_event()
            except h11.RemoteProtocolError as e:
                raise _Fail(PROTOCOL_ERROR, f"invalid HTTP answer: {e}") from None
            if event is h11.NEED_DATA:
                return
            if isinstance(event, h11.InformationalResponse) and event.status_code == 101:
                self._accept(event.headers)
            elif isinstance(event, h11.Response):
                raise _Fail(
                    PROTOCOL_ERROR,
                    f"server rejected WebSocket connection: HTTP {event.status_code}",
                )
            elif event is h11.PAUSED:  # switched protocols: what follows is WebSocket frames
                data, _ = http.trailing_data
                if len(data) > _STAGING:
                    self._stage = bytearray(len(data))
                self._stage[: len(data)] = data
                self._end = len(data)
                self._http = None
                self._opened.set_result(None)
                return

    def _accept(self, raw: Sequence[tuple[bytes, bytes]]) -> None:
        headers: dict[bytes, bytes] = {}
        for name, value in raw:  # h11 lower-cases names; repeated ones are joined
            headers[name] = headers[name] + b", " + value if name in headers else value
        expected = base64.b64encode(hashlib.sha1(self._key + _GUID).digest())
        if headers.get(b"upgrade", b"").lower() != b"websocket":
            raise _Fail(PROTOCOL_ERROR, "101 answer without Upgrade: websocket")
        if headers.get(b"sec-websocket-accept") != expected:
            raise _Fail(PROTOCOL_ERROR, "wrong Sec-WebSocket-Accept in the 101 answer")
        if b"sec-websocket-extensions" in headers:
            raise _Fail(PROTOCOL_ERROR, "server negotiated an extension the client did not offer")
        chosen = headers.get(b"sec-websocket-protocol")
        if chosen is not None:
            self.subprotocol = chosen.decode("latin-1")
            if self.subprotocol not in self._offered:
                raise _Fail(PROTOCOL_ERROR, f"server chose subprotocol {self.subprotocol!r}")

    # --- frames -------------------------------------------------------------------------------

    def _parse(self) -> None:
        """Consume every complete frame staged; start a direct read for a large payload."""
        stage = self._stage
        while not self._direct and self._end - self._start >= 2:
            at = self._start
            b0, b1 = stage[at], stage[at + 1]
            fin, opcode, n = bool(b0 & 0x80), b0 & 0x0F, b1 & 0x7F
            head = 2
            if n == 126:
                head = 4
            elif n == 127:
                head = 10
            if self._end - at < head:
                return
            if n == 126:
                (n,) = struct.unpack_from("!H", stage, at + 2)
            elif n == 127:
                (n,) = struct.unpack_from("!Q", stage, at + 2)
            if b0 & 0x70:
                raise _Fail(PROTOCOL_ERROR, "reserved bits set (no extension was negotiated)")
            if b1 & 0x80:
                raise _Fail(PROTOCOL_ERROR, "the server masked a frame")
            if opcode >= 0x8:
                if not fin or n > 125:
                    raise _Fail(PROTOCOL_ERROR, "control frame fragmented or over 125 bytes")
                if self._end - at < head + n:
                    return
                self._start = at + head + n
                self._control(opcode, bytes(stage[at + head : at + head + n]))
                continue
            if not self._data_frame(fin, opcode, n, at + head):
                return

    def _data_frame(self, fin: bool, opcode: int, n: int, body: int) -> bool:
        """Take the frame whose payload starts at ``body``; False if it must wait for more."""
        if opcode not in (_CONT, _TEXT, _BINARY):
            raise _Fail(PROTOCOL_ERROR, f"unknown opcode {opcode}")
        if (opcode == _CONT) != (self._msg is not None):
            raise _Fail(PROTOCOL_ERROR, "continuation frame out of place")
        size = self._filled + n
        if size > self._max_size:
            raise _Fail(TOO_BIG, f"message over {self._max_size} bytes")
        staged = self._end - body
        if staged < n and body - self._start + n <= _STAGING:
            return False  # a small frame, not all here: wait for the rest in the staging buffer
        if self._msg is None:
            self._msg, self._msg_text, self._filled = bytearray(n), opcode == _TEXT, 0
        else:
            # A later fragment: the buffer grows (a copy, but servers fragment rarely; pvwire's
            # sends one frame per message).
            self._msg.extend(bytes(n))
        take = min(staged, n)
        self._msg[self._filled : self._filled + take] = memoryview(self._stage)[body : body + take]
        self._filled += take
        self._start = body + take
        self._fin = fin
        self._direct = n - take
        if self._start == self._end:
            self._start = self._end = 0
        if not self._direct and fin:
            self._deliver()
        return True

    def _deliver(self) -> None:
        msg, self._msg, self._filled = self._msg, None, 0
        assert msg is not None
        if self._rcvd is not None or self._sent is not None:
            return  # after a Close, data is discarded (RFC 6455 5.5.1)
        if self._msg_text:
            try:
                self._queue.append(msg.decode())
            except UnicodeDecodeError:
                raise _Fail(INVALID_DATA, "text message is not UTF-8") from None
        else:
            self._queue.append(msg)
        if len(self._queue) >= _MAX_QUEUE and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def _control(self, opcode: int, payload: bytes) -> None:
        if opcode == _PING:
            if self._sent is None and self._transport is not None:
                self._write(_PONG, payload)
        elif opcode == _CLOSE:
            if len(payload) == 1:
                raise _Fail(PROTOCOL_ERROR, "close frame with a 1-byte payload")
            code = struct.unpack_from("!H", payload)[0] if payload else NO_STATUS
            try:
                reason = payload[2:].decode()
            except UnicodeDecodeError:
                raise _Fail(INVALID_DATA, "close reason is not UTF-8") from None
            self._rcvd = (code, reason)
            if self._sent is None:
                self._send_close(code, "")  # echo the code (RFC 6455 5.5.1)
            self._abort_later()  # the server closes TCP first (RFC 6455 7.1.1); abort if not
            self._wake()
