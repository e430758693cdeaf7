"""A channel's past as GraphQL ``history`` answers it: the server's recorded rows and, with an
archiver behind the server (``--archiver``), the facility's archive before them, joined by the
server at the seam (no row twice, none missing). Pure: the answer's JSON in, columns out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Q_HISTORY", "ArchivePart", "HistoryRows", "history_rows"]

Q_HISTORY = (
    "query($id: String!, $since: Float, $until: Float, $max: Int!) {"
    " history(id: $id, since: $since, until: $until, maxPoints: $max) {"
    " id resolution truncated recordedSince seconds nanoseconds value min max mean count"
    " severity status gap archive { state reason rows until } } }"
)


@dataclass(frozen=True, slots=True)
class ArchivePart:
    """What became of the part older than the server's own history.

    ``state``: ``JOINED`` (the first ``rows`` rows are the archive's, older than ``until``),
    ``EMPTY`` (the archive holds nothing there), ``MISSING`` (it could not be read: ``reason``
    says why, and a gap row at the start marks where), or ``NOT_NEEDED`` (the server's own
    history reached back far enough)."""

    state: str
    reason: str | None
    rows: int
    until: float | None  # POSIX seconds of the seam

    @property
    def missing(self) -> bool:
        return self.state == "MISSING"


@dataclass(frozen=True, slots=True)
class HistoryRows:
    """Rows oldest first, as columns. ``resolution`` 0: every update as it came; else buckets
    of that many seconds from ``t`` (``value`` the last in each; an archive's bucket, its
    mean). A row with ``gap`` True has no value: a plot breaks there. ``archive`` is None when
    no archiver holds the channel."""

    id: str
    resolution: float
    truncated: bool
    recorded_since: float | None
    t: npt.NDArray[np.int64]  # ns since the POSIX epoch, IOC time (a bucket's start)
    value: npt.NDArray[np.float64]
    min: npt.NDArray[np.float64]
    max: npt.NDArray[np.float64]
    mean: npt.NDArray[np.float64]
    count: npt.NDArray[np.int64]
    severity: npt.NDArray[np.int64]
    status: npt.NDArray[np.int64]
    gap: npt.NDArray[np.bool_]
    archive: ArchivePart | None

    def __len__(self) -> int:
        return len(self.t)

    @property
    def archive_missing(self) -> str | None:
        """Why the archive's part is missing (the rows are the recent part alone), else None."""
        return self.archive.reason or "" if self.archive and self.archive.missing else None

    def describe(self) -> str:
        """One line: how many rows, of what, and what became of the archive's part."""
        kind = "points" if not self.resolution else f"{self.resolution:g} s buckets"
        text = f"{self.id}: {len(self)} {kind}"
        if self.archive is None:
            return text
        if self.archive.missing:
            return f"{text}; the archive part is missing: {self.archive.reason}"
        if self.archive.state == "JOINED":
            return f"{text}, the first {self.archive.rows} from the archive"
        return f"{text}; archive: {self.archive.state.lower().replace('_', ' ')}"


def _floats(xs: list[Any]) -> npt.NDArray[np.float64]:
    return np.array([np.nan if x is None else x for x in xs], np.float64)


def history_rows(d: dict[str, Any]) -> HistoryRows:
    """A ``history`` answer (Q_HISTORY's fields) as columns; array channels' rows as 2-D."""
    seconds = np.array(d["seconds"], np.int64)
    t = seconds * 1_000_000_000 + np.array(d["nanoseconds"], np.int64)
    a = d.get("archive")
    part = None if a is None else ArchivePart(a["state"], a["reason"], a["rows"], a["until"])

    def column(name: str) -> npt.NDArray[np.float64]:
        rows = d[name]
        if rows and isinstance(rows[0], list):  # an array channel: a row of elements each
            return np.array([_floats(r) for r in rows], np.float64)
        return _floats(rows)

    return HistoryRows(
        id=d["id"], resolution=float(d["resolution"]), truncated=bool(d["truncated"]),
        recorded_since=d["recordedSince"], t=t, value=column("value"), min=column("min"),
        max=column("max"), mean=_floats([m if not isinstance(m, list) else None
                                          for m in d["mean"]]),
        count=np.array(d["count"], np.int64), severity=np.array(d["severity"], np.int64),
        status=np.array(d["status"], np.int64), gap=np.array(d["gap"], np.bool_), archive=part,
    )  # fmt: skip
