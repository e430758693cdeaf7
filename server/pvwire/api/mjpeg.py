"""`GET /mjpeg/{name}`: a channel's images as an MJPEG stream, for `<img src>`.

The format is areaDetector's ffmpegServer's (what cs-web-lib's Image widget and sites' web
screens are pointed at): `multipart/x-mixed-replace;boundary=BOUNDARY`, the body opening with
`--BOUNDARY`, each part `Content-Type: image/jpeg`, a blank line and the JPEG. Each part's header
block is sent right after the JPEG before it, not with the next frame: Chromium shows a part only
once the next part's header block has come, so a still image would otherwise never appear and a
live one would always be a frame late. The parts therefore carry no `Content-Length` (the next
JPEG's size is not known yet): readers find a part's end by the boundary, as Chromium does, and
ffmpeg's `mpjpeg` reader for a part without a length. A first part under 1 KiB carries a JPEG
comment that makes it 1 KiB: Chromium shows a cross-origin `<img>` only once it has that much.

The name is what cs-web-lib 0.10's Image widget puts in its URL (`ENDPOINT/NAME`, `pva://` cut
off and a trailing `:ARRAY` renamed `:OUTPUT`): a name without a scheme is an image channel of
`image_scheme` (PVA unless configured), and `NAME:OUTPUT` is `NAME:ARRAY` when that one gives a
picture (else `NAME:OUTPUT` itself). A full id (`sim://image?...`, URL-encoded) is taken as it is.

Options: `maxPixels` (frames subsampled by a whole factor to at most this many pixels; default
1,048,576), `quality` (JPEG quality 1-95, default 75), `fps` (frames per second at most, default
10), each rounded to a few levels (core/mjpeg.py); other query parameters are ignored. Viewers
with the same channel and rounded options share one feed: one JPEG per frame for all of them;
feeds are bounded per channel and per opening address (limits.py; an IPv6 client's /64 counts as
one). Read access is checked as for a subscription, for each viewer, and again at least every
second (rules can change). A viewer whose connection takes no frame for `stall_timeout_s` is
closed; until then it only ever gets the newest frame.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.types import Message, Receive, Scope, Send

from ..access.bound_key import bound_key
from ..access.identity import Authenticator, AuthError, Identity
from ..core.mjpeg import Frame, MjpegFeed, MjpegOptions, MjpegStats
from ..errors import PvwireError
from ..limits import MIN_PIXELS, integer, number
from ..wire.codes import FORBIDDEN, TOO_MANY_CHANNELS
from ..wire.session import AttachRefused

if TYPE_CHECKING:
    from ..core.hub import Hub

__all__ = ["MjpegEndpoint", "image_ids", "padded", "parse_options"]

log = logging.getLogger("pvwire.mjpeg")

BOUNDARY = b"BOUNDARY"  # ffmpegServer's
# Each JPEG is followed by the next part's header block at once (see above).
PART_HEAD = b"Content-Type: image/jpeg\r\n\r\n"
NEXT_PART = b"\r\n--" + BOUNDARY + b"\r\n" + PART_HEAD
RECHECK_S = 1.0  # a viewer waiting for a frame checks its read access again this often
# Chromium holds a cross-origin `<img>`'s response until it has this many bytes (its opaque-
# response blocking sniffs them): a still picture whose first part is shorter never showed.
SNIFFED = 1024

# (default, low, high) per option; pixels from core/reduce.py's least to a 4096 x 4096 frame,
# which Pillow encodes in about a tenth of a second.
_BOUNDS = {
    "maxPixels": (1 << 20, MIN_PIXELS, integer("mjpeg_max_pixels")),
    "quality": (75, 1, 95),  # Pillow advises against more than 95
    "fps": (10.0, 0.1, number("mjpeg_max_fps")),
}


class BadOptions(ValueError):
    pass


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_options(query: Mapping[str, str]) -> MjpegOptions:
    """The options of a request as asked (not yet rounded); BadOptions naming the first one out
    of bounds. Other parameters are not options and are ignored: a page adds its own (a
    cache-busting `?t=...`) to an `<img src>` it wants loaded again."""
    values: dict[str, float] = {}
    for name, (default, low, high) in _BOUNDS.items():
        text = query.get(name)
        try:
            value = float(text) if text is not None else float(default)
        except ValueError:
            raise BadOptions(f"{name}={text!r} is not a number") from None
        if not low <= value <= high or (name != "fps" and not value.is_integer()):
            kind = "a number" if name == "fps" else "an integer"
            raise BadOptions(f"{name} must be {kind} in [{_num(low)}, {_num(high)}], got {text}")
        values[name] = value
    return MjpegOptions(int(values["maxPixels"]), int(values["quality"]), values["fps"])


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def image_ids(name: str, image_scheme: str) -> list[str]:
    """The channel ids a `/mjpeg/{name}` may mean, the preferred first: a name without a scheme
    is of `image_scheme`; `X:OUTPUT` (cs-web-lib's rename of `X:ARRAY`) is `X:ARRAY` first."""
    full = name if "://" in name else f"{image_scheme}://{name}"
    if full.endswith(":OUTPUT"):
        return [full.removesuffix(":OUTPUT") + ":ARRAY", full]
    return [full]


class MjpegEndpoint:
    def __init__(self, hub: Hub, authenticator: Authenticator) -> None:
        self.hub = hub
        self.authenticator = authenticator
        self.max_viewers = integer("mjpeg_max_viewers")
        self.feeds_per_channel = integer("mjpeg_feeds_per_channel")
        self.feeds_per_address = integer("mjpeg_feeds_per_address")
        self.first_frame_s = number("mjpeg_first_frame_s")
        # Its own threads: the default executor also serves the OIDC key fetches, which a
        # burst of encodes must not hold up; at most one encode per feed waits for them.
        self.executor = ThreadPoolExecutor(
            integer("mjpeg_encode_threads"), thread_name_prefix="pvwire-mjpeg"
        )
        self.feeds: dict[tuple[str, MjpegOptions], MjpegFeed] = {}
        self.viewers: dict[str, int] = {}  # client address's bound key -> viewers open
        self._closed = MjpegStats()  # the counters of feeds closed so far

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/mjpeg/{name:path}", self.serve, methods=["GET"])
        return router

    def close(self) -> None:
        for feed in list(self.feeds.values()):
            feed.close()
        self.feeds.clear()
        self.executor.shutdown(wait=False, cancel_futures=True)

    @property
    def encodes(self) -> int:
        """JPEGs made by the feeds open now (tests and benchmarks count them)."""
        return sum(feed.encodes for feed in self.feeds.values())

    def stats(self) -> MjpegStats:
        feeds, c = list(self.feeds.values()), self._closed
        return MjpegStats(
            feeds=len(feeds),
            viewers=sum(self.viewers.values()),
            encodes=c.encodes + sum(f.encodes for f in feeds),
            frames_sent=c.frames_sent + sum(f.frames_sent for f in feeds),
            bytes_sent=c.bytes_sent + sum(f.bytes_sent for f in feeds),
        )

    async def serve(self, request: Request, name: str) -> Response:
        hub = self.hub
        peer = request.client.host if request.client else ""
        try:
            identity = self.authenticator.identify(request.headers, peer, "mjpeg")
        except AuthError as exc:
            return _text(401, str(exc))
        try:
            options = parse_options(request.query_params).rounded()
            candidates = [hub.resolve(i)[0] for i in image_ids(name, hub.settings.image_scheme)]
        except (BadOptions, PvwireError) as exc:
            return _text(400, str(exc))
        readable = [c for c in candidates if hub.may_read(identity, c)]
        if not readable:
            return _text(403, f"{identity.describe()} may not read {candidates[-1]}")
        address = identity.bound_key
        per_address = hub.settings.mjpeg_viewers_per_address
        if sum(self.viewers.values()) >= self.max_viewers:
            return _text(503, f"this server serves {self.max_viewers} MJPEG viewers at most")
        if self.viewers.get(address, 0) >= per_address:
            return _text(503, f"{per_address} MJPEG viewers from {address} already")
        feeds: list[MjpegFeed] = []
        refusal: _Refused | None = None
        try:
            for canonical in readable:
                try:
                    feeds.append(self._join(canonical, options, identity))
                except _Refused as exc:
                    refusal = refusal or exc
                except AttachRefused as exc:
                    statuses = {FORBIDDEN: 403, TOO_MANY_CHANNELS: 429}
                    status = statuses.get(exc.code, 404)
                    refusal = refusal or _Refused(status, str(exc))
        except BaseException:
            for feed in feeds:  # a fault joining a later candidate keeps no earlier one
                self.leave(feed, None)
            raise
        if not feeds:
            assert refusal is not None
            return _text(refusal.status, str(refusal))
        self.viewers[address] = self.viewers.get(address, 0) + 1
        try:
            first = await self._first_frame(feeds)
        except BaseException:
            # The viewer left (or the server stops) before its first picture: nothing is kept.
            for feed in feeds:
                self.leave(feed, None)
            self._uncount(address)
            raise
        for feed in feeds:
            if first is None or feed is not first[0]:
                self.leave(feed, None)
        if first is None:
            self._uncount(address)
            # The wait is what the answer names; the channel's own reason (its search gave up
            # after not_found_s, say) follows it.
            why = f"no image from {readable[-1]} within {self.first_frame_s:g} s"
            error = feeds[-1].error
            return _text(504, f"{why}: {error}" if error else why)
        feed, frame = first
        return _Stream(self, feed, frame, identity)

    async def _first_frame(self, feeds: list[MjpegFeed]) -> tuple[MjpegFeed, Frame] | None:
        """The first feed to give a picture (the earlier in `feeds` when at once) and its frame;
        None when none does within `first_frame_s`."""
        waits = {asyncio.ensure_future(feed.next_frame(0)): feed for feed in feeds}
        pending = set(waits)
        try:
            async with asyncio.timeout(self.first_frame_s):
                while pending:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for wait, feed in waits.items():  # in the order of preference
                        if wait.done() and not wait.cancelled() and wait.exception() is None:
                            return feed, wait.result()
        except TimeoutError:
            pass
        finally:
            for wait in waits:
                wait.cancel()
        return None

    def _join(self, canonical: str, options: MjpegOptions, identity: Identity) -> MjpegFeed:
        key = (canonical, options)
        feed = self.feeds.get(key)
        if feed is None or feed.close_request is not None:
            self._check_room(canonical, identity.bound_key)
            feed = MjpegFeed(self.hub.client_number(), canonical, options, self.hub, self.executor)
            feed.open(identity)  # raises AttachRefused before anything is kept
            self.feeds[key] = feed
        feed.viewers += 1
        return feed

    def _check_room(self, canonical: str, address: str) -> None:
        """Room for one more feed of `canonical`, opened from `address` (a bound key), or
        _Refused saying why."""
        same = [o for (c, o), f in self.feeds.items() if c == canonical and f.close_request is None]
        if len(same) >= self.feeds_per_channel:
            used = "; ".join(sorted(o.query() for o in same))
            raise _Refused(
                503,
                f"{canonical} is already served with {len(same)} option sets "
                f"(at most {self.feeds_per_channel}); ask for one of: {used}",
            )
        mine = sum(1 for f in self.feeds.values() if bound_key(f.address) == address)
        if mine >= self.feeds_per_address:
            raise _Refused(
                429,
                f"{address} has opened {mine} MJPEG feeds already "
                f"(at most {self.feeds_per_address}); ask for the same options",
            )

    def leave(self, feed: MjpegFeed, address: str | None) -> None:
        """A viewer of `feed` from `address` (a bound key) is gone (None: one of its
        candidates, never counted)."""
        if address is not None:
            self._uncount(address)
        feed.viewers -= 1
        if feed.viewers <= 0:
            key = (feed.channel_id, feed.options)
            if self.feeds.get(key) is feed:
                del self.feeds[key]
            c = self._closed
            self._closed = MjpegStats(
                encodes=c.encodes + feed.encodes,
                frames_sent=c.frames_sent + feed.frames_sent,
                bytes_sent=c.bytes_sent + feed.bytes_sent,
            )
            feed.close()  # the channel is released

    def _uncount(self, address: str) -> None:
        left = self.viewers.get(address, 0) - 1
        if left > 0:
            self.viewers[address] = left
        else:
            self.viewers.pop(address, None)

    def may_read(self, identity: Identity, canonical: str) -> bool:
        return self.hub.may_read(identity, canonical)


def padded(jpeg: bytes, size: int) -> bytes:
    """`jpeg` made at least `size` bytes long by a comment (a COM segment, which every JPEG
    decoder skips), put after the JFIF header (which must follow the start of image)."""
    short = size - len(jpeg)
    if short <= 0 or not jpeg.startswith(b"\xff\xd8"):
        return jpeg
    at = 2
    if jpeg[2:4] == b"\xff\xe0" and len(jpeg) >= 6:  # APP0: JFIF
        at = 4 + int.from_bytes(jpeg[4:6], "big")
    n = max(0, short - 4)  # the marker and the length take 4 bytes; a short JPEG: n < 1,024
    return jpeg[:at] + b"\xff\xfe" + (n + 2).to_bytes(2, "big") + b" " * n + jpeg[at:]


def _text(status: int, message: str) -> PlainTextResponse:
    return PlainTextResponse(message + "\n", status_code=status)


class _Stream(Response):
    """One viewer's multipart response: the newest frame each time its connection can take one."""

    def __init__(
        self, endpoint: MjpegEndpoint, feed: MjpegFeed, first: Frame, identity: Identity
    ) -> None:
        super().__init__(
            media_type=f"multipart/x-mixed-replace;boundary={BOUNDARY.decode()}",
            headers={"Cache-Control": "no-cache, no-store", "Pragma": "no-cache"},
        )
        # A stream has no length: Response put `content-length: 0` for its empty body.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._endpoint = endpoint
        self._feed = feed
        self._first = first
        self._identity = identity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint, feed = self._endpoint, self._feed
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            opening = b"--" + BOUNDARY + b"\r\n" + PART_HEAD
            jpeg = padded(self._first.jpeg, SNIFFED - len(opening) - len(NEXT_PART))
            frame: Frame | None = self._first
            while frame is not None:
                if not await self._send(send, opening + jpeg + NEXT_PART):
                    return
                opening = b""
                frame = await self._next(frame, gone)
                jpeg = frame.jpeg if frame is not None else b""
            if not gone.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            endpoint.leave(feed, self._identity.bound_key)

    async def _send(self, send: Send, part: bytes) -> bool:
        """Send one part; False when the viewer took nothing for `stall_timeout_s`."""
        stall = self._endpoint.hub.settings.stall_timeout_s
        message: Message = {"type": "http.response.body", "body": part, "more_body": True}
        try:
            # The server awaits its socket draining before it writes: a viewer that reads
            # nothing blocks here, and only here.
            await asyncio.wait_for(send(message), stall)
        except TimeoutError:
            log.info(
                "MJPEG viewer of %s took nothing for %g s: closed", self._feed.channel_id, stall
            )
            return False
        self._feed.sent(len(part))
        return True

    async def _next(self, frame: Frame, gone: asyncio.Future[None]) -> Frame | None:
        """The feed's next frame; None when the viewer is gone, may no longer read the channel,
        or the feed closed."""
        newer = asyncio.ensure_future(self._feed.next_frame(frame.seq))
        either: set[asyncio.Future[Any]] = {newer, gone}
        try:
            while True:
                await asyncio.wait(either, timeout=RECHECK_S, return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    return None
                if not self._endpoint.may_read(self._identity, self._feed.channel_id):
                    return None
                if newer.done():
                    try:
                        return newer.result()
                    except ConnectionAbortedError:
                        return None
        finally:
            newer.cancel()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
