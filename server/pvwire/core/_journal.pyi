"""The history journal's writer (_journal.c; built by `make`), as `history.PyWriter` behaves."""

from typing import Any

import numpy as np
import numpy.typing as npt

PENDING_SLOTS: tuple[str, ...]
"""The Channel slots `Pending` reads (and `history_pending`, which it writes), in its order."""

RING_SLOTS: tuple[str, ...]
"""The ChannelHistory slots `Rings` reads and moves on, in its order."""

class Writer:
    """Points into four columns: int64 time (ns), float64 value, uint16 alarm, int32 slot."""

    def __init__(
        self,
        t: npt.NDArray[np.int64],
        v: npt.NDArray[np.float64],
        a: npt.NDArray[np.uint16],
        c: npt.NDArray[np.int32],
    ) -> None: ...
    def write(
        self, value: object, seconds: int, nanoseconds: int, severity: int, status: int, slot: int
    ) -> bool:
        """One point at `j`; True when the columns are full after it. TypeError for a value
        that is not a number, ValueError for anything out of its column's range; a point that
        raises is not counted."""

    j: int
    """Where the next point goes (0 to `size`)."""

    @property
    def size(self) -> int:
        """Points the columns hold."""

class Pending:
    """The tick's writes: the pending update of each channel of exactly `cls` (Channel) into
    the compiled writer its `history_write` is bound to, read from the channel's slots."""

    def __init__(self, cls: type) -> None: ...
    def write(self, channels: list[Any], start: int) -> int:
        """From channels[start] on: the index of a channel left to Python (not written),
        -(index + 1) after a point that filled its writer (written; flush it), else
        len(channels)."""

class Rings:
    """The journal's flush into the rings of instances of exactly `cls` (ChannelHistory), which
    hold `size` points and fold every `every`."""

    def __init__(self, cls: type, size: int, every: int) -> None: ...
    def flush(
        self,
        t: npt.NDArray[np.int64],
        v: npt.NDArray[np.float64],
        a: npt.NDArray[np.uint16],
        c: npt.NDArray[np.int32],
        n: int,
        raw_t: npt.NDArray[np.int64],
        raw_v: npt.NDArray[np.float64],
        raw_a: npt.NDArray[np.uint16],
        by_slot: list[Any],
    ) -> list[Any] | None:
        """The journal's n points into their slots' rows (a slot without a history: not
        written), each history's index moved on as ChannelHistory.advance does, all checked
        first; the histories whose waiting points should now be folded, or None, with nothing
        written, when a slot has more than `every` points."""

def fold(
    t: npt.NDArray[np.int64],
    v: npt.NDArray[np.float64],
    a: npt.NDArray[np.uint16],
    start: int,
    k: int,
    width: int,
) -> list[tuple[int, float, float, float, float, int, int]]:
    """The k points of a ring from `start` on (across its end) as buckets of `width` ns:
    (start, min, max, sum, last, count, highest severity) per run of one t // width, as
    numpy's reductions give them."""
