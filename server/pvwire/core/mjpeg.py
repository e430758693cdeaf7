"""MJPEG feeds: one channel's images as JPEG frames, encoded once per option set for every viewer.

cs-web-lib's Image widget (and the web screens of sites that run areaDetector's ffmpegServer)
show an image as an MJPEG URL in an `<img>`, not as PV arrays. A feed is one view client per
(channel, options): it attaches to the channel's view as a stream client does, and at each tick
that brought a new image it encodes ONE JPEG, in the feeds' own threads, which every viewer of
that feed then sends. A viewer only ever takes the newest frame: a slow one skips frames, nothing
queues. Options are rounded to a few levels (`MjpegOptions.rounded`), so that viewers asking for
nearly the same thing share a feed: the work grows with the levels in use, not with the askers.

The picture is what the demo page's ImageView draws (PROTOCOL.md section 4.5): grey for `mono`
(and for a layout it cannot tell the colour of: the last two dims, first plane), RGB for
`RGB1`/`RGB2`/`RGB3`; the values scaled from the frame's own minimum and maximum into 256 equal
bins (so a uint8 frame using 0...255 is kept as it is); frames larger than `max_pixels`
subsampled by a whole factor per axis, as `maxPixels` does for `/stream`.
"""

from __future__ import annotations

import asyncio
import bisect
import io
import logging
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image

from ..access.identity import Identity
from ..model import ConnState, Value
from ..wire.tokens import Claims
from .reduce import Reduction, reduce_value

__all__ = [
    "FPS_LEVELS",
    "QUALITY_LEVELS",
    "FeedHost",
    "Frame",
    "MjpegFeed",
    "MjpegOptions",
    "MjpegStats",
    "NotAnImage",
    "encode_jpeg",
    "to_8bit",
]

log = logging.getLogger("pvwire.mjpeg")


class NotAnImage(ValueError):
    """The channel's value cannot be shown as a picture; the message says why."""


# The levels options are rounded to: a feed per distinct option set costs a JPEG per frame, so
# a client must not be able to make many of them by asking 20.00, 20.01, ... frames per second.
FPS_LEVELS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 50.0)
QUALITY_LEVELS = (5, 25, 50, 75, 85, 95)


@dataclass(frozen=True, slots=True)
class MjpegOptions:
    max_pixels: int
    quality: int
    fps: float

    def rounded(self) -> MjpegOptions:
        """The options a feed serves: `fps` down to a level of FPS_LEVELS (never faster than
        asked), `quality` to the nearest of QUALITY_LEVELS, `max_pixels` down to a power of two
        (never larger than asked)."""
        fps = FPS_LEVELS[max(0, bisect.bisect_right(FPS_LEVELS, self.fps + 1e-9) - 1)]
        quality = min(QUALITY_LEVELS, key=lambda q: (abs(q - self.quality), q))
        pixels = 1 << int(math.log2(self.max_pixels)) if self.max_pixels > 0 else 0
        return MjpegOptions(pixels, quality, fps)

    def query(self) -> str:
        return f"maxPixels={self.max_pixels}&quality={self.quality}&fps={self.fps:g}"


@dataclass(frozen=True, slots=True)
class MjpegStats:
    """What `/metrics` shows of the MJPEG endpoint (counters include feeds closed since)."""

    feeds: int = 0
    viewers: int = 0
    encodes: int = 0
    frames_sent: int = 0
    bytes_sent: int = 0


@dataclass(frozen=True, slots=True)
class Frame:
    seq: int  # 1, 2, ... per feed: a viewer sends a frame newer than the one it sent last
    jpeg: bytes
    width: int
    height: int


# Where the rows, columns and colour planes are, by colorMode (PROTOCOL.md section 4.5).
_RGB_AXES = {"RGB1": (0, 1, 2), "RGB2": (0, 2, 1), "RGB3": (1, 2, 0)}


def to_8bit(value: Value, color_mode: str | None) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The picture of an image value: [H, W] grey or [H, W, 3] RGB, as uint8."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        raise NotAnImage(f"the value is not a numeric array ({type(value).__name__})")
    if value.ndim < 2:
        raise NotAnImage(f"the value is a {value.ndim}-D array, not an image")
    axes = _RGB_AXES.get(color_mode or "")
    if value.ndim == 3 and axes is not None and value.shape[axes[2]] == 3:
        picture = np.transpose(value, axes)
    else:
        index = (0,) * (value.ndim - 2)  # grey: the last two dims, the first plane
        picture = value[index]
    if picture.size == 0:
        raise NotAnImage("the image is empty")
    data = picture.astype(np.float64, copy=False) if picture.dtype.kind == "b" else picture
    finite = data[np.isfinite(data)] if data.dtype.kind == "f" else data
    if finite.size == 0:
        return np.zeros(picture.shape, dtype=np.uint8)
    low, high = float(finite.min()), float(finite.max())
    span = high - low if high > low else 1.0
    # 256 equal bins over [low, high], as the page's ImageView: [0, 255] maps to itself.
    scaled = (np.nan_to_num(data.astype(np.float32), nan=low) - low) * np.float32(256.0 / span)
    out: np.ndarray[Any, np.dtype[np.uint8]] = np.clip(scaled, 0, 255).astype(np.uint8)
    return out


def encode_jpeg(
    value: Value, color_mode: str | None, options: MjpegOptions
) -> tuple[bytes, int, int]:
    """(JPEG bytes, width, height) of an image value, subsampled to `max_pixels` at most."""
    meta = {"colorMode": color_mode} if color_mode else {}
    reduced, _ = reduce_value(value, meta, Reduction(pixels=options.max_pixels))
    picture = to_8bit(reduced, color_mode)
    image = Image.fromarray(picture, "RGB" if picture.ndim == 3 else "L")
    out = io.BytesIO()
    image.save(out, "JPEG", quality=options.quality)
    return out.getvalue(), image.width, image.height


class MjpegFeed:
    """One channel's JPEG frames for one option set: a view client (core/clients.py), but not a
    connection: the hub's sessions, per-address counts and stream metrics do not hold it.

    `open(identity)` attaches it to the channel's view for that identity (read access checked
    there, as for a subscription); viewers then wait on `next_frame`. Encoding runs in
    `executor` (the endpoint's own threads), at most one at a time per feed; an image that
    arrives meanwhile is encoded next (the newest only).
    """

    endpoint = "mjpeg"

    def __init__(
        self,
        number: int,
        channel_id: str,
        options: MjpegOptions,
        host: FeedHost,
        executor: Executor,
        encode: Callable[[Value, str | None, MjpegOptions], tuple[bytes, int, int]] = encode_jpeg,
    ) -> None:
        self.number = number
        self.address = ""  # whose identity opened it (its cost counts against that address)
        self.channel_id = channel_id
        self.options = options
        self.channel_count = 1
        self.conflated = 0  # images not encoded because a newer one came first
        self.connected_at = time.monotonic()
        self.encodes = 0
        self.frame: Frame | None = None
        self.error = ""  # why there is no (new) frame, for a viewer waiting ("": none known)
        self.viewers = 0
        self._host = host
        self._executor = executor
        self._encode = encode
        self._view: Any = None
        self._claims: Claims | None = None
        self._encoding = False
        self._again = False
        self._changed: asyncio.Event = asyncio.Event()
        self._bytes_sent = 0
        self._frames_sent = 0
        self._close: tuple[int, str] | None = None

    # --- viewers ------------------------------------------------------------------------------

    def open(self, identity: Identity) -> None:
        """Attach to the channel for `identity`; raises what the hub raises (AttachRefused)."""
        now = int(time.time())
        claims = Claims(
            (self.channel_id,),
            "LATEST",
            self.options.fps,
            now,
            now,
            identity.user,
            tuple(sorted(identity.groups)),
            identity.source,
            identity.address,
        )
        self.address = identity.address  # what the hub holds its channel for
        self._view = self._host.open_view(claims, self, 0)
        self._claims = claims
        self._start_encode()  # a channel already watched has its image now

    async def next_frame(self, after: int) -> Frame:
        """The newest frame with `seq` > `after`, waiting for one if needed."""
        while self.frame is None or self.frame.seq <= after:
            if self._close is not None:
                raise ConnectionAbortedError(self._close[1])
            self._changed.clear()
            await self._changed.wait()
        return self.frame

    def sent(self, nbytes: int) -> None:
        self._frames_sent += 1
        self._bytes_sent += nbytes

    def _publish(self) -> None:
        self._changed.set()

    # --- encoding -----------------------------------------------------------------------------

    def _start_encode(self) -> None:
        if self._encoding:
            self._again = True
            self.conflated += 1
            return
        view = self._view
        if view is None:
            return
        ch = view.channels[0]
        if ch.state != ConnState.CONNECTED or ch.value is None:
            self.error = ch.reason or f"{self.channel_id} is not connected"
            return
        self._encoding = True
        self._again = False
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(
            self._executor, self._encode, ch.value, ch.meta.color_mode, self.options
        )
        work.add_done_callback(self._encoded)

    def _encoded(self, work: asyncio.Future[tuple[bytes, int, int]]) -> None:
        self._encoding = False
        if self._close is not None:
            return
        try:
            jpeg, width, height = work.result()
        except NotAnImage as exc:
            self.error = f"{self.channel_id}: {exc}"
        except Exception as exc:  # one feed's failure stays with its viewers
            log.exception("encoding a JPEG of %s failed", self.channel_id)
            self.error = f"{self.channel_id}: the image could not be encoded ({exc})"
        else:
            self.encodes += 1
            seq = self.frame.seq + 1 if self.frame is not None else 1
            self.frame = Frame(seq, jpeg, width, height)
            self.error = ""
        self._publish()
        if self._again:
            self._start_encode()

    # --- Client (core/clients.py): what the tick and the hub ask of it -------------------------

    @property
    def queued_bytes(self) -> int:
        return 0  # viewers hold at most the frame they are sending

    @property
    def frames_sent(self) -> int:
        return self._frames_sent

    @property
    def bytes_sent(self) -> int:
        return self._bytes_sent

    @property
    def close_request(self) -> tuple[int, str] | None:
        return self._close

    @property
    def attachments(self) -> Mapping[int, object]:
        return {0: self._view} if self._view is not None else {}

    @property
    def claims(self) -> Mapping[int, Claims]:
        return {0: self._claims} if self._claims is not None else {}

    def collect(self, att: int, view: object) -> bool:
        return True  # flush_tick encodes: once per tick, whatever changed

    def flush_tick(self) -> None:
        self._start_encode()

    def housekeeping(self, now: float) -> None:
        pass

    def request_close(self, code: int, reason: str) -> None:
        if self._close is None:
            self._close = (code, reason)
            self._publish()

    def end_attachment(self, att: int, code: int, message: str) -> None:
        # The rules changed and the identity it was opened for may no longer read the channel:
        # its viewers are refused as a subscription would be; each may ask again.
        self.request_close(code, message)

    def close(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            self._host.close_view(view, self, 0)
        self.request_close(1001, "feed closed")


class FeedHost(Protocol):
    """What a feed needs of the hub (core/hub.py's Hub)."""

    def open_view(self, claims: Claims, session: Any, att: int) -> Any: ...
    def close_view(self, view: Any, session: Any, att: int) -> None: ...
