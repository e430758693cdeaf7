"""The journal: every store-held channel's new points in arrival order (time, value, alarm and
the channel's slot, in four columns), until `flush` writes them into the channels' rings.

A point costs the update one write into the columns, O(1), nothing allocated, and the rings
are written a journal at a time: per-channel writes scattered over the store's memory cost
several times more (bench/JOURNAL.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import history as package  # its compiled parts, read at each use (the package says why)
from . import fallback

if TYPE_CHECKING:
    from .._journal import Writer
    from .fallback import PyWriter
    from .store import HistoryStore

__all__ = ["Journal"]


class Journal:
    """`writer` (compiled where built, else `PyWriter`) puts each point into the columns;
    `Channel.on_update` and the tick's batch call it directly."""

    __slots__ = ("_a", "_c", "_t", "_v", "store", "write", "writer")

    def __init__(
        self, store: HistoryStore, writer: type[Writer] | type[PyWriter] | None = None
    ) -> None:
        self.store = store
        size = package.JOURNAL_POINTS
        self._t = np.zeros(size, "<i8")
        self._v = np.zeros(size, "<f8")
        self._a = np.zeros(size, "<u2")
        self._c = np.zeros(size, "<i4")  # the channel's slot
        for column in (self._t, self._v, self._a, self._c):
            column.fill(0)  # mapped now, not page by page under the first 16,384 updates
        self.writer = (writer or package.Writer)(self._t, self._v, self._a, self._c)
        # The writer's `write`, bound once: every channel holds this one object (the tick's
        # batch finds the writer through it); a bound method per channel is one more cold
        # object to fetch at every update.
        self.write = self.writer.write

    @property
    def j(self) -> int:
        """Points waiting for the flush."""
        return self.writer.j

    def flush(self) -> None:
        """Every point into its channel's ring, in order, then each channel among them moves
        its index on (and folds its tiers when AGGREGATE_EVERY points wait). Compiled where
        built (`_journal.Rings.flush`); in numpy where not, and when a channel has more points
        than may wait for the tiers."""
        writer = self.writer
        n = writer.j
        if not n:
            return
        writer.j = 0  # whatever happens below, these points are not written twice
        store = self.store
        rings = package._rings
        if rings is not None:
            due = rings.flush(self._t, self._v, self._a, self._c, n, store.raw_t, store.raw_v,
                              store.raw_a, store.by_slot)  # fmt: skip
            if due is not None:
                for h in due:
                    h._aggregate()  # AGGREGATE_EVERY points of it wait for the tiers
                return
            # A channel with more points than may wait for the tiers: numpy's flush folds them.
        fallback.flush(self._t[:n], self._v[:n], self._a[:n], self._c[:n], store)
