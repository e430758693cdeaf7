"""One upstream channel: the cached latest state, shared by every client that watches it.

A Channel is the `ChannelSink` its backend monitor delivers to. Upstream callbacks do O(1) work:
store the new state, bump the serial, mark the channel dirty once per tick (DESIGN.md section 2),
and mark the update pending for its history. Encoding happens at the tick, once per channel
whatever the number of clients (`body`), after the tick has written the pending updates into the
history journal (`write_all_pending`).

A value the encoder cannot carry fails this channel alone: it turns FAILED with the reason, which
clients see in its CONN field, and every other channel and client goes on (DESIGN.md section 9:
one CA string array once froze every subscription that held it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal, Protocol, get_args

import numpy as np

from ..limits import ALL_MODE_PER_CHANNEL
from ..model import ALARM, CONN, META, TIME, VALUE, ConnState, Metadata, Reading, Value
from ..upstream.base import Backend, Monitor
from ..wire import codec as wire
from .history import ChannelHistory
from .reduce import Reduction, reduce_value

__all__ = [
    "ALL_MODE_LIMIT",
    "FAILURE_UNITS",
    "JOURNAL_SLOTS",
    "ChangeSink",
    "Channel",
    "DirtyListener",
    "FailureUnit",
    "write_all_pending",
]

log = logging.getLogger("pvwire.channel")

# ALL mode keeps at most this many updates of one channel between two ticks; beyond it updates
# are dropped and the serial tells clients how many. Bounds memory under overload: aioca's own
# unbounded `all_updates` queue grew 195 MB -> 641 MB in 95 s (DESIGN.md section 9).
ALL_MODE_LIMIT = ALL_MODE_PER_CHANNEL

_VALUE_TIME = VALUE | TIME
_VALUE_TIME_ALARM = VALUE | TIME | ALARM
_VALUE_META = VALUE | META
_PLAIN = wire.PLAIN_TYPES
_update_body = wire.encode_update_body


# Where a failure can be contained (`DirtyListener.count_failure`, typed so no other name can
# be counted): `/metrics` exports a series for each of them, zero or not.
FailureUnit = Literal["channel", "reduction", "view", "session", "history"]
FAILURE_UNITS: tuple[FailureUnit, ...] = get_args(FailureUnit)


class DirtyListener(Protocol):
    """What a channel tells when it first changes after a tick (the ticker)."""

    def mark_dirty(self, channel: Channel) -> None: ...

    def count_failure(self, unit: FailureUnit) -> None: ...

    def count_dropped(self, n: int) -> None:
        """`ALL` mode dropped `n` updates at one of its bounds (`all_mode_per_channel`,
        `all_mode_per_view`)."""


class ChangeSink(Protocol):
    """Who receives a channel's changes at the tick (a view, under the sid it knows it by)."""

    def add_change(self, sid: int, mask: int, channel: Channel) -> bool: ...

    def subscribers(self) -> int: ...


# The slots core/_journal.c's `Pending` reads at each tick by member offset, without a Python
# call per channel (`write_all_pending`), and `history_pending`, which it also writes: each a
# writable slot of Channel itself (not of a subclass), `history_pending` exactly True or False
# (the C side compares with True), `history_kind` an exact type, `history_write` the compiled
# writer's bound `write` (anything else is left to Python). Renaming, removing or adding one on
# either side fails at import: below, where `Pending(Channel)` is made.
JOURNAL_SLOTS = (
    "history_pending",
    "history_kind",
    "history_write",
    "value",
    "seconds",
    "nanoseconds",
    "severity",
    "status",
    "history_slot",
)


# The slots core/_tick.c's `Router` reads at each tick by member offset (core/view.py makes it
# and checks this list against the module's at import): `dirty` (an exact int, set to 0 once
# routed), `views` (a dict of (view, sid), walked for ALL-mode views when `all_views`),
# `latest_views` (a dict of the LATEST views holding it), `history` (a list, emptied), `known`
# and `_cache`, where it finds a body `Channel.body` has cached under its bare mask, and
# `number`, under which it lists the channel's change in its table (`NUMBERS`).
TICK_SLOTS = (
    "dirty",
    "views",
    "latest_views",
    "all_views",
    "history",
    "known",
    "_cache",
    "number",
)


class Numbers:
    """Small ints, each held by one live channel at a time: the compiled tick lists changes in a
    table indexed by them, and a view lists its channels' (core/_tick.c). Bounded by the most
    channels alive at once."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 0

    def take(self) -> int:
        if self._free:
            return self._free.pop()
        self._next += 1
        return self._next - 1

    def give(self, number: int) -> None:
        self._free.append(number)


NUMBERS = Numbers()


class Channel:
    # Nine of these are read by core/_journal.c by member offset: JOURNAL_SLOTS above; eight by
    # core/_tick.c: TICK_SLOTS.
    __slots__ = (
        "_cache",
        "all_views",
        "backend",
        "dirty",
        "fault",
        "history",
        "history_kind",
        "history_pending",
        "history_slot",
        "history_write",
        "id",
        "known",
        "latest_views",
        "listener",
        "message",
        "meta",
        "meta_wire",
        "meta_wire_writable",
        "monitor",
        "name",
        "nanoseconds",
        "number",
        "reason",
        "recorder",
        "refs",
        "seconds",
        "serial",
        "severity",
        "state",
        "status",
        "updates",
        "value",
        "views",
    )

    def __init__(
        self,
        channel_id: str,
        backend: Backend,
        name: str,
        listener: DirtyListener,
    ) -> None:
        self.id = channel_id
        self.backend = backend
        self.name = name
        self.listener = listener
        self.monitor: Monitor | None = None
        self.value: Value = None
        self.serial = 0  # upstream updates since the monitor opened (PROTOCOL.md section 3)
        self.updates = 0  # all updates ever, for rates in `server` stats
        self.seconds = 0
        self.nanoseconds = 0
        self.severity = 0
        self.status = 0
        self.message = ""
        self.meta = Metadata()
        # The metadata map as a reader may not write (`meta_wire`) and as one whose rules allow
        # writes (`meta_wire_writable`): `writable` is per identity (PROTOCOL.md section 5), so
        # a view picks one; both are made once per metadata change.
        self.meta_wire: dict[str, Any] = {}
        self.meta_wire_writable: dict[str, Any] = {}
        self.state = ConnState.CONNECTING
        self.reason = ""
        self.known = CONN  # fields with data: a snapshot sends exactly these
        self.dirty = 0  # fields changed since the last tick
        self.refs = 0  # views holding this channel
        # (view, sid) -> None, to notify at each tick in the order the views came; a dict so that
        # a view's going costs one lookup whatever the number of views of the channel.
        self.views: dict[tuple[ChangeSink, int], None] = {}
        self.all_views = 0  # ALL-mode views: only then is `history` kept
        # LATEST view -> how many of its sids are this channel: the views the compiled tick
        # finds changed through it (core/_tick.c), each then reading its channels' masks.
        self.latest_views: dict[ChangeSink, int] = {}
        self.number = NUMBERS.take()  # given back by `retire` when the registry closes it
        self.history: list[wire.EntryBody] = []
        # Keyed by mask, or (mask, reduction, writes) for the views that asked for a reduction
        # or whose mask holds META (`writable` differs by the view's access).
        self._cache: dict[int | tuple[int, Reduction | None, bool], wire.EntryBody] = {}
        self.fault = ""  # why encoding failed; the channel stays FAILED until it reconnects
        # Where updates are recorded for `history` and `backfill` (core/history/); None when
        # the channel has none (budget full, or recording failed). Set by `record_into`.
        self.recorder: ChannelHistory | None = None
        # The recorder's store's journal's `write` (one bound method for the whole store: the
        # tick's batch finds the writer through it) and the recorder's slot, and the type of
        # value written through them without `record`: set when `recorder.record` accepted that
        # type and has a journal; None whenever the channel does not record, which `on_update`
        # relies on. (history_write typed Any: it is used only while history_kind is set, never
        # None then.)
        self.history_write: Any = None
        self.history_slot = -1
        self.history_kind: type | None = None
        # The current update (value, time, alarm in the slots above) is of `history_kind` and
        # not in the journal yet: the tick writes it (`write_all_pending`), or the next update, a
        # read of the history or a change of recorder before it (`write_pending`).
        self.history_pending = False

    def retire(self) -> None:
        """Closed for good (the registry let go of it): its number goes to another channel."""
        if self.number >= 0:
            NUMBERS.give(self.number)
            self.number = -1

    def record_into(self, recorder: ChannelHistory | None) -> None:
        """Record this channel's updates into `recorder` from now on (None: nowhere)."""
        if self.history_pending:
            self.write_pending()  # the last update goes where the ones before it went
        if self.recorder is not None and self.recorder.source is self:
            self.recorder.source = None
        if recorder is not None:
            recorder.source = self  # its reads write this channel's pending update first
        self.recorder = recorder
        journal = recorder.journal if recorder is not None else None
        self.history_write = journal.write if journal is not None else None
        self.history_slot = recorder.slot if recorder is not None else -1
        self.history_kind = None  # the next value goes through `record`, which checks it

    # --- ChannelSink: called by the backend on the event loop, O(1) --------------------------

    def on_update(
        self,
        value: Value,
        seconds: int,
        nanoseconds: int,
        severity: int,
        status: int,
        message: str,
        skipped: int = 0,
    ) -> None:
        if self.history_pending:
            # Two updates within one tick: the one these overwrite goes into the journal first.
            self.write_pending()
        self.value = value
        self.seconds = seconds
        self.nanoseconds = nanoseconds
        self.serial += 1 + skipped
        self.updates += 1
        mask = _VALUE_TIME
        # The first value always carries its alarm, even NO_ALARM with an empty message: a
        # client that attached before it must see the same state as one attaching after
        # (DESIGN.md section 9: PVA channels showed alarm UNKNOWN).
        if (
            not self.known & VALUE
            or severity != self.severity
            or status != self.status
            or message != self.message
        ):
            self.severity = severity
            self.status = status
            self.message = message
            mask = _VALUE_TIME_ALARM
        # `_changed(mask)`, inline: this runs for every upstream update (10,000 a second at
        # 1,000 PVs of 10 Hz), and the call was a tenth of it.
        if self._cache:
            self._cache.clear()
        self.known |= _VALUE_TIME_ALARM
        if not self.dirty:
            self.listener.mark_dirty(self)
        self.dirty |= mask
        if self.all_views:
            if len(self.history) < ALL_MODE_LIMIT:
                # ALL mode must keep this update even if another arrives before the tick.
                self.history.append(self.body(mask, cache=False))
            else:
                self.listener.count_dropped(1)
        if type(value) is self.history_kind:
            # A value of the type `record` checked last waits in the slots above for the tick,
            # which writes every dirty channel's in one compiled call (`write_all_pending`): a
            # call into the writer here, per update, was most of what recording still cost.
            # Nothing of the recorder is touched, nor `self.recorder` read: history_kind is None
            # unless the channel records, so this test is also "does it record". Reading
            # `recorder` first cost ~0.2 us more per update: its slot can lie on a cache line
            # that the rest of `on_update` only writes, and a read waits for the line, a write
            # not (bench/JOURNAL.md, "History as a package").
            self.history_pending = True
        elif self.recorder is not None:
            try:
                self._record(value, seconds, nanoseconds, severity, status)
            except Exception as exc:
                self._history_failed(exc)

    def write_pending(self) -> None:
        """The pending update (`history_pending`) into the journal, now; what the tick's
        compiled batch leaves to Python comes here too. A point the writer refuses stops this
        channel's history, as in `record`."""
        if not self.history_pending:
            return
        self.history_pending = False
        value = self.value
        if type(value) is not self.history_kind:
            return  # the encoder failed it since (`_fail`): nothing of it is kept
        try:
            if self.history_write(
                value, self.seconds, self.nanoseconds, self.severity, self.status,
                self.history_slot,
            ):  # fmt: skip
                self.flush_journal()
        except Exception as exc:
            self._history_failed(exc)

    def flush_journal(self) -> None:
        """This channel's point filled its journal: it is flushed before the next point. A flush
        that raises stops this channel's history, as a point the writer refuses does."""
        recorder = self.recorder
        assert recorder is not None and recorder.journal is not None  # it was just written
        try:
            recorder.journal.flush()
        except Exception as exc:
            self._history_failed(exc)

    def _record(
        self, value: Value, seconds: int, nanoseconds: int, severity: int, status: int
    ) -> None:
        """A value of a type the recorder has not checked: `record` checks it, and the fast
        path in `on_update` takes over when it was a number and goes through the journal."""
        recorder = self.recorder
        assert recorder is not None
        recorder.record(value, seconds, nanoseconds, severity, status)
        if recorder.journal is not None:
            self.history_kind = recorder.kind

    def on_meta(self, meta: Metadata) -> None:
        # `meta.writable` is the upstream's answer (None when it cannot tell, as for PVA); the
        # maps sent add the rules' answer to it (PROTOCOL.md section 5).
        if meta == self.meta and self.known & META:
            return
        self.meta = meta
        self.meta_wire = meta.for_client(False).to_wire()
        self.meta_wire_writable = meta.for_client(True).to_wire()
        self._changed(META)

    def on_connection(self, state: ConnState, reason: str = "") -> None:
        if state == self.state and reason == self.reason:
            return
        self.state = state
        self.reason = reason
        self.fault = ""  # a new connection gets a new chance to deliver values we can encode
        if state != ConnState.CONNECTED and self.recorder is not None:
            try:
                self.recorder.mark_gap()  # a plot must show a gap here, not a line
            except Exception as exc:
                self._history_failed(exc)
        if state == ConnState.CONNECTED and self.serial and self.known & VALUE:
            # A reconnect: the monitor will deliver a fresh first update; restart the serial so
            # clients do not count the gap as conflated updates (PROTOCOL.md section 3).
            self.serial = 0
        self._changed(CONN)

    def _history_failed(self, exc: Exception) -> None:
        """Recording failed: this channel's history stops, the channel goes on."""
        recorder = self.recorder
        self.record_into(None)
        log.error("channel %s: history recording failed, stopped: %r", self.id, exc)
        self.listener.count_failure("history")
        if recorder is not None:
            recorder.failed = True  # its store reclaims it first and never hands it out again

    def _changed(self, mask: int) -> None:
        if self._cache:
            self._cache.clear()  # the tick filled it; a new state invalidates every encoding
        self.known |= mask if not mask & VALUE else mask | ALARM
        if not self.dirty:
            self.listener.mark_dirty(self)
        self.dirty |= mask

    # --- encoding -----------------------------------------------------------------------------

    def body(
        self,
        mask: int,
        cache: bool = True,
        reduction: Reduction | None = None,
        writes: bool = False,
    ) -> wire.EntryBody:
        """The entry body for `mask` (limited to known fields), encoded once per state,
        reduction and, when it holds META, `writes` (whether the view's identity may write this
        channel under pvwire's rules; `writable` is that AND the upstream's answer).

        With a reduction, an array channel's VALUE and META always travel together: the
        metadata's `reduced` entry describes that value (PROTOCOL.md section 4.6), and a client
        must never pair a reduced value with the metadata of another.

        Never raises: a state the encoder rejects fails this channel (see the module docstring).
        """
        mask &= self.known
        if reduction and mask & _VALUE_META and isinstance(self.value, np.ndarray):
            mask |= _VALUE_META & self.known
        else:
            reduction = None
        writes = writes and bool(mask & META)
        key: int | tuple[int, Reduction | None, bool] = (
            mask if reduction is None and not writes else (mask, reduction, writes)
        )
        body = self._cache.get(key)
        if body is None:
            try:
                if self.fault:
                    body = self._encode(mask | CONN, None, writes)
                else:
                    body = self._encode(mask, reduction, writes)
            except Exception as exc:
                body = self._fail(mask, exc, writes)
            if cache:
                self._cache[key] = body
        return body

    def _fail(self, mask: int, exc: Exception, writes: bool) -> wire.EntryBody:
        if not self.fault:
            # Logged once per channel and connection; counted every time.
            log.error("channel %s failed: cannot encode its value: %r", self.id, exc)
        self.fault = f"value cannot be sent: {exc}"[:200]
        self.value = None
        self.listener.count_failure("channel")
        return self._encode(mask | CONN, None, writes)

    def full_body(self, reduction: Reduction | None = None, writes: bool = False) -> wire.EntryBody:
        """The entry a snapshot sends: everything known."""
        return self.body(self.known, reduction=reduction, writes=writes)

    def _encode(
        self, mask: int, reduction: Reduction | None = None, writes: bool = False
    ) -> wire.EntryBody:
        value = self.value
        if mask == _VALUE_TIME and type(value) in _PLAIN:
            return _update_body(value, self.serial, self.seconds, self.nanoseconds)
        metadata = self.meta_wire_writable if writes else self.meta_wire
        if reduction is not None:
            try:
                value, reduced = reduce_value(value, metadata, reduction)
            except Exception:
                # A reduction is a view's option: failing it must not fail the channel for
                # the subscribers of whole arrays. That view gets the whole value instead.
                log.exception("channel %s: reduction %s failed; sent whole", self.id, reduction)
                self.listener.count_failure("reduction")
                reduced = None
            if reduced is not None:
                metadata = {**metadata, "reduced": reduced}
        return wire.encode_entry_body(
            mask,
            value=value,
            serial=self.serial,
            seconds=self.seconds,
            nanoseconds=self.nanoseconds,
            severity=self.severity,
            status=self.status,
            message=self.message,
            metadata=metadata,
            state=int(ConnState.FAILED if self.fault else self.state),
            reason=self.fault or self.reason,
        )

    # --- control plane ------------------------------------------------------------------------

    def reading(self) -> Reading | None:
        """The cached state as a Reading, if it is complete enough to answer a get."""
        if (
            self.state != ConnState.CONNECTED
            or self.fault
            or not self.known & VALUE
            or not self.known & META
        ):
            return None
        return Reading(
            value=self.value,
            seconds=self.seconds,
            nanoseconds=self.nanoseconds,
            severity=self.severity,
            status=self.status,
            message=self.message,
            meta=self.meta,
        )

    def __repr__(self) -> str:
        return f"<Channel {self.id} refs={self.refs} state={self.state.name} serial={self.serial}>"


def _python_batch(channels: list[Channel], start: int) -> int:
    """`_journal.Pending.write` where it is not built: every pending update to Python."""
    for i in range(start, len(channels)):
        if channels[i].history_pending:
            return i
    return len(channels)


_write_batch: Callable[[list[Channel], int], int] = _python_batch
try:
    from ._journal import PENDING_SLOTS, Pending
except ImportError:  # not built (or built before PENDING_SLOTS): `make ext` builds it
    pass
else:
    if PENDING_SLOTS != JOURNAL_SLOTS:
        raise RuntimeError(
            f"core/_journal.c reads the Channel slots {PENDING_SLOTS}, core/channel.py declares "
            f"{JOURNAL_SLOTS} (JOURNAL_SLOTS): one side changed without the other"
        )
    # A TypeError here names a slot the C side reads that Channel does not declare as its own.
    _write_batch = Pending(Channel).write


def write_all_pending(channels: list[Channel]) -> None:
    """The pending update of every channel in `channels` (the tick's dirty ones) into its
    journal. The compiled batch writes them without a Python call per channel; it stops at a
    channel whose point filled its journal (flushed here) and at one it leaves to Python (a
    writer in Python, or a point it refuses, whose channel's failure path then runs)."""
    i, n = 0, len(channels)
    while i < n:
        k = _write_batch(channels, i)
        if k >= n:
            return
        if k < 0:
            k = -k - 1
            channels[k].flush_journal()
        else:
            channels[k].write_pending()
        i = k + 1
