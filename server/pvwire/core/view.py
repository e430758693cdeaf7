"""A view: one token's channel list with its options, shared by every attachment of that token.

The fan-out case (many clients showing the same screen) is many attachments of one view. A view
turns the tick's changed channels into its `entries` array ONCE; each attached session then only
prefixes a few bytes of frame header to it. Per update and per extra client the cost is close to
zero (DESIGN.md section 8: cost per extra client close to zero).

`maxRate` is applied here: changes of a view that is not due yet stay merged in `pending` (latest
value wins, the serial keeps the count) until it is. So is the view's array reduction
(`maxColumns`, `maxPixels`; core/reduce.py), through the channels' bodies, which cache it.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..limits import ALL_MODE_PER_VIEW
from ..model import CONN, META
from ..wire import codec as wire
from .archive import Archive
from .archive.past import ArchivePast
from .backfill import Backfill
from .channel import TICK_SLOTS as CHANNEL_TICK_SLOTS
from .channel import Channel
from .reduce import NO_REDUCTION, Reduction

if TYPE_CHECKING:
    from .clients import Client

__all__ = ["ALL_PENDING_LIMIT", "ROUTER", "View", "ViewFailed", "ViewKey"]

log = logging.getLogger("pvwire.view")

# ALL mode: most entries one view holds between emissions (a maxRate-limited ALL view under
# heavy load); about 3 MB of small entries.
ALL_PENDING_LIMIT = ALL_MODE_PER_VIEW


class ViewFailed(Exception):
    """A view could not make its entries (raised to the session that asked for them)."""

    def __init__(self, view: View) -> None:
        super().__init__(f"subscription of {len(view.channels)} channels failed")
        self.view = view


@dataclass(frozen=True, slots=True)
class ViewKey:
    ids: tuple[str, ...]
    mode: str  # "LATEST" or "ALL"
    max_rate: float  # Hz, 0 = every tick
    reduction: Reduction = NO_REDUCTION  # LATEST mode only (the GraphQL layer refuses ALL)
    # One byte per sid, 1 where the attaching identity may write the channel under pvwire's
    # rules: metadata's `writable` is per identity (PROTOCOL.md section 5), so identities that
    # differ in it get views of their own; empty means none.
    writes: bytes = b""


# The View slots core/_tick.c's `Router` reads: `pending` (a dict it merges masks into, for a
# view whose `all_mode` is exactly False; any other view's change goes through `add_change`),
# `channels` (a list) and `numbers` (their numbers, int32 bytes), `routed` (the token of the
# last tick that found it changed, which it writes) and `writes`.
TICK_SLOTS = ("pending", "all_mode", "channels", "numbers", "routed", "writes")


class View:
    __slots__ = (
        "_all_sids",
        "all_mode",
        "archive",
        "attachments",
        "channels",
        "key",
        "next_due",
        "numbers",
        "pending",
        "pending_all",
        "period",
        "reduction",
        "routed",
        "tick_bodies",
        "tick_encoded",
        "tick_masks",
        "writes",
    )

    def __init__(self, key: ViewKey, channels: list[Channel]):
        self.key = key
        self.channels = channels  # index = sid
        self.all_mode = key.mode == "ALL"
        self.reduction = key.reduction if key.reduction else None
        self.writes = key.writes or bytes(len(channels))
        self.period = 1.0 / key.max_rate if key.max_rate > 0 else 0.0
        self.next_due = 0.0
        self.routed: object = None  # the compiled tick's mark (core/_tick.c)
        # The channels' numbers (Channel.number), which the compiled tick reads in order.
        self.numbers = array("i", [ch.number for ch in channels]).tobytes()
        self.pending: dict[int, int] = {}  # sid -> merged field mask since the last emission
        # ALL mode: (sid, body) of every entry in upstream order; bodies, not encoded entries, so
        # that emitting knows where their arrays lie (frames align them, codec.Entries).
        self.pending_all: list[tuple[int, wire.EntryBody]] = []
        # (client, att) -> None: insertion-ordered as a list was, but a detach is one lookup, so
        # a reconnect storm of N clients on one view costs N steps, not N squared.
        self.attachments: dict[tuple[Client, int], None] = {}
        # What the last emission sent: read by sessions at the same tick. Its entries are encoded
        # when a session first asks (`tick_entries`): pvws sessions read only the masks.
        self.tick_masks: dict[int, int] = {}
        self.tick_bodies: list[wire.EntryBody] | None = None  # ALL mode: the emitted bodies
        self._all_sids: list[int] = []
        self.tick_encoded: wire.Entries | None = wire.Entries(0, b"\x90", b"")
        # The archive behind the channels' history, which a backfill reaches into (the hub's).
        self.archive: Archive | None = None

    def link(self) -> None:
        """Be told of the channels' changes from now on."""
        for sid, ch in enumerate(self.channels):
            ch.views[(self, sid)] = None
            if self.all_mode:
                ch.all_views += 1
            else:
                ch.latest_views[self] = ch.latest_views.get(self, 0) + 1

    def unlink(self) -> None:
        """Be told of nothing more (`link` undone)."""
        for sid, ch in enumerate(self.channels):
            del ch.views[(self, sid)]
            if self.all_mode:
                ch.all_views -= 1
            elif ch.latest_views[self] > 1:
                ch.latest_views[self] -= 1
            else:
                del ch.latest_views[self]

    def add_change(self, sid: int, mask: int, channel: Channel) -> bool:
        """Record that channel `sid` changed; True if the view had nothing pending before."""
        pending = self.pending
        first = not pending
        pending[sid] = pending.get(sid, 0) | mask
        if self.all_mode:
            out = self.pending_all
            if channel.history:
                # Metadata and connection changes go first, then every update in order.
                rest = mask & (META | CONN)
                if rest:
                    out.append((sid, channel.body(rest, True, None, self.writes[sid] == 1)))
                out.extend((sid, b) for b in channel.history)
            else:
                out.append((sid, channel.body(mask, True, None, self.writes[sid] == 1)))
            if len(out) > ALL_PENDING_LIMIT:
                # Oldest dropped first; the serial tells the client how many it missed.
                channel.listener.count_dropped(len(out) - ALL_PENDING_LIMIT)
                del out[: len(out) - ALL_PENDING_LIMIT]
        return first

    def subscribers(self) -> int:
        return len(self.attachments)

    def reset(self) -> None:
        """Drop what is pending (after a failure, its clients resume from a snapshot)."""
        self.pending = {}
        self.pending_all = []

    def due(self, now: float) -> bool:
        return not self.period or now >= self.next_due

    def emit(self, now: float) -> None:
        """Make pending changes this tick's `tick_masks` (and `tick_entries`, on first read)."""
        if self.all_mode:
            pending_all = self.pending_all
            self.pending_all = []
            # Sids may repeat in ALL mode: the masks keep their merge, the bodies their order.
            self.tick_bodies = [body for _, body in pending_all]
            self._all_sids = [sid for sid, _ in pending_all]
        self.tick_encoded = None
        self.tick_masks = self.pending
        self.pending = {}
        if self.period:
            # Never sooner than one period after this emission, including after an idle spell:
            # `max(next_due + period, now)` let a second group out one tick after the first.
            self.next_due = now + self.period

    @property
    def tick_entries(self) -> wire.Entries:
        """This tick's entries, encoded once, by the first session that sends them. Read within
        the tick that emitted them, so the channels still hold the state they were made from."""
        got = self.tick_encoded
        if got is None:
            try:
                if self.all_mode:
                    got = wire.encode_entries(self._all_sids, self.tick_bodies or [])
                else:
                    got = self.entries_for(self.tick_masks)
            except Exception as exc:
                raise ViewFailed(self) from exc
            self.tick_bodies = None
            self.tick_encoded = got
        return got

    @property
    def ids(self) -> tuple[str, ...]:
        return self.key.ids

    def entries_for(self, masks: dict[int, int]) -> wire.Entries:
        """Entries for `masks` from the channels' current state (a session catching up)."""
        channels = self.channels
        r = self.reduction
        w = self.writes
        if r is None and ROUTER is not None:
            data, arrays = ROUTER.splice(self, masks)
            n = len(masks)
            return wire.Entries(n, wire.array_header(n), data, arrays)
        return wire.encode_entries(
            list(masks), [channels[sid].body(m, True, r, w[sid] == 1) for sid, m in masks.items()]
        )

    def backfill(
        self,
        att: int,
        seconds: float,
        held: Sequence[int] | None,
        who: str = "",
        resume: Callable[[], None] | None = None,
    ) -> Backfill:
        """This attachment's backfill (PROTOCOL.md section 2.8), which its session produces a
        message at a time under its send budget, then the snapshot (core/backfill.py). With an
        archive, `who` (a user, else an address) reads it, and `resume` goes on once it
        answers."""
        job = Backfill(att, self.channels, seconds, held)
        if self.archive is not None and self.archive.client is not None and resume is not None:
            job.archive = ArchivePast(self.archive, att, self.channels, job.cursors, who, resume)
        return job

    def snapshot_entries(self) -> wire.Entries:
        r = self.reduction
        w = self.writes
        return wire.encode_entries(
            range(len(self.channels)),
            [ch.full_body(r, w[sid] == 1) for sid, ch in enumerate(self.channels)],
        )


# Routing and splicing compiled (core/_tick.c) where built: with distinct screens each runs once
# per delivered update. Without it, the tick and `entries_for` do the same in Python.
ROUTER: Router | None = None
try:
    from ._tick import CHANNEL_SLOTS, VIEW_SLOTS, Router
except ImportError:  # not built: `make ext` builds it
    pass
else:
    if (CHANNEL_SLOTS, VIEW_SLOTS) != (CHANNEL_TICK_SLOTS, TICK_SLOTS):
        raise RuntimeError(
            f"core/_tick.c reads the Channel slots {CHANNEL_SLOTS} and View slots {VIEW_SLOTS}, "
            f"channel.py and view.py declare {CHANNEL_TICK_SLOTS} and {TICK_SLOTS} (TICK_SLOTS): "
            "one side changed without the other"
        )
    # A TypeError here names a slot the C side reads that a class does not declare as its own.
    ROUTER = Router(Channel, View, META)
