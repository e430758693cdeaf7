"""The stream's protocol state, without I/O: events in, events and bytes out (PROTOCOL.md).

One :class:`Session` lives as long as the :class:`~pvwire_client.Client`'s stream, across its
connections. The pump around it (``client._Stream``) owns the socket, the timers and the retries:

- it reports what happened: :meth:`Session.connection_made`, :meth:`~Session.receive` (one
  WebSocket message), :meth:`~Session.connection_lost` (the close code received, else sent, else
  1006), :meth:`~Session.connect_failed` and :meth:`~Session.timer` (:meth:`~Session.deadline`
  passed);
- it passes the application's commands: :meth:`~Session.add` (a monitor's token),
  :meth:`~Session.set_token` (a fresh one after :class:`Renew`), :meth:`~Session.remove`,
  :meth:`~Session.ping`;
- it carries out what the session asks: :meth:`~Session.data_to_send` (messages, in order),
  :attr:`~Session.close_request` (close the socket with this code, then report it as lost) and
  :meth:`~Session.next_event` (entries for a monitor, a lost or failed subscription, ...).

Every input takes ``now``, a monotonic time in seconds: the session reads no clock. Entries are
routed, not merged: merging them into channel states is :meth:`ChannelState.merge`, as pure, and
``protocol/cases/`` drive both (tests/test_pyclient_cases.py), as they drive the TypeScript
client's session (clients/ts/src/session.ts), which behaves the same way.

Each subscription moves through the states of :mod:`pvwire_client.subscription` by its one
transition table (REGISTERING, WAITING, ATTACHING, ATTACHED, ABANDONED, CLOSED), as the
TypeScript client's do.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from . import closecodes
from .entry import TIME, VALUE
from .held import Held
from .subscription import Subscription, SubscriptionEvent, SubscriptionState
from .wire import (
    Attached,
    Data,
    Detached,
    Error,
    Hello,
    History,
    Message,
    Pong,
    ProtocolError,
    Snapshot,
    decode_message,
    encode_attach,
    encode_detach,
    encode_ping,
)

__all__ = [
    "Attach",
    "Backfill",
    "Closed",
    "Connected",
    "Entries",
    "Event",
    "Failed",
    "Lost",
    "Malformed",
    "PingAnswered",
    "Renew",
    "ServerError",
    "Session",
]

NS = 1_000_000_000
# The default heartbeat (PROTOCOL.md section 2.1), for the watchdog before HELLO says otherwise.
DEFAULT_HEARTBEAT_MS = 15_000
# ERROR codes of an ATTACH whose token was refused (section 7): register again, once.
_RENEW_CODES = frozenset({closecodes.BAD_TOKEN, closecodes.TOKEN_EXPIRED})
# ERROR codes that say why the server ends an attachment (section 2.3): the DETACHED that
# follows reports them, as the subscription's failure.
_DETACH_REASONS = frozenset({closecodes.BAD_TOKEN, closecodes.TOKEN_EXPIRED, closecodes.FORBIDDEN})


# --- events out -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connected:
    """HELLO arrived: the server answered (a reconnect's backoff starts again from 0)."""

    hello: Hello


@dataclass(frozen=True, slots=True)
class Attach:
    """The server attached ``key``'s token with these channel ids (sid = index)."""

    key: Hashable
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Entries:
    """Entries for ``key``'s channels, validated (``[sid, mask, field...]``, sids in range).

    ``snapshot``: from a SNAPSHOT, whose serials are a new baseline (section 2.5).
    """

    key: Hashable
    raw: tuple[list[Any], ...]
    snapshot: bool


@dataclass(frozen=True, slots=True)
class Backfill:
    """Recorded past of one of ``key``'s channels (``history.sid``, in range), sent after ATTACHED
    and before that attachment's SNAPSHOT when the token asked for ``backfill`` (section 2.8).

    It changes no channel state. Only the rows the client lacks are handed on (a run of them
    per event, in order; :mod:`pvwire_client.held`): a re-attach says per channel after which
    time it lacks rows (the ATTACH's ``since``), and of what comes again (a server that does
    not know ``since``, a bucket that straddles it) the rows it has are dropped.
    """

    key: Hashable
    history: History


@dataclass(frozen=True, slots=True)
class Lost:
    """The connection is gone and a reconnect follows: CONNECTED channels show DISCONNECTED with
    ``reason`` until the snapshots after the re-attach (section 8)."""

    reason: str


FailureKind: TypeAlias = Literal["refused", "ended", "closed", "mismatch"]


@dataclass(frozen=True, slots=True)
class Failed:
    """``key``'s subscription ended for good; the others go on (unless they fail too).

    ``kind``: ``refused`` (ERROR answering its ATTACH, ``code`` the ERROR's), ``ended`` (the
    server's DETACHED; ``code`` the ERROR that came just before, else None), ``closed`` (a
    terminal close code, or a HELLO of another version: 4406), ``mismatch`` (ATTACHED named
    channels other than the token's).
    """

    key: Hashable
    kind: FailureKind
    code: int | None
    message: str


@dataclass(frozen=True, slots=True)
class Renew:
    """``key``'s token is expired or was refused once: register again, then :meth:`set_token`."""

    key: Hashable


@dataclass(frozen=True, slots=True)
class PingAnswered:
    """The PONG for ``nonce``, ``rtt`` seconds after its PING (None: failed, with ``error``)."""

    nonce: int | str
    rtt: float | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ServerError:
    """An ERROR that concerns no subscription: report it (log, error event), nothing ends."""

    code: int
    message: str


@dataclass(frozen=True, slots=True)
class Malformed:
    """A message broke the protocol (section 1): the session closes with 1002 and reconnects."""

    message: str


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection ended; ``reconnect``: retry with backoff while subscriptions remain.
    ``within``: the server is draining (4012 after its HELLO): reconnect at once, after a delay
    drawn from 0 to ``within`` seconds, without backoff, the retries counted from 0 again."""

    code: int
    reason: str
    reconnect: bool
    within: float | None = None


# Section 8: a 4012 DRAINING close's reason is `reconnect within N ms`; a reason without it, 1 s.
_DRAIN_REASON = re.compile(r"within (\d{1,9}) ms")
DRAIN_WITHIN_DEFAULT_S = 1.0


def drain_within(reason: str) -> float:
    """Seconds a 4012 DRAINING close with ``reason`` asks to spread the reconnect over."""
    found = _DRAIN_REASON.search(reason)
    return int(found.group(1)) / 1000 if found else DRAIN_WITHIN_DEFAULT_S


Event: TypeAlias = (
    Connected | Attach | Entries | Backfill | Lost | Failed | Renew | PingAnswered | ServerError
    | Malformed | Closed
)  # fmt: skip


# --- the session --------------------------------------------------------------------------------


# Called at every subscription transition with (key, state, event, next state): tests, logs.
TransitionHook: TypeAlias = Callable[
    [Hashable, SubscriptionState, SubscriptionEvent, SubscriptionState], None
]


class Session:
    """The client side of the stream protocol for any number of subscriptions (keys)."""

    def __init__(
        self,
        *,
        request_timeout: float = 30.0,
        watchdog: float | None = None,
        reconnect: bool = True,
        on_transition: TransitionHook | None = None,
    ) -> None:
        self.request_timeout = request_timeout  # section 2.7
        self._watchdog_override = watchdog  # else 2 x heartbeat + 1 s (section 2.1)
        self._reconnect = reconnect
        self.on_transition = on_transition
        self._subs: dict[Hashable, Subscription] = {}  # REGISTERING to ATTACHED
        self._by_att: dict[int, Subscription] = {}  # ATTACHED
        # Requests sent on this connection and not answered yet: req -> (what, sub, sent at);
        # an ATTACH's sub is ATTACHING, or ABANDONED when removed since.
        self._requests: dict[int, tuple[str, Subscription | None, float]] = {}
        self._pings: dict[int | str, float] = {}
        self._events: collections.deque[Event] = collections.deque()
        self._out: list[bytes] = []
        self._next_req = 1
        self._seq = 0
        self._open = False  # a socket is open (HELLO or not)
        self.hello: Hello | None = None
        self._last_rx = 0.0
        self._notice: Error | None = None
        self.close_request: tuple[int, str] | None = None
        self._terminal = False  # the close requested ends the session (a HELLO of another version)

    # --- outputs ----------------------------------------------------------------------------

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def data_to_send(self) -> list[bytes]:
        out, self._out = self._out, []
        return out

    def deadline(self) -> float | None:
        """When :meth:`timer` must be called, if nothing arrives before: the watchdog, or the
        time-out of the oldest request without an answer."""
        if not self._open or self.close_request is not None:
            return None
        at = self._last_rx + self._watchdog()
        if self._requests or self._pings:
            oldest = min([r[2] for r in self._requests.values()] + list(self._pings.values()))
            at = min(at, oldest + self.request_timeout)
        return at

    @property
    def ready(self) -> bool:
        """A connection is open and its HELLO arrived: ATTACH goes out at once."""
        return self._open and self.hello is not None and self.close_request is None

    def __contains__(self, key: Hashable) -> bool:
        return key in self._subs

    def __len__(self) -> int:
        return len(self._subs)

    def state(self, key: Hashable) -> SubscriptionState | None:
        """``key``'s state; None once it is removed or ended (CLOSED), or was never added."""
        sub = self._subs.get(key)
        return sub.state if sub is not None else None

    # --- commands -----------------------------------------------------------------------------

    def add(
        self,
        key: Hashable,
        token: str | None,
        ids: tuple[str, ...] | None = None,
        *,
        expires_at: float | None = None,
        renewable: bool = True,
        backfill: bool = False,
        now: float = 0.0,
    ) -> None:
        """A subscription: attach ``token`` now if connected, else after the next HELLO.

        ``ids``: the token's channels as the registration named them; an ATTACHED naming others
        ends the subscription (``mismatch``). ``expires_at``: a token expiring within 1 s is not
        attached: :class:`Renew` asks for a fresh one first (section 7). ``backfill``: the token
        asked for it; a re-attach then says which rows it holds (section 2.8).
        """
        if key in self._subs:
            raise ValueError(f"subscription {key!r} already added")
        sub = Subscription(key, ids, expires_at, renewable, backfill)
        if token is not None:
            self._move(sub, "token", token=token)
        self._subs[key] = sub
        self._attach(sub, now)

    def set_token(
        self,
        key: Hashable,
        token: str,
        ids: tuple[str, ...] | None = None,
        *,
        expires_at: float | None = None,
        now: float = 0.0,
    ) -> None:
        """A fresh token for ``key`` (after :class:`Renew`): attach it when connected. Only a
        subscription in REGISTERING takes one (:class:`TransitionError` otherwise)."""
        sub = self._subs.get(key)
        if sub is None:
            return
        self._move(sub, "token", token=token)
        sub.expires_at = expires_at
        if ids is not None:
            if ids != sub.ids:
                sub.held = None  # other channels: what it holds says nothing of them
            sub.ids = ids
        self._attach(sub, now)

    def remove(self, key: Hashable, now: float = 0.0) -> None:
        """End a subscription: DETACH it if attached (its entries are dropped from now on); one
        still attaching is detached when its ATTACHED comes."""
        sub = self._subs.get(key)
        if sub is None:
            return
        att = sub.att
        self._move(sub, "remove")
        del self._subs[key]
        if att is not None:
            self._by_att.pop(att, None)
            self._request("detach", None, encode_detach(self._next_req, att), now)

    def ping(self, nonce: int | str, now: float) -> bool:
        """Send PING (section 2.6); False when not connected. :class:`PingAnswered` follows."""
        if not self.ready or nonce in self._pings:
            return False
        self._pings[nonce] = now
        self._out.append(encode_ping(nonce))
        return True

    # --- the connection -----------------------------------------------------------------------

    def connection_made(self, now: float) -> None:
        """A socket is open; HELLO is expected first."""
        self._open, self.hello, self._seq = True, None, 0
        self._last_rx = now
        self.close_request, self._terminal, self._notice = None, False, None

    def receive(self, data: bytes | bytearray | str, now: float) -> None:
        """One WebSocket message (a str is a text message, which the protocol forbids)."""
        if not self._open or self.close_request is not None:
            return  # after a close request nothing more is applied
        self._last_rx = now
        try:
            if isinstance(data, str):
                raise ProtocolError("text WebSocket message (the stream is binary MessagePack)")
            msg = decode_message(data)
            self._dispatch(msg, now)
        except ProtocolError as e:
            # Section 1: this connection's state may be wrong; close with 1002 and reconnect:
            # the snapshots restore the state.
            self._events.append(Malformed(str(e)))
            self._close(closecodes.PROTOCOL_ERROR, str(e))

    def timer(self, now: float) -> None:
        """The deadline passed: a silent server or an unanswered request means a dead connection
        (sections 2.1, 2.7): close with 4000 and reconnect."""
        if not self._open or self.close_request is not None:
            return
        for req, (_, _, at) in self._requests.items():
            if now - at >= self.request_timeout:
                why = f"no answer to request {req} within {self.request_timeout:g} s"
                return self._close(closecodes.HEARTBEAT_TIMEOUT, why)
        for nonce, at in self._pings.items():
            if now - at >= self.request_timeout:
                why = f"no answer to PING {nonce!r} within {self.request_timeout:g} s"
                return self._close(closecodes.HEARTBEAT_TIMEOUT, why)
        if now - self._last_rx >= self._watchdog():
            self._close(closecodes.HEARTBEAT_TIMEOUT, f"no message for {self._watchdog():g} s")

    def connection_lost(self, code: int, reason: str) -> None:
        """The socket is closed: ``code`` received, else the one this side sent, else 1006."""
        if not self._open:
            return
        local, terminal = self.close_request is not None, self._terminal
        # A drain after HELLO sends the client elsewhere at once; one before it (not pvwire's)
        # keeps the backoff, as any refusal before HELLO does.
        drained = code == closecodes.DRAINING and not local and self.hello is not None
        self._end_connection(f"connection closed: {code} {closecodes.name(code)}")
        # A close this side asked for (1002, 4000) reconnects whatever its class; a close
        # concerns every subscription (refused tokens are answered per attachment, ERROR).
        reconnect = not terminal and self._reconnect and (local or closecodes.is_reconnect(code))
        within = drain_within(reason) if drained and reconnect and self._subs else None
        self._events.append(Closed(code, reason, reconnect and bool(self._subs), within))
        if terminal:
            return
        if reconnect:
            suffix = f" ({reason})" if reason else ""
            self._events.append(Lost(f"stream closed: {code} {closecodes.name(code)}{suffix}"))
        else:
            for sub in list(self._subs.values()):
                self._fail(sub, "closed", code, reason)

    def connect_failed(self, reason: str) -> None:
        """No connection could be opened (refused, unreachable, handshake failed): retry."""
        reconnect = self._reconnect and bool(self._subs)
        self._events.append(Closed(closecodes.ABNORMAL, reason, reconnect))
        self._events.append(Lost(f"cannot connect: {reason}"))

    # --- internals ----------------------------------------------------------------------------

    def _watchdog(self) -> float:
        if self._watchdog_override is not None:
            return self._watchdog_override
        heartbeat = self.hello.heartbeat_ms if self.hello is not None else DEFAULT_HEARTBEAT_MS
        return 2 * heartbeat / 1000 + 1

    def _close(self, code: int, reason: str) -> None:
        if self.close_request is None:
            self.close_request = (code, reason)

    def _end_connection(self, why: str) -> None:
        self._open = False
        self.hello = None
        for nonce in self._pings:
            self._events.append(PingAnswered(nonce, None, f"{why} before the PONG"))
        self._pings.clear()
        for _, sub_asked, _ in self._requests.values():
            if sub_asked is not None and sub_asked.state is SubscriptionState.ABANDONED:
                self._move(sub_asked, "lost")  # its ATTACH will have no answer
        self._requests.clear()
        self._by_att.clear()
        for sub in self._subs.values():
            self._move(sub, "lost")

    def _move(
        self,
        sub: Subscription,
        event: SubscriptionEvent,
        *,
        token: str | None = None,
        att: int | None = None,
    ) -> None:
        before = sub.state
        sub.move(event, token=token, att=att)
        if self.on_transition is not None:
            self.on_transition(sub.key, before, event, sub.state)

    def _attach(self, sub: Subscription, now: float) -> None:
        if not self.ready or sub.state is not SubscriptionState.WAITING:
            return  # attached or attaching already, a fresh token on its way, or no HELLO yet
        if sub.renewable and sub.expires_at is not None and sub.expires_at < now + 1:
            self._move(sub, "expiring")
            self._events.append(Renew(sub.key))
            return
        assert sub.token is not None  # held in WAITING
        since = sub.held.since() if sub.held is not None else None
        self._request("attach", sub, encode_attach(self._next_req, sub.token, since), now)
        self._move(sub, "attach")

    def _request(self, what: str, sub: Subscription | None, data: bytes, now: float) -> None:
        if not self.ready:
            return  # the connection is gone: nothing to ask of it
        self._requests[self._next_req] = (what, sub, now)
        self._next_req += 1
        self._out.append(data)

    def _fail(self, sub: Subscription, kind: FailureKind, code: int | None, message: str) -> None:
        att = sub.att
        self._move(sub, kind)  # each kind of failure is the event that closes it
        del self._subs[sub.key]
        if att is not None:
            self._by_att.pop(att, None)
        self._events.append(Failed(sub.key, kind, code, message))

    def _check_seq(self, seq: int) -> None:
        if seq != self._seq + 1:
            raise ProtocolError(f"sequence gap: expected {self._seq + 1}, got {seq}")
        self._seq = seq

    def _entries(self, att: int, raw: tuple[list[Any], ...], snapshot: bool) -> None:
        sub = self._by_att.get(att)
        if sub is None:
            return  # an attachment this client detached, or never had (section 1)
        for e in raw:
            if e[0] >= sub.count:
                raise ProtocolError(f"entry sid {e[0]} out of range for {sub.count} channels")
        held = sub.held
        if held is not None:
            for e in raw:
                mask = e[1]
                t = None
                if mask & TIME:
                    at = 4 if mask & VALUE else 2  # TIME follows VALUE's two fields
                    t = e[at] * NS + e[at + 1]
                    held.entry(e[0], t)
                if snapshot:
                    held.snapshot(e[0], t)
        self._events.append(Entries(sub.key, raw, snapshot))

    def _history(self, msg: History) -> None:
        # No seq (section 2.8): a HISTORY is not counted, so a gap check never sees it.
        sub = self._by_att.get(msg.att)
        if sub is None:
            return  # an attachment this client detached, or never had (section 1)
        if msg.sid >= sub.count:
            raise ProtocolError(f"HISTORY sid {msg.sid} out of range for {sub.count} channels")
        if sub.held is None:
            self._events.append(Backfill(sub.key, msg))
            return
        runs = sub.held.history(
            msg.sid, msg.t.tolist(), msg.gap.tolist(), msg.status.tolist(), msg.resolution
        )
        for start, stop in runs:
            self._events.append(Backfill(sub.key, msg.rows(start, stop)))

    def _dispatch(self, msg: Message, now: float) -> None:
        notice, self._notice = self._notice, None
        if self.hello is None:
            if not isinstance(msg, Hello):
                raise ProtocolError(f"first message must be HELLO, got {type(msg).__name__}")
            if msg.version != 1:
                # Section 2.1: reconnecting would meet the same server; end the session.
                why = f"server speaks protocol version {msg.version}, not 1"
                self._close(closecodes.NORMAL, "unsupported protocol version")
                self._terminal = True
                for sub in list(self._subs.values()):
                    self._fail(sub, "closed", closecodes.UNSUPPORTED, why)
                return
            self.hello = msg
            self._events.append(Connected(msg))
            for sub in list(self._subs.values()):
                self._attach(sub, now)
        elif isinstance(msg, Data):
            self._check_seq(msg.seq)
            for g in msg.groups:
                self._entries(g.att, g.raw, False)
        elif isinstance(msg, Snapshot):
            self._check_seq(msg.seq)
            self._entries(msg.att, msg.raw, True)
        elif isinstance(msg, History):
            self._history(msg)
        elif isinstance(msg, Attached):
            self._attached(msg, now)
        elif isinstance(msg, Detached):
            if msg.req is not None:
                self._requests.pop(msg.req, None)
                return  # the answer to this client's DETACH
            ended = self._by_att.get(msg.att)
            if ended is not None:
                # The server ended it on its own and said why just before (section 2.3).
                if notice is not None:
                    self._fail(ended, "ended", notice.code, notice.message)
                else:
                    self._fail(ended, "ended", None, "the server ended the subscription")
        elif isinstance(msg, Error):
            self._error(msg)
        elif isinstance(msg, Pong):
            at = self._pings.pop(msg.nonce, None)
            if at is not None:
                self._events.append(PingAnswered(msg.nonce, now - at))
        # HEARTBEAT only feeds the watchdog; unknown kinds are ignored (section 1); a second
        # HELLO is not in the protocol's grammar, but harmless: ignored too.

    def _attached(self, msg: Attached, now: float) -> None:
        request = self._requests.pop(msg.req, None)
        if request is None or request[0] != "attach":
            raise ProtocolError(f"ATTACHED answers req {msg.req}, which is no ATTACH sent")
        sub = request[1]
        assert sub is not None
        if sub.state is SubscriptionState.ABANDONED:  # removed while attaching
            self._move(sub, "attached")
            self._request("detach", None, encode_detach(self._next_req, msg.att), now)
            return
        if sub.ids is not None and msg.ids != sub.ids:
            # The server's channels are not the ones the token was registered for: values would
            # show under the wrong names. This subscription alone ends (re-attaching would meet
            # the same answer); the server is told to stop sending it.
            self._request("detach", None, encode_detach(self._next_req, msg.att), now)
            why = f"ATTACHED ids {list(msg.ids)} differ from the token's {list(sub.ids)}"
            self._fail(sub, "mismatch", None, why)
            return
        self._move(sub, "attached", att=msg.att)
        sub.count, sub.renewed = len(msg.ids), False
        if sub.backfill:
            if sub.held is None or len(sub.held) != sub.count:
                sub.held = Held(sub.count)
            sub.held.attached()
        self._by_att[msg.att] = sub
        self._events.append(Attach(sub.key, msg.ids))

    def _error(self, msg: Error) -> None:
        request = self._requests.pop(msg.req, None) if msg.req is not None else None
        what, sub = (request[0], request[1]) if request is not None else ("", None)
        if what == "attach":
            assert sub is not None
            if sub.state is SubscriptionState.ABANDONED:  # removed while attaching
                self._move(sub, "refused")
                return
            if msg.code in _RENEW_CODES and sub.renewable and not sub.renewed:
                # Expired, or signed with a key the server no longer has (a restart without a
                # shared key): register again, once (section 6).
                self._move(sub, "renew")
                sub.renewed = True
                self._events.append(Renew(sub.key))
            else:
                self._fail(sub, "refused", msg.code, msg.message)
        elif what == "detach" and msg.code == closecodes.UNKNOWN_ATTACHMENT:
            pass  # the server ended it just before: it is gone already (section 2.3)
        elif msg.req is None and msg.code in _DETACH_REASONS:
            # Says why the DETACHED that follows ends an attachment: reported with it.
            self._notice = msg
        else:
            self._events.append(ServerError(msg.code, msg.message))
