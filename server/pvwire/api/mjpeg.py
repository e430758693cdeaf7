"""`GET /mjpeg/{channel id}`: a channel's images as an MJPEG stream, for `<img src>`.

The format is areaDetector's ffmpegServer's (what cs-web-lib's Image widget and sites' web
screens are pointed at): `multipart/x-mixed-replace;boundary=BOUNDARY`, the body opening with
`--BOUNDARY`, then per frame `Content-Type: image/jpeg`, `Content-Length: N`, a blank line, the
JPEG, and the boundary again at once, so a browser shows each frame as soon as it arrives.

Options: `maxPixels` (frames subsampled by a whole factor to at most this many pixels; default
1,048,576), `quality` (JPEG quality 1-95, default 75), `fps` (frames per second at most, default
10). Viewers with the same channel and options share one feed (core/mjpeg.py): one JPEG per frame
for all of them. Read access is checked as for a subscription, for each viewer, and again before
every frame (rules can change). A viewer whose connection takes no frame for `stall_timeout_s`
is closed; until then it only ever gets the newest frame.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.types import Message, Receive, Scope, Send

from ..access.identity import Authenticator, AuthError, Identity
from ..core.clients import Client
from ..core.mjpeg import Frame, MjpegFeed, MjpegOptions
from ..errors import PvwireError
from ..limits import integer, number
from ..wire.session import AttachRefused

if TYPE_CHECKING:
    from ..core.hub import Hub

__all__ = ["MAX_VIEWERS", "MjpegEndpoint", "parse_options"]

log = logging.getLogger("pvwire.mjpeg")

MAX_VIEWERS = integer("mjpeg_max_viewers")  # MJPEG connections at once in one process
# How long a new viewer waits for the first picture before a 504.
FIRST_FRAME_S = number("mjpeg_first_frame_s")
BOUNDARY = b"BOUNDARY"  # ffmpegServer's

# (default, low, high) per option; pixels from 1,024 (core/reduce.py's MIN_PIXELS) to a
# 4096 x 4096 frame, which Pillow encodes in about a tenth of a second.
_BOUNDS = {
    "maxPixels": (1 << 20, 1024, 1 << 24),
    "quality": (75, 1, 95),  # Pillow advises against more than 95
    "fps": (10.0, 0.1, 50.0),
}


class BadOptions(ValueError):
    pass


def parse_options(query: Mapping[str, str]) -> MjpegOptions:
    """The options of a request; BadOptions naming the first one out of bounds."""
    unknown = sorted(set(query) - set(_BOUNDS))
    if unknown:
        raise BadOptions(f"unknown option {unknown[0]!r} (known: {', '.join(_BOUNDS)})")
    values: dict[str, float] = {}
    for name, (default, low, high) in _BOUNDS.items():
        text = query.get(name)
        try:
            value = float(text) if text is not None else float(default)
        except ValueError:
            raise BadOptions(f"{name}={text!r} is not a number") from None
        if not low <= value <= high or (name != "fps" and not value.is_integer()):
            kind = "a number" if name == "fps" else "an integer"
            raise BadOptions(f"{name} must be {kind} in [{low:g}, {high:g}], got {text}")
        values[name] = value
    return MjpegOptions(int(values["maxPixels"]), int(values["quality"]), values["fps"])


class MjpegEndpoint:
    def __init__(
        self, hub: Hub, authenticator: Authenticator, max_viewers: int = MAX_VIEWERS
    ) -> None:
        self.hub = hub
        self.authenticator = authenticator
        self.max_viewers = max_viewers
        self.feeds: dict[tuple[str, MjpegOptions], MjpegFeed] = {}
        self.viewers: dict[str, int] = {}  # client address -> viewers open

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/mjpeg/{channel_id:path}", self.serve, methods=["GET"])
        return router

    @property
    def encodes(self) -> int:
        """JPEGs made by the feeds open now (tests and benchmarks count them)."""
        return sum(feed.encodes for feed in self.feeds.values())

    async def serve(self, request: Request, channel_id: str) -> Response:
        hub = self.hub
        peer = request.client.host if request.client else ""
        try:
            identity = self.authenticator.identify(request.headers, peer, "mjpeg")
        except AuthError as exc:
            return _text(401, str(exc))
        try:
            options = parse_options(request.query_params)
            canonical = hub.resolve(channel_id)[0]
        except (BadOptions, PvwireError) as exc:
            return _text(400, str(exc))
        if not hub.may_read(identity, canonical):
            return _text(403, f"{identity.describe()} may not read {canonical}")
        address = identity.address
        per_address = hub.settings.max_connections_per_address
        if sum(self.viewers.values()) >= self.max_viewers:
            return _text(503, f"this server serves {self.max_viewers} MJPEG viewers at most")
        if self.viewers.get(address, 0) >= per_address:
            return _text(503, f"{per_address} MJPEG viewers from {address} already")
        try:
            feed = self._join(canonical, options, identity)
        except AttachRefused as exc:
            return _text(403, str(exc))
        self.viewers[address] = self.viewers.get(address, 0) + 1
        try:
            first = await asyncio.wait_for(feed.next_frame(0), FIRST_FRAME_S)
        except (TimeoutError, ConnectionAbortedError):
            why = feed.error or f"no image from {canonical} within {FIRST_FRAME_S:g} s"
            self.leave(feed, address)
            return _text(504, why)
        return _Stream(self, feed, first, identity, canonical)

    def _join(self, canonical: str, options: MjpegOptions, identity: Identity) -> MjpegFeed:
        key = (canonical, options)
        feed = self.feeds.get(key)
        if feed is None or feed.close_request is not None:
            feed = MjpegFeed(self.hub.client_number(), canonical, options, self.hub)
            feed.open(identity)  # raises AttachRefused before anything is kept
            self.feeds[key] = feed
            self.hub.add_session(cast(Client, feed))
        feed.viewers += 1
        return feed

    def leave(self, feed: MjpegFeed, address: str) -> None:
        left = self.viewers.get(address, 0) - 1
        if left > 0:
            self.viewers[address] = left
        else:
            self.viewers.pop(address, None)
        feed.viewers -= 1
        if feed.viewers <= 0:
            key = (feed.channel_id, feed.options)
            if self.feeds.get(key) is feed:
                del self.feeds[key]
            self.hub.remove_session(cast(Client, feed))  # closes it: the channel is released

    def may_read(self, identity: Identity, canonical: str) -> bool:
        return self.hub.may_read(identity, canonical)


def _text(status: int, message: str) -> PlainTextResponse:
    return PlainTextResponse(message + "\n", status_code=status)


class _Stream(Response):
    """One viewer's multipart response: the newest frame each time its connection can take one."""

    def __init__(
        self,
        endpoint: MjpegEndpoint,
        feed: MjpegFeed,
        first: Frame,
        identity: Identity,
        canonical: str,
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
        self._canonical = canonical

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint, feed = self._endpoint, self._feed
        stall = endpoint.hub.settings.stall_timeout_s
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": b"--" + BOUNDARY + b"\r\n",
                        "more_body": True})  # fmt: skip
            frame = self._first
            while endpoint.may_read(self._identity, self._canonical):
                part = b"".join((
                    b"Content-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(frame.jpeg),
                    frame.jpeg,
                    b"\r\n--" + BOUNDARY + b"\r\n",
                ))  # fmt: skip
                message: Message = {"type": "http.response.body", "body": part, "more_body": True}
                try:
                    # The server awaits its socket draining before it writes: a viewer that
                    # reads nothing blocks here, and only here.
                    await asyncio.wait_for(send(message), stall)
                except TimeoutError:
                    log.info("MJPEG viewer of %s took nothing for %g s: closed", feed.channel_id,
                             stall)  # fmt: skip
                    return
                feed.sent(len(part))
                newer = asyncio.ensure_future(feed.next_frame(frame.seq))
                await asyncio.wait({newer, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not newer.done():
                    newer.cancel()
                    return
                try:
                    frame = newer.result()
                except ConnectionAbortedError:
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            endpoint.leave(feed, self._identity.address)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
