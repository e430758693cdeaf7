"""The pvws protocol (ornl-epics/pvws) for one client connection, with no I/O.

pvws is JSON over a WebSocket at `/pvws/pv`: the client sends `subscribe` (alias `monitor`),
`clear`, `list`, `write`, `ping`, `echo` (messages.py); the server sends `update` messages as
pvws's `Vtype2Json` writes them (encoder.py), `list` and `error`. Web UIs that speak it today
(cs-web-lib, dbwr, pvws.js) work unchanged.

Engine (the same as `/stream`, DESIGN.md section 7a): each PV a client subscribes to is one
attachment of a one-channel view shared with every other client of that channel, driven by the
tick. The JSON of a channel's state is made once (`PvwsEncoder`) and the same string is queued
for every client that needs it; what the session keeps per PV is what that client was sent
(`pv.py`). Flow control is `/stream`'s: past `send_budget` queued the session merges (latest
state per PV; a PV opened then gets its first value with the catch-up), and a queue that
makes no progress for `stall_timeout` closes the connection with 4008.

Differences from pvws, on purpose: a severity change is sent for every type (pvws drops it for
arrays and for a value whose type changed, e.g. after a disconnect); metadata is sent again when
it changes (pvws sends it only once); a refused subscription or a bad PV name is answered with an
`error` message (pvws only logs it), and so is a PV whose channel fails (pvws shows it as
disconnected only), to clients that read errors (`may_read_errors`: not to
Grafana's, which takes every message for data); updates are not throttled unless PV_THROTTLE_MS /
PV_ARRAY_THROTTLE_MS say so. docs/PVWS.md has the whole comparison, message by message and type
by type (`TYPES`).
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from ..limits import integer
from ..model import VALUE, ConnState
from ..wire.attached import AttachedSession
from ..wire.session import SessionLimits
from .encoder import (
    UNDEFINED,
    ChannelState,
    PvwsEncoder,
    connected,
    failure,
    json_text,
    severity_name,
)
from .frames import read_text_frame, text_frames, utf8_size
from .messages import BadMessage, Ping, Write, may_read_errors, parse, pv_names, shorten, write_of
from .pv import Opened, Pv, PvSource, PvTable, PvwsRefused

__all__ = ["MAX_HELD_ERRORS", "WRITE_BATCH", "PvwsHost", "PvwsSession", "Splicer", "about"]

log = logging.getLogger("pvwire.pvws")

# Errors kept for a client not yet known to read them (then dropped).
MAX_HELD_ERRORS = integer("pvws_max_held_errors")
# Most bytes of messages joined into one socket write (`next_frames`); caproto batches up to
# 64 KiB too. A tick of 200 changed PVs is ~30 KB of JSON.
WRITE_BATCH = 64 * 1024
_CONNECTED = ConnState.CONNECTED
# A reason that opens with a channel id (sim's and loc's do: `sim://x: ...`) names it already.
_NAMED = re.compile(r"[a-z][a-z0-9+.-]*://\S*: ")


def about(name: str, why: str) -> str:
    """`why` with `name` before it once: an id the reason opens with gives way to `name`, the
    PV as the client asked for it."""
    if why.startswith(f"{name}: "):  # an id with spaces (`loc://x("a b")`) too
        return why
    named = _NAMED.match(why)
    return f"{name}: {why[named.end() if named else 0 :]}"


class Splicer(Protocol):
    """What makes a tick's frames of one client (core/fanout.py's, bound to `Pv`, the hub's
    channels and the encoder's `Entry` by the endpoint): `_splice`, compiled."""

    def splice(
        self,
        atts: list[int],
        records: Mapping[int, Pv],
        paced: bool,
        slow: Callable[[int], bytes | str | None],
    ) -> tuple[bytes, int]: ...


class PvwsHost(Protocol):
    def open(self, name: str, session: PvwsSession, att: int, array: bool) -> Opened: ...
    def close(self, view: PvSource, session: PvwsSession, att: int) -> None: ...


class PvwsSession(AttachedSession[bytes, Pv]):
    endpoint = "pvws"
    # The atts of this tick's changes, which the compiled tick appends to (core/fanout.py).
    __slots__ = ("collected",)

    def __init__(
        self,
        number: int,
        address: str,
        host: PvwsHost,
        encoder: PvwsEncoder,
        limits: SessionLimits,
        wake: Callable[[], None],
        rates: tuple[float, float] = (0.0, 0.0),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_per_subscribe: int = integer("max_channels_per_subscription"),
        opener: Callable[[PvwsSession], None] | None = None,
        image_bytes_per_s: float = 0.0,
        splicer: Splicer | None = None,
    ) -> None:
        super().__init__(number, address, limits, wake, clock)
        self.id = str(number)  # pvws's socket id, as /pvws/socket lists it
        self.rates = rates  # (scalar, array) maxRate in Hz; 0 = every tick
        self._host = host
        self._encoder = encoder
        self._wall = wall
        self.created_ms = round(wall() * 1000)
        self.last_client_message_ms = self.created_ms
        self.client_messages = 0  # every message received, read or refused (admin pages)
        self.last_message_sent_ms = 0
        self.pvs = PvTable(self._records)  # by name in subscription order, and by att
        self.max_per_subscribe = max_per_subscribe
        # Names subscribed but not opened yet, in order. Opening costs a resolve and a view per
        # name: `opener` is told there are some and opens them a few per event-loop pass
        # (`open_pending`), so a subscribe of thousands holds nobody; None opens them at once.
        self._opening: dict[str, None] = {}
        self._opener = opener
        # What is queued is WebSocket frames, each item one or more messages (`_counts`, in
        # step); `next_text` gives them a message at a time (`_reading`: the item it reads).
        self._counts: deque[int] = deque()
        self._reading = b""
        self._read_at = 0
        self._popped = 0  # bytes of the frame `next_text` gave last
        # Images cost what a client can use: their frames are paced to `image_bytes_per_s`.
        # Each frame sent is owed by its PV, in bytes; the connection pays at that rate, shared
        # by the PVs that owe (the smallest debts first, the rest alike), so a small image
        # beside a camera is not held by the camera's debt. A PV's next frame goes once its
        # own is paid and the connection owes less than a second's budget: within the budget
        # nothing is held. A frame that must wait is held, and newer ones replace it.
        self.image_bytes_per_s = image_bytes_per_s
        self._image_at = clock()
        self._owed: dict[int, float] = {}  # att -> bytes its PV still owes
        self._owed_total = 0.0
        self._images_waiting: dict[int, None] = {}  # atts of images held back, oldest first
        self.images_held = 0  # image frames replaced while held back (never sent)
        self._pending: dict[int, None] = {}  # atts changed while behind
        self.collected: list[int] = []
        self._splicer = splicer  # None: `_splice`, in Python
        self._images: list[int] = []  # images of the updates being queued (`_one`)
        self._reopen: list[Pv] = []
        self.bad_messages = 0
        self._messages = 0  # valid client messages received
        self.reads_errors = False  # see _may_read_errors
        self._held: list[str] = []  # errors kept until the client shows it reads them
        self.errors_dropped = 0  # errors never sent: past MAX_HELD_ERRORS while held
        self._writing = (0, 0)  # messages and characters of the frames being written

    @property
    def channel_count(self) -> int:
        """PVs opened: each holds one upstream channel."""
        return len(self.pvs)

    # --- incoming -----------------------------------------------------------------------------

    def receive(self, text: str) -> list[Ping | Write]:
        """Handle one client message; returns what the endpoint must do (pings, writes)."""
        self.last_client_message_ms = round(self._wall() * 1000)
        self.client_messages += 1
        if self.close_request or self._flow.flooded():
            return []
        try:
            return self._handle(text)
        except BadMessage as exc:
            # pvws logs and answers nothing; logged once per connection, counted always, so a
            # client repeating a bad message cannot flood the log.
            self.bad_messages += 1
            if self.bad_messages == 1:
                log.warning("pvws client %s (%s): %s", self.id, self.address, exc)
            return []

    def _handle(self, text: str) -> list[Ping | Write]:
        kind, msg = parse(text)
        self._messages += 1
        if not self.reads_errors and may_read_errors(self._messages, kind, msg):
            self.reads_errors = True
            held, self._held = self._held, []
            for error in held:
                self._queue_text(error)
        if kind in ("subscribe", "monitor"):
            self._subscribe_all(pv_names(msg, text))
        elif kind == "clear":
            for name in pv_names(msg, text):
                pv = self.pvs.get(name)
                if pv is not None:
                    self._release(pv)
                self._opening.pop(name, None)
        elif kind == "list":
            self._queue_text(json_text({"type": "list", "pvs": [*self.pvs, *self._opening]}))
        elif kind == "write":
            write = write_of(msg, text)
            name = write.pv
            if name in self._opening:
                # Opened now (one name): a write goes to a PV the access rules let it open, and
                # one that cannot open is answered as unknown, as if it had been opened first.
                del self._opening[name]
                self._subscribe(name)
            if name not in self.pvs:
                self.write_failed(f"Cannot write unknown PV {name}")
                return []
            return [write]
        elif kind == "ping":
            return [Ping()]
        elif kind == "echo":
            self._queue_text(text)
        else:
            raise BadMessage(f"Unknown message type: {shorten(text)}")
        return []

    def _subscribe_all(self, names: list[str]) -> None:
        if len(names) > self.max_per_subscribe:
            # As GraphQL's `subscribe` refuses more ids: the names are what the client asks,
            # refused whole before any work, and the PVs already held go on.
            self.write_failed(
                f"Cannot subscribe to {len(names):,} PVs in one message: the most is "
                f"{self.max_per_subscribe:,} (max_channels_per_subscription)"
            )
            return
        for name in names:
            if name in self.pvs or name in self._opening:
                continue
            held = self.channel_count + len(self._opening)
            if held >= self.limits.max_channels:
                # Each PV holds an upstream channel: without a bound one connection could open
                # them until the server runs out of memory, for every other client too.
                self.write_failed(
                    f"Cannot subscribe to {name}: this connection holds {held:,} PVs, "
                    "the most one may (max_channels_per_connection)"
                )
                continue
            self._opening[name] = None
        if not self._opening:
            return
        if self._opener is None:
            self.open_pending(len(self._opening))
        else:
            self._opener(self)

    @property
    def opening(self) -> int:
        """Names subscribed and not opened yet."""
        return len(self._opening)

    def open_pending(self, limit: int) -> int:
        """Open up to `limit` of the names waiting, in subscription order; how many were
        tried. Each is answered as it opens (its value if the channel has one, or an error)."""
        tried = 0
        while self._opening and tried < limit and not self.close_request:
            name = next(iter(self._opening))
            del self._opening[name]
            tried += 1
            self._subscribe(name)
        return tried

    def _subscribe(self, name: str) -> None:
        att = self._next_att
        try:
            opened = self._host.open(name, self, att, False)
        except PvwsRefused as exc:
            self.write_failed(f"Cannot subscribe to {about(name, str(exc))}")
            return
        self._next_att += 1
        pv = Pv(name, att, opened)
        self.pvs.add(pv)
        pv.entry = self._encoder.acquire(name)
        # What the channel already holds goes out now (a client joining a watched channel must
        # not wait for its next change), within the send budget as a tick's changes: past it
        # the first value goes with the catch-up, so subscribing costs no more than reading.
        if self._flow.merging():
            self._pending[att] = None
        else:
            self._send_updates((att,))

    def _release(self, pv: Pv) -> None:
        self.pvs.remove(pv)
        self._images_waiting.pop(pv.att, None)
        self._owed_total -= self._owed.pop(pv.att, 0.0)
        self._pending.pop(pv.att, None)
        self._encoder.release(pv.name)
        self._host.close(pv.view, self, pv.att)

    def write_failed(self, message: str) -> None:
        """An `error` message, or held back while the client may not read errors."""
        text = json_text({"type": "error", "message": message})
        if self.reads_errors:
            self._queue_text(text)
        elif len(self._held) < MAX_HELD_ERRORS:
            self._held.append(text)
        else:
            self.errors_dropped += 1

    def end_attachment(self, att: int, code: int, message: str) -> None:
        """The server ends one PV (the rules changed): an error names why."""
        pv = self.pvs.by_att.get(att)
        if pv is None or self.close_request:
            return
        self._release(pv)
        self.write_failed(about(pv.name, message))

    # --- the tick -----------------------------------------------------------------------------

    def collect(self, att: int, view: object) -> bool:
        first = not self.collected
        self.collected.append(att)
        return first

    def flush_tick(self) -> None:
        atts, self.collected = self.collected, []
        if self.close_request:
            return
        if self._flow.merging():
            pending = self._pending
            for att in atts:
                if att in pending:
                    self.conflated += 1
                pending[att] = None
        else:
            self._send_updates(atts)
        if self._reopen:
            self._reopen_arrays()

    def _send_updates(self, atts: Sequence[int]) -> None:
        """Queue the updates of `atts`, all at once (one wake-up of the writer per tick), as
        WebSocket frames.

        Per update and client this is the whole cost of a pvws client beside `/stream`'s: the
        common case (a new value of a PV already shown, nothing else changed) copies the frame
        its channel's state was encoded into once, compiled where built (core/fanout.py); the
        rest, and everything without it, is `_one`."""
        images = self._images = []
        splicer = self._splicer
        if splicer is not None:
            listed = atts if isinstance(atts, list) else list(atts)
            paced = self.image_bytes_per_s > 0
            data, count = splicer.splice(listed, self.pvs.by_att, paced, self._one)
        else:
            data, count = self._splice(atts)
        if images or self._images_waiting:
            texts = self._paced(images)
            if texts:
                data += text_frames(texts)
                count += len(texts)
        if count:
            self._push(data, count)
            self.deliveries += count

    def _splice(self, atts: Sequence[int]) -> tuple[bytes, int]:
        """What the compiled splice makes of `atts`, in Python: their frames and how many."""
        parts: list[bytes] = []
        for att in atts:
            got = self._one(att)
            if got is not None:
                parts.append(got if isinstance(got, bytes) else text_frames((got,)))
        return b"".join(parts), len(parts)

    def _one(self, att: int) -> bytes | str | None:
        """The update of `att` now: its plain value's shared frame, another text, or None (none
        to send, or an image left to `_paced`). The checks before the plain value compare
        fields without building anything; core/_fanout.c makes the same ones."""
        pv = self.pvs.by_att.get(att)
        if pv is None:
            return None
        ch = pv.ch
        paced = self.image_bytes_per_s > 0
        if pv.image and paced:
            self._images.append(att)
            return None
        if (
            pv.shown
            and ch.meta is pv.meta
            and ch.severity == pv.level
            and ch.state == _CONNECTED
            and not ch.fault
            and ch.known & VALUE
        ):
            # Connected (shown implies a value), same metadata (so same readonly), same
            # severity: the value alone, which another client may have had made already.
            return self._encoder.value_frame(pv.name, ch)
        if paced and _is_image(ch):
            # An image's first frame (or one after a type change): paced as the next ones.
            self._images.append(att)
            return None
        return self._update(pv)

    def _paced(self, atts: list[int]) -> list[str]:
        """The updates of the images `atts` and of those held before, oldest first, that the
        image budget lets out now; the others are held (their newest state goes later)."""
        held = self._images_waiting
        for att in atts:
            if att in held:
                self.images_held += 1  # a held frame replaced by a newer one: never sent
            held[att] = None
        self._pay()
        owed, cap = self._owed, self.image_bytes_per_s  # a second's budget
        out: list[str] = []
        gone: list[int] = []
        by_att = self.pvs.by_att
        for att in held:  # dict order: held longest first, so every image gets its turn
            if self._owed_total >= cap:
                break
            if att in owed:
                continue
            gone.append(att)
            pv = by_att.get(att)
            text = self._update(pv) if pv is not None else None
            if text is not None:
                size = utf8_size(text)
                owed[att] = size
                self._owed_total += size
                out.append(text)
        for att in gone:
            del held[att]
        return out

    def _pay(self) -> None:
        """Pay the images' debts for the time since the last payment, at `image_bytes_per_s`:
        the smallest first, the rest alike (what a PV owes past its share waits)."""
        now = self._clock()
        budget = (now - self._image_at) * self.image_bytes_per_s
        self._image_at = now
        owed = self._owed
        if not owed or budget <= 0.0:
            return
        if budget >= self._owed_total:
            owed.clear()
            self._owed_total = 0.0
            return
        left = len(owed)
        for att, debt in sorted(owed.items(), key=_debt):
            share = budget / left
            left -= 1
            if debt <= share:
                del owed[att]
                budget -= debt
            else:
                owed[att] = debt - share
                budget -= share
        self._owed_total = sum(owed.values())

    def _update(self, pv: Pv) -> str | None:
        """The text this client needs for `pv`'s channel now, or None; records what it sent."""
        ch = pv.ch
        if not connected(ch):
            why = failure(ch)
            if why != pv.failure:
                # pvws shows a failed PV only as disconnected; its reason, once per failure,
                # tells the page's user what to fix (cs-web-lib shows errors as toasts).
                pv.failure = why
                if why:
                    self.write_failed(about(pv.name, why))
            if not pv.shown:
                return None  # pvws sends nothing for a PV that never connected
            pv.shown = False
            pv.severity = UNDEFINED
            pv.level = -1
            return self._encoder.text(pv.name, ch, False, True, None)
        pv.failure = ""
        meta = ch.meta
        with_meta = pv.meta is not meta
        severity = severity_name(ch.severity)
        with_severity = with_meta or severity != pv.severity
        readonly = not (pv.writes and meta.writable is not False)
        show_readonly = readonly if readonly is not pv.readonly else None
        arrays_differ = self.rates[1] != self.rates[0]
        if with_meta and not pv.array and arrays_differ and isinstance(ch.value, np.ndarray):
            self._reopen.append(pv)  # pvws re-subscribes an array at the array rate
        if with_meta:
            pv.image = _is_image(ch)
        pv.shown = True
        pv.meta = meta
        pv.severity = severity
        pv.level = ch.severity
        pv.readonly = readonly
        return self._encoder.text(pv.name, ch, with_meta, with_severity, show_readonly)

    def _reopen_arrays(self) -> None:
        todo, self._reopen = self._reopen, []
        for pv in todo:
            if self.pvs.get(pv.name) is not pv:
                continue
            try:
                opened = self._host.open(pv.name, self, pv.att, True)
            except PvwsRefused:
                continue  # keeps the scalar rate
            self._host.close(pv.view, self, pv.att)
            pv.view = opened.view
            pv.claims = opened.claims
            pv.ch = opened.view.channels[0]
            pv.array = True

    # --- outgoing -----------------------------------------------------------------------------

    def _push(self, frames: bytes, count: int) -> None:
        self._counts.append(count)
        self._flow.push(frames)

    def next_text(self) -> str | None:
        """The next message, for a socket that sends one text at a time (a server without
        the frames extension, wsprotocol.py); `sent` follows."""
        data, at = self._reading, self._read_at
        if at >= len(data):
            item = self._flow.pop()
            if item is None:
                return None
            self._counts.popleft()
            data, at = self._reading, self._read_at = item, 0
        text, end = read_text_frame(data, at)
        self._read_at = end
        self._popped = end - at
        return text

    def sent(self, nbytes: int) -> None:
        """The text of the last `next_text` is sent (`nbytes` is its length in characters, as
        the socket pump measures a `str`: the queue counts its frame's bytes)."""
        self.last_message_sent_ms = round(self._wall() * 1000)
        self._flow.sent(self._popped)
        self._popped = 0
        if self._read_at >= len(self._reading):
            self._reading, self._read_at = b"", 0

    def next_frames(self, limit: int = WRITE_BATCH) -> bytes | None:
        """The frames queued, up to about `limit` bytes, for one socket write (wsprotocol.py),
        or None; `frames_written` follows.

        A message per PV update is pvws' protocol; a write per message is not: with one
        `send()` system call per message, writing was 51 % of the server's CPU (py-spy, 10
        clients x 200 PVs at 10 Hz)."""
        items, size = self._flow.pop_many(limit)
        if not items:
            return None
        counts = self._counts
        self._writing = (sum(counts.popleft() for _ in items), size)
        return items[0] if len(items) == 1 else b"".join(items)

    def frames_written(self, nbytes: int) -> None:
        """The frames of the last `next_frames` are written."""
        count, size = self._writing
        self._writing = (0, 0)
        self.last_message_sent_ms = round(self._wall() * 1000)
        self._flow.sent(size, count)

    def _catch_up(self) -> None:
        """The PVs changed (or opened) while behind, each sent once from its channel's current
        state, in that order, while the queue is under the budget: the rest wait for the next
        catch-up, so one of many PVs costs no more than the budget either."""
        pending = self._pending
        while pending and not self._flow.merging():
            att = next(iter(pending))
            del pending[att]
            self._send_updates((att,))

    def _idle(self, now: float) -> None:
        if self._images_waiting and not self._flow.merging():
            # An image that stopped changing still gets its newest frame out.
            self._send_updates(())

    def close(self) -> None:
        self._opening.clear()
        super().close()
        self._counts.clear()

    def _queue_text(self, text: str) -> None:
        self._push(text_frames((text,)), 1)


def _debt(item: tuple[int, float]) -> float:
    return item[1]


def _is_image(ch: ChannelState) -> bool:
    """Whether `ch` holds an image (an array of 2 or more dimensions), as `_update` records it."""
    value = ch.value
    return isinstance(value, np.ndarray) and value.ndim >= 2
