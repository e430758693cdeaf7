"""The demo IOC's images: real PVA NTNDArrays from a p4p server inside the demo IOC's process.

QSRV serves records, not NTNDArrays, so the demo IOC's console starts this p4p server next to
it (`start_demo_ioc`). It shares the IOC's PVA broadcast port: pvxs passes a search that reached
one server on a port to the others on the same host, so clients need no extra address.

- `IMAGE`: 512 x 512 uint16, grey, the `sim://image` pattern moving at 10 Hz.
- `IMAGE:RGB`: 96 x 64 uint8 RGB1 colour test card, fixed: pixel (x, y) is `rgb_card_pixel`.
- `IMAGE:LZ4`: `IMAGE:RGB`'s red plane as uint16 x 257, compressed as NDPluginCodec's lz4 does.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

__all__ = ["rgb_card", "rgb_card_pixel", "serve"]

IMAGE_SIZE = 512
IMAGE_RATE = 10.0
CARD_WIDTH, CARD_HEIGHT = 96, 64

_running: list[Any] = []  # the server and its thread, kept alive for the process's life


def rgb_card_pixel(x: int, y: int) -> tuple[int, int, int]:
    return (x * 2) % 256, (y * 4) % 256, (x + y) % 256


def rgb_card() -> np.ndarray[Any, np.dtype[np.uint8]]:
    """[height, width, 3] uint8, RGB1 layout (C order)."""
    x = np.arange(CARD_WIDTH)[None, :]
    y = np.arange(CARD_HEIGHT)[:, None]
    planes = ((x * 2) % 256 + 0 * y, (y * 4) % 256 + 0 * x, (x + y) % 256)
    return np.stack(planes, axis=-1).astype(np.uint8)


def _stamped(v: Any) -> Any:
    s, ns = divmod(time.time_ns(), 1_000_000_000)
    v["timeStamp.secondsPastEpoch"] = s
    v["timeStamp.nanoseconds"] = ns
    return v


def _lz4_frame(nt: Any, grey: np.ndarray[Any, np.dtype[np.uint16]]) -> Any:
    import lz4.block

    v = _stamped(nt.wrap(grey))
    payload = lz4.block.compress(grey.tobytes(), store_size=False)
    v["value"] = ("ubyteValue", np.frombuffer(payload, np.uint8))
    v["codec.name"] = "lz4"
    v["codec.parameters"] = 3  # NDUInt16
    v["compressedSize"] = len(payload)
    return v


def serve(prefix: str, broadcast_port: int) -> None:
    """Start the image server and its 10 Hz thread (returns at once)."""
    from p4p.nt import NTNDArray
    from p4p.server import Server, StaticProvider
    from p4p.server.thread import SharedPV
    from pvwire.loopback import loopback_env
    from pvwire.upstream.sim_image import image_frame

    nt = NTNDArray()
    params = {"width": IMAGE_SIZE, "height": IMAGE_SIZE, "dtype": "uint16", "color": "mono"}
    card = rgb_card()
    moving = SharedPV(initial=_stamped(nt.wrap(image_frame(params, 0))))
    fixed = SharedPV(initial=_stamped(nt.wrap(card)))
    compressed = SharedPV(initial=_lz4_frame(nt, card[:, :, 0].astype(np.uint16) * 257))
    provider = StaticProvider("demo-images")
    provider.add(f"{prefix}IMAGE", moving)
    provider.add(f"{prefix}IMAGE:RGB", fixed)
    provider.add(f"{prefix}IMAGE:LZ4", compressed)
    conf = {
        **{k: v for k, v in loopback_env().items() if k.startswith("EPICS_PVA")},
        "EPICS_PVAS_SERVER_PORT": "0",
        "EPICS_PVAS_BROADCAST_PORT": str(broadcast_port),
    }
    server = Server(providers=[provider], conf=conf, useenv=False)

    def run() -> None:
        k = 0
        period = 1.0 / IMAGE_RATE
        next_at = time.monotonic()
        while True:
            k += 1
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))
            frame = _stamped(nt.wrap(image_frame(params, k)))
            frame["uniqueId"] = k
            moving.post(frame)

    thread = threading.Thread(target=run, name="demo-images", daemon=True)
    thread.start()
    _running.extend((server, thread))
