"""One client connection's protocol state, with no I/O (the h11 / caproto pattern).

The WebSocket around it is thin: `api/stream.py` admits the connection and builds the session,
and `run_connection` with its `pump` (`api/connection.py`, the same for `/pvws/pv`) feeds
`receive()` with each incoming message, sends what `next_frame()` returns, reports each completed
send to `sent()`, and closes the socket when `close_request` is set. The hub drives it at every
tick (`collect` + `flush_tick`) and once a second (`housekeeping`). What it shares with pvws's
session (attachment records and their claims, the flow control, close) is `attached.py`'s.

Flow control (PROTOCOL.md section 9, `flow.py`): frames are queued while the bytes queued stay
under `send_budget`. Past it the session is *behind*: it stops queueing and merges the changes it
would have sent per channel (latest value wins, the serial keeps the count). When the writer has
drained below half the budget, one catch-up DATA carries the merged changes. A queue that makes no
progress for `stall_timeout` closes the connection with 4008 SLOW. Nothing here ever waits for the
client, so a slow client cannot delay the tick or anyone else. A backfill (PROTOCOL.md 2.8) is
produced under the same budget (`_backfill`, core/backfill.py): its attachment's live data is
held until its snapshot, and a client that reads nothing holds at most the budget of its past.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..limits import integer, number
from . import codec as wire
from .attached import AttachedSession
from .codes import (
    BAD_MESSAGE,
    FORBIDDEN,
    HEARTBEAT_TIMEOUT,
    SLOW,
    TOO_MANY_CHANNELS,
    UNKNOWN_ATTACHMENT,
)
from .tokens import Claims, TokenError

__all__ = ["FORBIDDEN", "AttachRefused", "Prepared", "Session", "SessionHost", "SessionLimits"]


class AttachRefused(Exception):
    """The host will not attach this token (the identity may not read a channel): answered with
    ERROR for that ATTACH only; the connection and its other attachments go on."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class SessionLimits:
    send_budget: int = integer("send_budget")  # bytes queued before merging instead
    stall_timeout: float = number("stall_timeout_s")  # no send progress: close with SLOW
    heartbeat: float = number("heartbeat_s")  # seconds of silence before a HEARTBEAT
    max_channels: int = integer("max_channels_per_connection")  # over all attachments
    max_attachments: int = integer("max_attachments_per_connection")  # at once
    requests_waiting: int = integer("stream_requests_waiting")  # behind ATTACHes opening
    waiting_bytes: int = integer("max_in_bytes")  # of those: one largest message's worth
    # From HELLO: a connection that says nothing (a half handshake) holds a socket for nothing.
    first_message: float = number("stream_first_message_s")


class Source(Protocol):
    """What a session reads from one attachment's subscription (a `core.view.View`); the session
    never sees channels or the hub's registries, so data flows one way: view -> session."""

    @property
    def ids(self) -> tuple[str, ...]: ...

    @property
    def tick_entries(self) -> wire.Entries:
        """This tick's spliced entries, valid from before `Session.collect` to the tick's end."""

    tick_masks: dict[int, int]  # sid -> field mask of this tick's entries

    def snapshot_entries(self) -> wire.Entries: ...
    def entries_for(self, masks: dict[int, int]) -> wire.Entries: ...
    def backfill(
        self,
        att: int,
        seconds: float,
        held: Sequence[int] | None,
        who: str = "",
        resume: Callable[[], None] | None = None,
    ) -> Backfill:
        """`who` reads the archive behind the history, if any; `resume`: call when the
        backfill can go on after it returned without being done and without filling."""
        ...


class Backfill(Protocol):
    """One attachment's backfill, produced under the send budget (a `core.backfill.Backfill`)."""

    def fill(self, room: int) -> tuple[list[bytes], bool]:
        """HISTORY messages until they hold `room` bytes (one more at most), and whether it is
        done: then the snapshot goes next, in the same call."""
        ...

    def close(self) -> None:
        """The attachment is gone before the backfill was done."""
        ...


class Prepared(Protocol):
    """An attachment its host checked and is opening the channels of (a `core.hub.PreparedView`)."""

    @property
    def left(self) -> int:
        """Channels still to open."""
        ...


class SessionHost(Protocol):
    """What a session needs from the hub: an ATTACH is checked (`prepare_view`, which raises
    AttachRefused), its channels opened a few at a time (`open_prepared`, which may too), then
    attached (`finish_view`), or given up (`cancel_view`)."""

    def verify_token(self, token: str, address: str) -> Claims: ...
    def prepare_view(self, claims: Claims, session: Session) -> Prepared: ...
    def open_prepared(self, prepared: Prepared, limit: int) -> int: ...
    def finish_view(self, prepared: Prepared, session: Session, att: int) -> Source: ...
    def cancel_view(self, prepared: Prepared) -> None: ...
    def close_view(self, view: Source, session: Session, att: int) -> None: ...


class _Attachment:
    """One attachment of a stream connection: the view it reads and the token it came with."""

    __slots__ = ("att", "claims", "view")

    def __init__(self, att: int, view: Source, claims: Claims) -> None:
        self.att = att
        self.view = view
        self.claims = claims


class _Opening:
    """An ATTACH whose channels are opening: answered with ATTACHED once all are open."""

    __slots__ = ("claims", "prepared", "req", "since")

    def __init__(
        self, req: int, claims: Claims, since: tuple[int, ...] | None, prepared: Prepared
    ) -> None:
        self.req, self.claims, self.since, self.prepared = req, claims, since, prepared


class Session(AttachedSession[bytes, _Attachment]):
    endpoint = "stream"

    def __init__(
        self,
        number: int,
        address: str,
        host: SessionHost,
        hello: bytes,
        limits: SessionLimits,
        wake: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        aligned: bool = True,
        opener: Callable[[Session], None] | None = None,
    ) -> None:
        """`opener` is told when ATTACHes have channels to open, and opens them a few per
        event-loop pass with every other connection's (core/opener.py); without one, each
        ATTACH opens all its channels at once."""
        super().__init__(number, address, limits, wake, clock)
        # Pad entries so ndarray data is 8-byte aligned (PROTOCOL.md section 1: the client
        # offered `pvwire.v1.aligned`); a client that did not gets the same frames unpadded.
        self.aligned = aligned
        self._host = host
        self.channel_count = 0
        self._seq = 0
        self._pending: dict[int, dict[int, int]] = {}  # att -> sid -> merged mask while behind
        # Backfills under way, oldest first: their attachments get no live data until done.
        self._backfills: dict[int, Backfill] = {}
        self._tick_groups: list[tuple[int, Source]] = []
        self._opener = opener
        # ATTACHes whose channels are opening, in the order they came, and their channel count.
        self._opening: deque[_Opening] = deque()
        self._opening_channels = 0
        self._waiting: deque[bytes] = deque()  # requests that came while ATTACHes opened
        self._waiting_bytes = 0
        # Counted for `server` stats and metrics, as `conflated` and the flow control's frames.
        self.errors_sent = 0
        self._heard = False  # a message came from the client
        self._queue_frame(hello)

    # --- incoming -----------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Handle one client message. Errors are answered, never raised."""
        self._heard = True
        if self.close_request or self._flow.flooded():
            return
        if self._opening:
            # Requests are answered in the order they came (PROTOCOL.md 2.7): what comes while
            # ATTACHes open their channels waits behind them, together no more than one of the
            # largest messages (a token of 10,000 ids is ~33 KB).
            limits = self.limits
            if (
                len(self._waiting) >= limits.requests_waiting
                or self._waiting_bytes + len(data) > limits.waiting_bytes
            ):
                self.request_close(
                    SLOW,
                    # A close reason holds 123 bytes (RFC 6455): the bounds' names come first.
                    f"stream_requests_waiting ({limits.requests_waiting}) or max_in_bytes "
                    f"({limits.waiting_bytes:,} bytes) of requests behind ATTACHes still opening",
                )
                return
            self._waiting.append(data)
            self._waiting_bytes += len(data)
            return
        self._handle(data)

    def _handle(self, data: bytes) -> None:
        try:
            msg = wire.decode_client_message(data)
        except wire.BadMessage as exc:
            self._error(exc.req, BAD_MESSAGE, str(exc))
            return
        if isinstance(msg, wire.Attach):
            self._attach(msg.req, msg.token, msg.since)
        elif isinstance(msg, wire.Detach):
            self._detach(msg.req, msg.att)
        else:
            self._queue_frame(wire.encode_pong(msg.nonce))

    def receive_text(self) -> None:
        """A text message: the protocol is binary MessagePack only."""
        self._heard = True
        if not self.close_request:
            self._error(
                None,
                BAD_MESSAGE,
                "text messages are not part of the protocol; "
                "send binary MessagePack (PROTOCOL.md section 1)",
            )

    def _attach(self, req: int, token: str, since: tuple[int, ...] | None = None) -> None:
        try:
            claims = self._host.verify_token(token, self.address)
        except TokenError as exc:
            # Only this attachment fails (4401 or 4402): the client re-registers and retries.
            self._error(req, exc.close_code, str(exc))
            return
        attachments = len(self._records) + len(self._opening)
        if attachments >= self.limits.max_attachments:
            self._error(
                req,
                TOO_MANY_CHANNELS,
                f"this connection already has {attachments} attachments, the limit",
            )
            return
        held = self.channel_count + self._opening_channels
        if held + len(claims.ids) > self.limits.max_channels:
            self._error(
                req,
                TOO_MANY_CHANNELS,
                f"attaching {len(claims.ids)} channels would exceed this connection's limit of "
                f"{self.limits.max_channels} (now {held})",
            )
            return
        if since is not None and len(since) != len(claims.ids):
            self._error(
                req,
                BAD_MESSAGE,
                f"ATTACH's since has {len(since)} times for the token's {len(claims.ids)} channels",
            )
            return
        try:
            prepared = self._host.prepare_view(claims, self)
        except AttachRefused as exc:
            self._error(req, exc.code, str(exc))
            return
        self._opening.append(_Opening(req, claims, since, prepared))
        self._opening_channels += len(claims.ids)
        if self._opener is None:
            self.open_pending(self._opening_channels)
        else:
            self._opener(self)

    @property
    def opening(self) -> int:
        """ATTACHes whose channels are opening."""
        return len(self._opening)

    def open_pending(self, limit: int) -> int:
        """Open up to `limit` channels of the ATTACHes waiting, oldest first, answering each
        once all of its are open; how many were opened."""
        opened = 0
        while self._opening and not self.close_request:
            first = self._opening[0]
            try:
                opened += self._host.open_prepared(first.prepared, limit - opened)
            except AttachRefused as exc:
                self._opened()
                self._error(first.req, exc.code, str(exc))
                continue
            if first.prepared.left:
                break  # the turn is over
            self._opened()
            self._attached(first)
        while self._waiting and not self._opening and not self.close_request:
            data = self._waiting.popleft()
            self._waiting_bytes -= len(data)
            self._handle(data)
        return opened

    def _opened(self) -> None:
        first = self._opening.popleft()
        self._opening_channels -= len(first.claims.ids)

    def _attached(self, opening: _Opening) -> None:
        req, claims, since = opening.req, opening.claims, opening.since
        att = self._next_att
        try:
            view = self._host.finish_view(opening.prepared, self, att)
        except AttachRefused as exc:
            self._error(req, exc.code, str(exc))
            return
        self._next_att += 1
        self._records[att] = _Attachment(att, view, claims)
        self.channel_count += len(view.ids)
        self._queue_frame(wire.encode_attached(req, att, view.ids))
        if claims.backfill > 0:
            # The past first, under the send budget, then the snapshot (`_backfill`).
            who = claims.user or claims.address
            self._backfills[att] = view.backfill(
                att, claims.backfill, since, who, self.resume_backfill
            )
            self._backfill()
        else:
            self._queue_snapshot(att, view)

    def _queue_snapshot(self, att: int, view: Source) -> None:
        self._queue_frame(
            wire.encode_snapshot(self._next_seq(), att, view.snapshot_entries(), self.aligned)
        )

    def _backfill(self) -> None:
        """Produce the backfills under way, oldest first, while the queue is under the budget;
        each one done is followed by its snapshot, built in the same call as its last rows, so
        the join has neither a gap nor a duplicate (PROTOCOL.md 2.8, core/backfill.py)."""
        while self._backfills and not self.close_request:
            room = self.limits.send_budget - self.queued_bytes
            if room <= 0:
                return
            att, job = next(iter(self._backfills.items()))
            frames, done = job.fill(room)
            if frames:
                self._flow.extend(frames, sum(len(f) for f in frames))
            if not done:
                return
            del self._backfills[att]
            self._queue_snapshot(att, self._records[att].view)

    def resume_backfill(self) -> None:
        """A backfill waiting for something outside (an archive's answer) can go on."""
        if self._backfills and not self._flow.behind:
            self._backfill()

    def end_attachment(self, att: int, code: int, message: str) -> None:
        """The server ends an attachment on its own (e.g. the rules changed): ERROR naming why,
        then DETACHED, both with req nil; nothing more is sent for `att`.

        A closing connection is left alone: its attachment stays for `close()` to release with
        the others (popping it here first leaked its view and upstream monitors when a rules
        reload ended it in the same housekeeping pass that closed a slow client)."""
        if self.close_request:
            return
        record = self._records.get(att)
        if record is None:
            return
        self._release(record)
        self._error(None, code, message)
        self._queue_frame(wire.encode_detached(None, att))

    def _detach(self, req: int, att: int) -> None:
        record = self._records.get(att)
        if record is None:
            self._error(req, UNKNOWN_ATTACHMENT, f"att {att} is not attached")
            return
        self._release(record)
        self._queue_frame(wire.encode_detached(req, att))

    def close(self) -> None:
        """The connection is gone: the ATTACHes still opening are given up, then every
        attachment is released (`AttachedSession.close`). Idempotent."""
        while self._opening:
            self._host.cancel_view(self._opening.popleft().prepared)
        self._opening_channels = 0
        self._waiting.clear()
        self._waiting_bytes = 0
        super().close()

    def _release(self, record: _Attachment) -> None:
        att, view = record.att, record.view
        del self._records[att]
        self.channel_count -= len(view.ids)
        self._pending.pop(att, None)
        job = self._backfills.pop(att, None)
        if job is not None:
            job.close()
        self._tick_groups = [(a, v) for a, v in self._tick_groups if a != att]
        self._host.close_view(view, self, att)

    def _error(self, req: int | None, code: int, message: str) -> None:
        self.errors_sent += 1
        self._queue_frame(wire.encode_error(req, code, message))

    # --- tick ---------------------------------------------------------------------------------

    def collect(self, att: int, view: Source) -> bool:
        """The hub hands over an emitting view; True if this is the session's first this tick."""
        first = not self._tick_groups
        self._tick_groups.append((att, view))
        return first

    def flush_tick(self) -> None:
        """Queue this tick's DATA, or merge it into the pending changes when behind."""
        groups, self._tick_groups = self._tick_groups, []
        if self._backfills:
            # Held until the backfill is done: its snapshot then carries the current state.
            groups = [(att, v) for att, v in groups if att not in self._backfills]
        if not groups or self.close_request:
            return
        if self._flow.merging():
            for att, view in groups:
                pending = self._pending.setdefault(att, {})
                for sid, mask in view.tick_masks.items():
                    old = pending.get(sid)
                    if old is None:
                        pending[sid] = mask
                    else:
                        pending[sid] = old | mask
                        self.conflated += 1
            return
        entries = [(att, v.tick_entries) for att, v in groups]
        self._queue_frame(wire.encode_data(self._next_seq(), entries, self.aligned))
        self.deliveries += sum(e.length for _, e in entries)

    def _catch_up(self) -> None:
        """One DATA with everything merged while behind, from the channels' current state."""
        groups = []
        for att, pending in self._pending.items():
            if pending:
                groups.append((att, self._records[att].view.entries_for(pending)))
        self._pending.clear()
        if groups:
            self._queue_frame(wire.encode_data(self._next_seq(), groups, self.aligned))
            self.deliveries += sum(e.length for _, e in groups)

    # --- outgoing -----------------------------------------------------------------------------

    def next_frame(self) -> bytes | None:
        """The next message to send, or None. It stays counted as queued until `sent()`."""
        return self._flow.pop()

    def sent(self, nbytes: int) -> None:
        """The writer finished sending a frame of `nbytes`."""
        self._flow.sent(nbytes)
        # A backfill goes on once the writer has drained half the budget (and after the
        # catch-up of a session that was behind), as catch-up does.
        if (
            self._backfills
            and not self._flow.behind
            and self.queued_bytes < self.limits.send_budget // 2
        ):
            self._backfill()

    def _idle(self, now: float) -> None:
        """Once a second, not stalled: close a client that never spoke after its first
        `first_message` seconds (pvwire's clients ATTACH on HELLO), keep an idle one alive."""
        if not self._heard and now - self.connected_at >= self.limits.first_message:
            self.request_close(
                HEARTBEAT_TIMEOUT,
                f"no message within {self.limits.first_message:g} s of HELLO "
                "(stream_first_message_s)",
            )
            return
        if not self.queued_bytes and now - self._flow.last_send >= self.limits.heartbeat:
            self._queue_frame(wire.HEARTBEAT)

    def _queue_frame(self, frame: bytes) -> None:
        self._flow.push(frame)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq
