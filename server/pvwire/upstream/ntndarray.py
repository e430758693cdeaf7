"""NTNDArray (areaDetector's image type over PVA) to a C-order ndarray and its colour mode.

PROTOCOL.md sections 4.5 and 5: an image arrives as an ndarray whose dims are the NTNDArray
`dimension` sizes reversed (NTNDArray lists the fastest-varying dimension first), and metadata
`colorMode` names the layout: `mono` [H, W], `RGB1` [H, W, 3], `RGB2` [H, 3, W], `RGB3` [3, H, W].

Compressed frames (`codec.name` set by areaDetector's NDPluginCodec) are decoded here, on the
server: measured in bench/codecs.py, decoding a 4-megapixel uint16 frame costs 2-6 ms of one core
(lz4, bslz4, blosc) while passing it through would put a codec library into every client and make
each browser tab decode every frame on its main thread. The frame's element type before
compression is NDPluginCodec's `codec.parameters` (areaDetector's NDDataType_t number).
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from .values import UnsupportedValue

__all__ = ["COLOR_MODES", "color_mode", "decode_ntndarray", "frame_dtype"]

# areaDetector's NDColorMode_t, by number (the `ColorMode` attribute).
COLOR_MODES = ("mono", "Bayer", "RGB1", "RGB2", "RGB3", "YUV444", "YUV422", "YUV411")
# areaDetector's NDDataType_t, by number (NDPluginCodec's `codec.parameters`).
_ND_DTYPES = tuple(
    np.dtype(t) for t in ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8")
)


def _codec(v: Any) -> str:
    try:
        return str(v["codec.name"])
    except (KeyError, AttributeError):
        return ""


def frame_dtype(v: Any) -> np.dtype[Any]:
    """The element type of the frame as the detector made it (before any compression)."""
    if _codec(v):
        code = v["codec.parameters"]
        if not isinstance(code, int) or not 0 <= code < len(_ND_DTYPES):
            raise UnsupportedValue(f"NTNDArray codec.parameters {code!r} names no element type")
        return _ND_DTYPES[code]
    return np.asarray(v["value"]).dtype


def _dims(v: Any) -> list[int]:
    """The `dimension` sizes in NTNDArray order (fastest-varying first)."""
    return [int(d["size"]) for d in v["dimension"]]


def color_mode(v: Any) -> str | None:
    """The frame's colour mode: the `ColorMode` attribute, else what the dims say, else None."""
    dims = _dims(v)
    for attr in v["attribute"]:
        if attr["name"] == "ColorMode":
            number = attr["value"]
            if isinstance(number, int) and 0 <= number < len(COLOR_MODES):
                return COLOR_MODES[number]
    if len(dims) == 2:
        return "mono"
    if len(dims) == 3 and dims.count(3) >= 1:
        return ("RGB1", "RGB2", "RGB3")[dims.index(3)]  # ADViewers guess the same way
    return None


def decode_ntndarray(v: Any) -> np.ndarray[Any, Any]:
    """The frame of `v` as a C-order ndarray (decompressed when `codec.name` says so)."""
    dims = _dims(v)
    codec = _codec(v)
    if codec:
        arr = _decompress(codec, np.asarray(v["value"]), frame_dtype(v), dims)
    else:
        arr = np.asarray(v["value"])
    # A frame whose dims do not match its data (an empty frame, a detector mid-reconfiguration)
    # travels flat: its elements are right, only the shape is unknown.
    if dims and math.prod(dims) == arr.size:
        return arr.reshape(dims[::-1])
    return arr.reshape(-1)


def _decompress(
    codec: str, raw: np.ndarray[Any, Any], dtype: np.dtype[Any], dims: list[int]
) -> np.ndarray[Any, Any]:
    count = math.prod(dims) if dims else 0
    data = raw.view(np.uint8) if raw.dtype.itemsize == 1 else raw.tobytes()
    try:
        if codec == "lz4":
            import lz4.block

            out = lz4.block.decompress(data, uncompressed_size=count * dtype.itemsize)
            return np.frombuffer(out, dtype)
        if codec == "bslz4":
            import bitshuffle

            flat = bitshuffle.decompress_lz4(np.asarray(data, np.uint8), (count,), dtype, 0)
            return np.asarray(flat)
        if codec == "blosc":
            import blosc

            return np.frombuffer(blosc.decompress(bytes(data)), dtype)
        if codec == "jpeg":
            from PIL import Image

            with Image.open(io.BytesIO(bytes(data))) as img:
                return np.asarray(img).reshape(-1)  # uint8; RGB comes pixel-interleaved
    except UnsupportedValue:
        raise
    except Exception as exc:  # a corrupt frame fails this channel, named, not the server
        raise UnsupportedValue(f"NTNDArray {codec} frame does not decode: {exc}") from exc
    raise UnsupportedValue(f"NTNDArray codec {codec!r} is not supported (lz4, bslz4, blosc, jpeg)")
