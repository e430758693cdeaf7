"""uvicorn's HTTP protocol (httptools, what `uvicorn[standard]` brings) with deadlines and the
connection table: what a client spends of the server's time and descriptors is bounded too.

uvicorn has no deadline for a request's headers (its issue #157) nor for a body: a client that
sends one byte every few seconds held a connection, its parser and, once a body had begun, a
task, for ever. Here (limits.py):
- a request's line and headers are complete within `http_header_timeout_s` of the connection's
  opening (or, on a kept-alive connection, of the request's first byte; an idle one is closed by
  uvicorn's keep-alive timeout), a WebSocket's upgrade request included;
- a body comes within `http_body_timeout_s` of the end of its headers, plus a second for each
  `http_body_min_rate` bytes of it received; the clock starts again while the application has
  not read what came (uvicorn then stops reading: the delay is not the client's);
- past either, the client is answered 408 naming the limit, and the connection is closed;
- a response's bytes waiting in the server (uvicorn's flow control has paused its writer: more
  than the transport's high-water mark is unsent) must make progress within
  `http_write_timeout_s`, or the connection is dropped and the bytes freed. uvicorn writes a
  body it is given whole into the transport, so a client that never read a GraphQL answer held
  the answer's memory (and an MJPEG or `/retrieval/` stream its task) for as long as it kept the
  connection open; every endpoint's answer is bounded so, not only the streams that watch their
  own sends;
- every connection is counted at accept in the connection table (api/connections.py): one past
  its address's bound is answered 429, one past the process's capacity 503 (but `/healthz` and
  `/readyz`, for a few more), before anything of it is read.

Every answer of this protocol's own closes the connection gracefully: it is sent, then the
connection's sending side is shut, and what the client still sends is read and dropped, for up
to `http_answered_linger_s`, until the client closes. Closed at once, the kernel answers bytes
that come after (a request sent as the refusal was written) with a reset, and a client's kernel
then drops the answer it had not read yet: the client saw "connection reset", not why.

A connection that becomes a WebSocket hands its place in the table to the WebSocket protocol
(pvws/wsprotocol.py), which releases it when the socket closes. Everything else is uvicorn's.
`pvwire serve` names this class to uvicorn (`http=`), with or without `--workers`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.datastructures import Headers
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from ..limits import number, shown
from .connections import STATE_KEY, Connections, Refusal, Ticket

__all__ = ["HttpProtocol"]

HEADER_TIMEOUT = number("http_header_timeout_s")
BODY_TIMEOUT = number("http_body_timeout_s")
BODY_MIN_RATE = number("http_body_min_rate")
ANSWERED_LINGER = number("http_answered_linger_s")
WRITE_TIMEOUT = number("http_write_timeout_s")


class HttpProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        table = app_state.get(STATE_KEY)
        self.table: Connections | None = table if isinstance(table, Connections) else None
        self.ticket: Ticket | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._phase = ""  # what the deadline is for: "headers", "body" or ""
        self._body_from = 0.0  # loop time the body's clock started
        self._body_bytes = 0
        self._answered = False  # this protocol answered and closes: the rest is dropped
        self._linger: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._unsent = 0  # bytes waiting in the transport when the write deadline was set

    # --- the connection -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        if self.table is not None:
            peer = self.client[0] if self.client else ""
            self.ticket, refusal = self.table.accept(peer)
            if refusal is not None:
                self._refuse(refusal)
                return
        self._expect("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        self._stop_write_deadline()
        if self._linger is not None:
            self._linger.cancel()
        if self.ticket is not None and self.table is not None:
            self.table.release(self.ticket)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._answered:
            super().data_received(data)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._expect_writes()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_write_deadline()

    # --- the parser's callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase != "headers":  # a kept-alive connection's next request: from its first byte
            self._expect("headers")

    def on_headers_complete(self) -> None:
        self._stop_deadline()
        refusal = self._admission()
        if refusal is not None:
            self._refuse(refusal)
            return
        super().on_headers_complete()
        if not (self.parser.should_upgrade() and self._should_upgrade()):
            self._body_from, self._body_bytes = self.loop.time(), 0
            self._expect("body")

    def on_body(self, body: bytes) -> None:
        if self._answered:
            return
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._answered:
            return
        if self._phase == "body":
            self._stop_deadline()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # Answered before its body was all in: the body's deadline still bounds the rest (the
        # keep-alive timeout does not: every byte that comes starts it again).
        if self.ticket is not None and self.table is not None:
            self.table.answered(self.ticket)
        super().on_response_complete()

    def handle_websocket_upgrade(self) -> None:
        if self._answered:
            return
        if self.ticket is not None and self.table is not None:
            self.table.hand_over(self.transport, self.ticket)
            self.ticket = None  # the WebSocket protocol releases it
        self._stop_write_deadline()  # the WebSocket's own flow control and stall check take over
        super().handle_websocket_upgrade()

    # --- deadlines and refusals ---------------------------------------------------------------

    def _admission(self) -> Refusal | None:
        """A request's headers are in: what the table says of it (a proxy's client past its
        address's bound, or a connection past the capacity asking for more than a probe)."""
        ticket, table = self.ticket, self.table
        if ticket is None or table is None:
            return None
        refusal = table.forwarded(ticket, Headers(raw=self.headers))
        return refusal or table.refusal_of(ticket, self.url.split(b"?", 1)[0])

    def _expect(self, phase: str) -> None:
        self._stop_deadline()
        self._phase = phase
        delay = HEADER_TIMEOUT if phase == "headers" else BODY_TIMEOUT
        self._deadline = self.loop.call_later(delay, self._check_deadline)

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = ""

    def _check_deadline(self) -> None:
        self._deadline = None
        phase, now = self._phase, self.loop.time()
        if phase == "body":
            if self.flow.read_paused:  # the application has not read what came
                self._body_from, self._body_bytes = now, 0
            due = self._body_from + BODY_TIMEOUT + self._body_bytes / BODY_MIN_RATE
            if now < due:
                self._deadline = self.loop.call_later(due - now, self._check_deadline)
                return
            what = (
                f"request body too slow: it gets {shown('http_body_timeout_s')} and a second "
                f"per {shown('http_body_min_rate').removesuffix('/s')} "
                "(http_body_timeout_s, http_body_min_rate)"
            )
        else:
            what = (
                f"request headers not complete within {shown('http_header_timeout_s')} "
                "(http_header_timeout_s)"
            )
        self._phase = ""
        if self.table is not None:
            self.table.timed_out(phase)
        started = self.cycle is not None and not self.cycle.response_complete
        if phase == "body" and started and self.cycle.response_started:
            self._answered = True
            self.transport.close()  # a response is under way: it cannot say why
            return
        self._answer(408, what)

    def _expect_writes(self) -> None:
        """Paused: what waits must shrink within `WRITE_TIMEOUT`, and then again."""
        self._stop_write_deadline()
        self._unsent = self.transport.get_write_buffer_size()
        self._write_deadline = self.loop.call_later(WRITE_TIMEOUT, self._check_writes)

    def _stop_write_deadline(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _check_writes(self) -> None:
        self._write_deadline = None
        if not self.flow.write_paused:
            return
        if self.transport.get_write_buffer_size() < self._unsent:  # the client took some
            self._expect_writes()
            return
        if self.table is not None:
            self.table.timed_out("response")
        self.transport.abort()  # close() would wait for the client to read it all

    def _refuse(self, refusal: Refusal) -> None:
        self._answer(refusal.status, refusal.message)

    def _answer(self, status: int, message: str) -> None:
        """Answer `status` with `message` and close: nothing more of the connection is read."""
        self._stop_deadline()
        self._answered = True
        body = (message + "\n").encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(b"".join(head) + body)
        if not transport.can_write_eof():  # TLS: no half-close
            transport.close()
            return
        transport.write_eof()
        self.flow.resume_reading()  # read, and drop, until the client closes (eof_received)
        self._linger = self.loop.call_later(ANSWERED_LINGER, transport.close)
