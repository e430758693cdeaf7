"""Every channel's history under one memory budget in bytes.

A channel costs CHANNEL_BYTES (its scalar buffers, allocated when it gets a history), an array
channel that plus its `ArrayHistory`'s arrays, counted when they are allocated. When a new
history or a channel's arrays do not fit:
1. the history of the channel that stopped being monitored longest ago is reclaimed (nobody
   watches it and its data only gets older), again until it fits;
2. if every history in the store belongs to a monitored channel, the new channel (or its
   arrays) gets none, and `refused` counts it: taking history away from a channel someone is
   watching would break a plot on screen, while a new channel without history still streams as
   before.
A channel released after the linger keeps its history (ended by a gap) while the budget allows,
and continues it if it is monitored again."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import PvwireError
from ...limits import HISTORY_ARRAY_LIMIT
from .journal import Journal
from .layout import CHANNEL_BYTES, RAW_POINTS
from .ring import ChannelHistory
from .slices import HistorySlice

__all__ = ["HistoryStats", "HistoryStore", "NoHistory"]


class NoHistory(PvwireError):
    code = "NO_HISTORY"


@dataclass(frozen=True, slots=True)
class HistoryStats:
    budget_bytes: int
    used_bytes: int
    channels: int  # histories held
    monitored: int  # of which their channel is monitored now
    refused: int  # channels (or arrays) given no history: the budget was full of monitored ones
    reclaimed: int  # histories of unmonitored channels dropped to make room


class HistoryStore:
    """Every channel's history under one memory budget (the policy: the module docstring)."""

    def __init__(self, budget_bytes: int, array_max: int = 0) -> None:
        if not 0 <= array_max <= HISTORY_ARRAY_LIMIT:
            raise ValueError(
                f"history_array_max must be between 0 and {HISTORY_ARRAY_LIMIT:,}, not {array_max}"
            )
        self.budget_bytes = budget_bytes
        self.array_max = array_max  # longest numeric array that gets a history; 0: none do
        self.used = 0  # bytes held by the histories in `_histories`
        # Every history's raw ring is a row of these (a slot), so that the journal's flush is
        # one scatter per column. As many rows as scalar histories fit the budget; untouched
        # rows cost no memory (calloc'd pages are mapped when first written).
        capacity = budget_bytes // CHANNEL_BYTES
        self.raw_t = np.zeros((capacity, RAW_POINTS), "<i8")
        self.raw_v = np.zeros((capacity, RAW_POINTS), "<f8")
        self.raw_a = np.zeros((capacity, RAW_POINTS), "<u2")
        self.by_slot: list[ChannelHistory | None] = [None] * capacity
        self._free = list(range(capacity - 1, -1, -1))  # the lowest slot is taken first
        self.journal = Journal(self)
        # Insertion order is the order of the last attach or detach: the first detached one
        # found is the one released longest ago.
        self._histories: dict[str, ChannelHistory] = {}
        # A scan found nothing to reclaim: until a history is released (`detach`), a new one is
        # refused without another scan of every monitored one. Each new channel past a budget
        # full of monitored ones scanned them all: 20,000 channels opened at once held the loop
        # for seconds. (A history that fails meanwhile is reclaimed after the next release.)
        self._nothing_to_reclaim = False
        self.refused = 0
        self.reclaimed = 0

    def get(self, channel_id: str) -> ChannelHistory | None:
        return self._histories.get(channel_id)

    def channel_ids(self) -> list[str]:
        """The ids of every history held (recording or not)."""
        return list(self._histories)

    def query(self, channel_id: str, since: int, until: int, max_points: int) -> HistorySlice:
        """Raises NoHistory when nothing is recorded for the channel, saying why."""
        h = self._histories.get(channel_id)
        if h is None or h.failed:
            why = (
                "recording it failed"
                if h is not None
                else (
                    "history is recorded while a channel is subscribed (or named by "
                    "--history-channels) and the history budget has room"
                )
            )
            raise NoHistory(f"no history of {channel_id}: {why}")
        if h.arrays is None and not h.numeric and not h.n:
            raise NoHistory(f"no history of {channel_id}: {h.unkept}")
        return h.query(since, until, max_points)

    def attach(self, channel_id: str, pinned: bool = False) -> ChannelHistory | None:
        """The history to record `channel_id` into from now on, or None when the budget is full
        of monitored channels (counted)."""
        h = self._histories.pop(channel_id, None)
        if h is not None and h.failed:
            self._histories[channel_id] = h
            return None
        if h is None:
            if not self._room(CHANNEL_BYTES) or not self._free:
                self.refused += 1
                return None
            slot = self._free.pop()
            h = ChannelHistory(channel_id, self, slot)
            self.by_slot[slot] = h
            self.used += CHANNEL_BYTES
        h.attached = True
        h.no_room = False  # its arrays may find room now, as a refused channel's history may
        h.pinned = h.pinned or pinned
        self._histories[channel_id] = h
        return h

    def take_bytes(self, h: ChannelHistory, n: int) -> bool:
        """Room for `n` more bytes of `h` (its arrays), reclaiming released histories as a new
        channel would; False (counted in `refused`) when the budget is full of monitored ones.
        A history the store no longer holds gets none."""
        if self._histories.get(h.channel_id) is not h or not self._room(n, keep=h):
            self.refused += 1
            return False
        self.used += n
        return True

    def release_bytes(self, n: int) -> None:
        """A held history freed `n` bytes (its arrays, replaced)."""
        self.used -= n

    def detach(self, h: ChannelHistory) -> None:
        """Its channel is no longer monitored: the history ends with a gap and may be reclaimed."""
        if self._histories.get(h.channel_id) is not h:
            return
        h.mark_gap()
        h.attached = False
        self._nothing_to_reclaim = False
        del self._histories[h.channel_id]
        self._histories[h.channel_id] = h  # most recently released: last to be reclaimed

    def _room(self, n: int, keep: ChannelHistory | None = None) -> bool:
        """Reclaims released (or failed) histories, longest released first, until `n` more
        bytes fit; False if they cannot, and then reclaims nothing."""
        if self.used + n <= self.budget_bytes:
            return True
        if self._nothing_to_reclaim:
            return False
        victims = []
        freed = 0
        for h in self._histories.values():
            if h is not keep and (h.failed or (not h.attached and not h.pinned)):
                victims.append(h)
                freed += h.nbytes
                if self.used - freed + n <= self.budget_bytes:
                    break
        else:
            self._nothing_to_reclaim = not victims
            return False
        self.journal.flush()  # their points still held go to their rows before the rows go
        for h in victims:
            del self._histories[h.channel_id]
            self.used -= h.nbytes
            self.reclaimed += 1
            if h.slot >= 0:
                self.by_slot[h.slot] = None
                self._free.append(h.slot)
        return True

    def stats(self) -> HistoryStats:
        n = len(self._histories)
        return HistoryStats(
            budget_bytes=self.budget_bytes,
            used_bytes=self.used,
            channels=n,
            monitored=sum(1 for h in self._histories.values() if h.attached),
            refused=self.refused,
            reclaimed=self.reclaimed,
        )
