"""`sim://image`: a moving test pattern, grey or RGB1, of any of five element types.

Frame k is the pattern rotated left by k x `step` columns. The pattern is computed once per
(width, height, dtype, color) and cached twice as wide, so a frame is one contiguous slice copy:
for 2048 x 2048 uint16 that is 8 MB of memcpy (about 2 ms here) where computing the pattern takes
about 400 ms, which on the event loop would stall every stream.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..limits import integer
from ..model import Metadata

__all__ = ["IMAGE_DTYPES", "image_frame", "image_metadata", "image_step"]

# Element types and the range the pattern spans in each (also the metadata `display` limits).
IMAGE_DTYPES: dict[str, tuple[float, float]] = {
    "uint8": (0.0, 255.0),
    "uint16": (0.0, 65535.0),
    "int32": (-1_000_000.0, 1_000_000.0),
    "float32": (0.0, 1.0),
    "float64": (0.0, 1.0),
}
_CACHE_BYTES = integer("sim_image_cache_bytes")  # two 2048 x 2048 float64 patterns, doubled
_patterns: dict[tuple[int, int, str, str], np.ndarray[Any, Any]] = {}


def image_step(width: int) -> int:
    """Columns the pattern moves per frame: across the whole width in 64 frames."""
    return max(1, width // 64)


def image_metadata(p: dict[str, Any], description: str) -> Metadata:
    width, height = int(p["width"]), int(p["height"])
    colours = 3 if p["color"] == "RGB1" else 1
    return Metadata(
        p["dtype"],
        width * height * colours,
        description,
        "",
        0 if p["dtype"] in ("uint8", "uint16", "int32") else 3,
        display=IMAGE_DTYPES[p["dtype"]],
        writable=False,
        color_mode=p["color"],
    )


def image_frame(p: dict[str, Any], k: int) -> np.ndarray[Any, Any]:
    """Frame `k`: [height, width] (mono) or [height, width, 3] (RGB1), C order, a fresh array."""
    width, height = int(p["width"]), int(p["height"])
    doubled = _pattern(width, height, p["dtype"], p["color"])
    shift = (k * image_step(width)) % width
    return doubled[:, shift : shift + width].copy()


def _pattern(width: int, height: int, dtype: str, color: str) -> np.ndarray[Any, Any]:
    key = (width, height, dtype, color)
    table = _patterns.pop(key, None)
    if table is None:
        table = _compute(width, height, dtype, color)
        table.flags.writeable = False
        while _patterns and sum(t.nbytes for t in _patterns.values()) + table.nbytes > _CACHE_BYTES:
            del _patterns[next(iter(_patterns))]  # least recently used first
    _patterns[key] = table  # most recently used last
    return table


def _compute(width: int, height: int, dtype: str, color: str) -> np.ndarray[Any, Any]:
    # Periodic in x over the width, so the rotation has no seam: diagonal stripes, vertical
    # bands, and a bright square that shows the motion.
    x = np.arange(width, dtype=np.float64)[None, :] * (2 * math.pi / width)
    y = np.arange(height, dtype=np.float64)[:, None] * (2 * math.pi / height)
    grey = 0.5 + 0.25 * np.sin(2 * x) + 0.25 * np.cos(3 * y + x)
    x0, y0 = width // 4, height // 4
    grey[y0 : y0 + max(1, height // 8), x0 : x0 + max(1, width // 8)] = 1.0
    if color == "RGB1":
        planes = (grey, 0.5 + 0.5 * np.sin(x + 2 * y), 1.0 - grey)
        unit = np.stack(planes, axis=-1)
    else:
        unit = grey
    lo, hi = IMAGE_DTYPES[dtype]
    scaled = lo + unit * (hi - lo)
    if np.dtype(dtype).kind in "iu":
        scaled = np.rint(scaled)
    frame = scaled.astype(dtype)
    return np.ascontiguousarray(np.concatenate((frame, frame), axis=1))
