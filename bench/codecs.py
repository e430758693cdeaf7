"""areaDetector codecs: what decoding a compressed NTNDArray frame costs on the server.

For each codec NDPluginCodec offers, a 2048 x 2048 uint16 frame (the `sim://image` pattern, plus
Poisson-like noise as a detector has) is compressed as NDPluginCodec does and then decoded the
way `pvwire.upstream.ntndarray` decodes it, through a real p4p NTNDArray Value. Reports the
compressed size and the decode time (median of `--repeat`), and the cost of the alternative,
passing the compressed bytes through: what the wire saves at 10 Hz.

    python -m bench.codecs [--size 2048] [--repeat 20]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from typing import Any

import bitshuffle
import blosc
import lz4.block
import numpy as np
from p4p.nt import NTNDArray
from PIL import Image
from pvwire.upstream.ntndarray import decode_ntndarray
from pvwire.upstream.sim_image import image_frame


def frame(size: int) -> np.ndarray[Any, np.dtype[np.uint16]]:
    params = {"width": size, "height": size, "dtype": "uint16", "color": "mono"}
    clean = image_frame(params, 0) >> 4  # a 12-bit detector
    noise = np.random.default_rng(1).poisson(20, clean.shape)
    return (clean + noise).astype(np.uint16)


def compressed(codec: str, img: np.ndarray[Any, Any]) -> tuple[bytes, int]:
    """The payload NDPluginCodec would send, and its codec.parameters (NDDataType_t)."""
    if codec == "lz4":
        return lz4.block.compress(img.tobytes(), store_size=False), 3
    if codec == "bslz4":
        return bitshuffle.compress_lz4(img.reshape(-1)).tobytes(), 3
    if codec == "blosc":
        return blosc.compress(img.tobytes(), typesize=2, shuffle=blosc.BITSHUFFLE), 3
    grey8 = (img >> 4).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(grey8).save(out, "JPEG", quality=90)
    return out.getvalue(), 1


def measure(size: int, repeat: int) -> list[dict[str, Any]]:
    img = frame(size)
    nt = NTNDArray()
    results = []
    for codec in ("lz4", "bslz4", "blosc", "jpeg"):
        payload, code = compressed(codec, img)
        v = nt.wrap(img if codec != "jpeg" else (img >> 4).astype(np.uint8))
        v["value"] = ("ubyteValue", np.frombuffer(payload, np.uint8))
        v["codec.name"] = codec
        v["codec.parameters"] = code
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = decode_ntndarray(v)
            times.append(time.perf_counter() - t0)
        if codec != "jpeg" and not np.array_equal(out, img):
            raise AssertionError(f"{codec} did not decode to the frame")
        raw = img.nbytes if codec != "jpeg" else img.size
        ms = statistics.median(times) * 1e3
        results.append(
            {
                "codec": codec,
                "raw_MB": raw / 1e6,
                "compressed_MB": len(payload) / 1e6,
                "ratio": raw / len(payload),
                "decode_ms": ms,
                "decode_MB_per_s": raw / 1e6 / (ms / 1e3),
                "wire_saved_MB_per_s_at_10Hz": (raw - len(payload)) * 10 / 1e6,
            }
        )
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    print(json.dumps({"size": args.size, "codecs": measure(args.size, args.repeat)}, indent=1))


if __name__ == "__main__":
    main()
