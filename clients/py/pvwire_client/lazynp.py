"""numpy only when a value needs it: it costs ~0.15 s to import, more than a whole ``pvwire get``.

A value can only be a numpy object once something has imported numpy, so asking
``sys.modules`` answers "is this an array?" without importing it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["is_ndarray", "is_numpy", "tolist"]


def is_ndarray(x: object) -> TypeGuard[npt.NDArray[Any]]:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def is_numpy(x: object) -> bool:
    """A numpy array or numpy scalar (``np.float64(1.5)``)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray | np.generic)


def tolist(x: Any) -> Any:
    """A numpy array as nested lists, a numpy scalar as the Python number; else ``x`` itself."""
    return x.tolist() if is_numpy(x) else x
