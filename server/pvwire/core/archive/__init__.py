"""The facility's archive behind the server's history (DESIGN.md section 7g, docs/ARCHIVER.md):
with `--archiver`, GraphQL `history`, a stream `backfill` and the Archiver Appliance API reach
past the recent history; the part older than the server's oldest kept point comes from the
archiver, joined to the server's rows at the seam with no row twice and none missing.

- `routes`: which archiver holds a channel (`--archiver [GLOB=]URL`);
- `plan`: what to ask it for (`optimizedSample_K`, bins on the tiers' edges) and where the seam is;
- `fetch`: the reads, async and bounded (deadline, bytes, samples, turns), cached and shared;
- `series`: its answer as columns and as the history's rows;
- `join`: both parts as one answer; `past`: a backfill's archive part, a channel at a time.

`Archive` is what the hub holds: the routes and the client, and GraphQL's `history` across the
seam (`history`)."""

from __future__ import annotations

import time

import numpy as np

from ...config import Settings
from ..history.slices import HistorySlice
from .fetch import ArchiveClient, ArchiveMissing, Reach
from .join import MISSING, NOT_NEEDED, Note, empty, missing, span
from .plan import plan
from .routes import Archiver, Routes, pv_name
from .series import ArchiveRefused

__all__ = ["Archive", "ArchiveMissing", "Archiver", "Note", "Reach"]

# Samples an answer may hold beyond the points asked: the one before the range (or its bin),
# and the bin at its end.
_SLACK = 3


class Archive:
    def __init__(self, settings: Settings, client: ArchiveClient | None = None) -> None:
        self.routes = Routes(settings.archivers)
        self.timeout = settings.archive_timeout_s
        self.client = client
        if self.client is None and self.routes:
            self.client = ArchiveClient(int(settings.archive_cache_mb * (1 << 20)))

    def route(self, cid: str) -> Archiver | None:
        """The archiver holding channel `cid`'s past, or None."""
        return self.routes.route(cid) if self.client is not None else None

    def reach(self, who: str) -> Reach:
        """The bounds of one request's reads (fetch.py), for `who` (a user, else an address)."""
        return Reach(who, self.timeout)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def history(
        self,
        cid: str,
        own: HistorySlice | None,
        since: int,
        until: int,
        points: int,
        reach: Reach,
    ) -> tuple[HistorySlice | None, Note | None]:
        """GraphQL `history` of `cid` across the seam: the server's rows `own` (None: it holds
        none) after the archive's part older than them, and what became of that part (None:
        no archiver holds the channel)."""
        archiver = self.route(cid)
        if archiver is None or self.client is None:
            return own, None
        held = own is not None and (len(own) > 0 or own.since > 0)
        hi = min(until, time.time_ns())
        oldest = own.since if own is not None and held else hi + 1
        if since >= oldest or hi < since:
            return own if own is not None else empty(0, since), Note(NOT_NEEDED)
        if own is not None and own.value.ndim == 2:
            why = "pvwire reads no array channel's past from an archive"
            return own, Note(MISSING, why)
        width = own.resolution if own is not None and held else 0
        p = plan(since, oldest, width, points, hi)
        try:
            got = await self.client.read(archiver, cid, p.operator, p.start, p.end, reach,
                                         p.points + _SLACK)  # fmt: skip
            rows, note = span(p, own if held else None, got, since, hi, points, pv_name(cid))
        except (ArchiveMissing, ArchiveRefused) as exc:
            rows, note = missing(own if held else None, since, str(exc), width)
        if not np.all(np.diff(rows.t) >= 0):  # the join's promise, kept by construction
            raise AssertionError(f"{cid}: the archive's rows and the server's are out of order")
        return rows, note
