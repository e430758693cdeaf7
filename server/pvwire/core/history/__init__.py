"""Recent history of monitored channels, so a plot opens full and a subscription starts with its
past (DESIGN.md section 7c).

Per channel, fixed-size round-robin buffers allocated once: a raw ring of the last RAW_POINTS
updates as they came (`ring`), then tiers of buckets, min, max, mean, last and count of 10 s for
an hour and of 5 min for a day (`tiers`); small arrays opt in to the same (`arrays`). Every
history lives under one memory budget (`store`), and is read one way whatever a row holds
(`reading`). Times are the IOC's; a gap (the channel disconnected or stopped being monitored) is
a point of its own on the server's clock, as the IOC cannot tell when it went away.

Recording runs for every update of every channel, so it must not show in what the server
costs: an update only marks itself pending in its Channel's slots; the tick writes every dirty
channel's pending update into the store's `journal` in one compiled call; a full journal is
flushed into the rings, and a ring's points folded into its tiers, a batch at a time. Any read,
gap or reclaim writes its channel's waiting points first, so the ring always holds every update
in order when anyone looks. The compiled parts are core/_journal.c (`make ext`); `fallback`
does the same in Python and numpy where they are not built. What each step cost, and why it is
batched this way: bench/JOURNAL.md.

`Writer`, `_rings` and `_fold` (the compiled parts, or the fallbacks' where not built) and
`JOURNAL_POINTS` are read from this package at each use, so that a test can swap them.
"""

from __future__ import annotations

from collections.abc import Callable

from .arrays import ArrayHistory, array_bytes, array_sizes
from .fallback import PyWriter
from .journal import Journal
from .layout import (
    AGGREGATE_EVERY,
    BUCKET_DTYPE,
    CHANNEL_BYTES,
    JOURNAL_POINTS,
    NS,
    RAW_DTYPE,
    RAW_ITEM_BYTES,
    RAW_POINTS,
    TIERS,
    FoldedBucket,
)
from .ring import JOURNAL_SLOTS, ChannelHistory, PendingSource
from .slices import HistorySlice
from .store import HistoryStats, HistoryStore, NoHistory
from .tiers import ArrayTier, Tier

__all__ = [
    "AGGREGATE_EVERY",
    "BUCKET_DTYPE",
    "CHANNEL_BYTES",
    "JOURNAL_POINTS",
    "NS",
    "RAW_DTYPE",
    "RAW_ITEM_BYTES",
    "RAW_POINTS",
    "TIERS",
    "ArrayHistory",
    "ArrayTier",
    "ChannelHistory",
    "HistorySlice",
    "HistoryStats",
    "HistoryStore",
    "Journal",
    "NoHistory",
    "PendingSource",
    "PyWriter",
    "Tier",
    "Writer",
    "array_bytes",
    "array_sizes",
]

_rings: Rings | None = None
_fold: Callable[..., list[FoldedBucket]] | None = None
try:
    from .._journal import RING_SLOTS, Rings, Writer, fold
except ImportError:  # not built (or built before RING_SLOTS): `make ext` builds it
    Writer = PyWriter  # type: ignore[misc,assignment]
else:
    if RING_SLOTS != JOURNAL_SLOTS:
        raise RuntimeError(
            f"core/_journal.c reads the ChannelHistory slots {RING_SLOTS}, core/history/ring.py "
            f"declares {JOURNAL_SLOTS} (JOURNAL_SLOTS): one side changed without the other"
        )
    # A TypeError here names a slot the C side reads that ChannelHistory does not declare.
    _rings = Rings(ChannelHistory, RAW_POINTS, AGGREGATE_EVERY)
    _fold = fold
