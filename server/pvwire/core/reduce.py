"""Server-side reduction of big arrays, for displays that opted in (PROTOCOL.md section 4.6).

A page plotting a 1,000,000-point waveform on a 1,500-pixel canvas shows one min/max pair per
pixel column: the server sends those 3,000 numbers instead of 8 MB. Receiving the 8 MB message
cost headless Chromium about 18 ms of its main thread per MB (WebSocket frames arriving through
Mojo and assembled into an ArrayBuffer, before any script runs), which capped the page at about
4.6 frames a second; a reduced frame is 24 KB. Images with more pixels than asked for are
subsampled by a whole factor per axis, as the page's ImageView already drew them.

A reduction is computed once per channel state and option set (Channel caches the body), whatever
the number of views and clients that share the options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..limits import MAX_COLUMNS, MIN_PIXELS
from ..model import Value

__all__ = ["MAX_COLUMNS", "MIN_PIXELS", "NO_REDUCTION", "Reduction", "reduce_value"]

# Bounds of the subscription options: a display wider than 100,000 columns does not exist, and a
# frame of fewer than 1,024 pixels is not worth reducing.

# Which dims of a 3-D image are the rows and columns, by colorMode (PROTOCOL.md section 4.5).
_SPATIAL_3D = {"RGB1": (0, 1), "RGB2": (0, 2), "RGB3": (1, 2)}


@dataclass(frozen=True, slots=True)
class Reduction:
    """What a subscription asked for; 0 turns a reduction off."""

    columns: int = 0  # 1-D arrays of more than 2 x columns elements -> min/max per column
    pixels: int = 0  # images of more pixels -> every k-th row and column, at most this many

    def __bool__(self) -> bool:
        return bool(self.columns or self.pixels)


NO_REDUCTION = Reduction()


def reduce_value(
    value: Value, metadata: dict[str, Any], r: Reduction
) -> tuple[Value, dict[str, Any] | None]:
    """The value to send and the `reduced` metadata entry, or (value, None) when not reduced."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        return value, None
    if value.ndim == 1 and r.columns and value.shape[0] > 2 * r.columns:
        return _min_max(value, r.columns), {"method": "minmax", "from": [value.shape[0]]}
    if value.ndim >= 2 and r.pixels:
        return _subsample(value, metadata.get("colorMode"), r.pixels)
    return value, None


def _min_max(a: np.ndarray[Any, Any], columns: int) -> np.ndarray[Any, Any]:
    """[min0, max0, min1, max1, ...]: column c covers a[c*n//columns : (c+1)*n//columns].

    NaN propagates as in numpy's min and max (a column holding a NaN reports NaN). Interleaved so
    that a client plotting the array as a line draws the envelope, one vertical stroke per
    column. 1,000,000 float64: ~2 ms here, against ~10 ms to send the full array to one client.
    """
    n = a.shape[0]
    if a.dtype == np.bool_:
        a = a.view(np.uint8)
    starts = (np.arange(columns, dtype=np.int64) * n) // columns
    out = np.empty(2 * columns, dtype=a.dtype)
    out[0::2] = np.minimum.reduceat(a, starts)
    out[1::2] = np.maximum.reduceat(a, starts)
    return out


def _subsample(
    a: np.ndarray[Any, Any], color_mode: object, pixels: int
) -> tuple[Value, dict[str, Any] | None]:
    if a.ndim == 2:
        rows, cols = 0, 1
    elif a.ndim == 3 and isinstance(color_mode, str) and color_mode in _SPATIAL_3D:
        rows, cols = _SPATIAL_3D[color_mode]
    else:
        return a, None  # a layout we cannot tell the rows of: sent whole
    count = a.shape[rows] * a.shape[cols]
    if count <= pixels:
        return a, None
    step = math.ceil(math.sqrt(count / pixels))
    while math.ceil(a.shape[rows] / step) * math.ceil(a.shape[cols] / step) > pixels:
        step += 1  # ceil of the square root can fall one short for lopsided shapes
    index: list[slice] = [slice(None)] * a.ndim
    index[rows] = index[cols] = slice(None, None, step)
    # One copy of the kept pixels (1/step^2 of the frame): the wire needs contiguous bytes.
    out = np.ascontiguousarray(a[tuple(index)])
    return out, {"method": "subsample", "from": list(a.shape), "step": step}
