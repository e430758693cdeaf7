"""The history's sizes and column layouts, shared by its rings, tiers, journal and store."""

from __future__ import annotations

import numpy as np

NS = 1_000_000_000
RAW_POINTS = 1024  # ~100 s of a 10 Hz channel, ~17 min of a 1 Hz one
assert RAW_POINTS & (RAW_POINTS - 1) == 0  # a power of two: the flush masks instead of %
# (bucket width in ns, buckets): 10 s for an hour, 5 min for a day.
TIERS: tuple[tuple[int, int], ...] = ((10 * NS, 360), (300 * NS, 288))

# What reading the raw ring gives (`ChannelHistory.points`); it is held as three columns.
RAW_DTYPE = np.dtype([("t", "<i8"), ("v", "<f8"), ("sev", "u1"), ("stat", "u1"), ("gap", "?")])
RAW_ITEM_BYTES = 8 + 8 + 2  # time, value, alarm
GAP_ALARM = 0xFFFF  # the alarm column's mark of a gap
# Points are folded into the tiers this many at a time (and before any read): half the ring, so
# no waiting point is overwritten, and the fold's fixed cost spread over 512 points
# (bench/JOURNAL.md, "History as a package").
AGGREGATE_EVERY = RAW_POINTS // 2
# Points the journal holds before it is flushed into the rings: a fuller journal would spend
# the cache lines it saves (~20 ns a point compiled at 2,000 channels: bench/JOURNAL.md).
JOURNAL_POINTS = 16_384
BUCKET_DTYPE = np.dtype(
    [("t", "<i8"), ("min", "<f8"), ("max", "<f8"), ("sum", "<f8"), ("last", "<f8"),
     ("count", "<u4"), ("sev", "u1"), ("gap", "u1")]
)  # fmt: skip
CHANNEL_BYTES = RAW_POINTS * RAW_ITEM_BYTES + sum(size * BUCKET_DTYPE.itemsize for _, size in TIERS)

# A bucket as a fold gives it (`_journal.fold`, `fallback.fold`): start, min, max, sum, last,
# count and highest severity.
FoldedBucket = tuple[int, float, float, float, float, int, int]

INVALID = 3  # the severity a gap carries: EPICS shows a disconnected channel INVALID
