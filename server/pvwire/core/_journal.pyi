"""The history journal's writer (_journal.c; built by `make`), as `history.PyWriter` behaves."""

import numpy as np
import numpy.typing as npt

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
