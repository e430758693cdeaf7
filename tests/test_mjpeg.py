"""`GET /mjpeg/{channel id}`: JPEG frames of image channels over real HTTP, decoded with Pillow.

The shared-encoding and slow-viewer tests run the real app under uvicorn in this process (so they
can count the feed's encodes); the rest use the real server process and its test IOC.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
import websockets
from p4p.nt import NTNDArray
from p4p.server.thread import SharedPV
from PIL import Image
from pvwire.api.mjpeg import MjpegEndpoint, image_ids, padded, parse_options
from pvwire.app import create_app
from pvwire.config import Settings
from pvwire.core.mjpeg import QUALITY_LEVELS, MjpegOptions, NotAnImage, to_8bit
from pvwire.limits import integer, number
from pvwire.upstream.loc import LocBackend
from pvwire.upstream.sim import SimBackend
from pvwire_client import wire
from starlette.requests import Request

from tests.eventually import eventually_async
from tests.hub_doubles import FakeBackend
from tests.p4p_server import p4p_server
from tests.server_process import ServerProcess, server_args_for_tests

BOUNDARY = b"--BOUNDARY\r\n"
PART_HEAD = b"Content-Type: image/jpeg\r\n\r\n"


def url(base: str, channel: str, **query: object) -> str:
    path = urllib.parse.quote(channel, safe="")
    return f"{base}/mjpeg/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")


def build_mjpg_pv_urls(endpoints: list[str | None] | None, pv_name: str) -> list[str]:
    """cs-web-lib 0.10.24's `buildMjpgPvUrls` (src/ui/widgets/DynamicImage/demoImage.tsx), step
    by step: no encoding, `pva://` cut off, a trailing `:ARRAY` renamed `:OUTPUT`, then its
    fallback picture last."""
    if not pv_name or not endpoints:
        return []
    trimmed = re.sub(r":ARRAY$", ":OUTPUT", re.sub(r"^pva://", "", pv_name))
    return [f"{e}/{trimmed}" for e in endpoints if e is not None] + [
        "/images/disconnectedImage.svg"
    ]


class Parts:
    """The JPEG parts of one multipart/x-mixed-replace response, read as a browser reads them:
    a part is complete when the next part's header block has come (the JPEG ends at the
    boundary; the parts carry no Content-Length)."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_raw()
        self._buf = b""
        self._opened = False
        self._head = b""

    async def _need(self, n: int) -> None:
        while len(self._buf) < n:
            self._buf += await anext(self._chunks)

    async def _until(self, marker: bytes) -> bytes:
        while marker not in self._buf:
            self._buf += await anext(self._chunks)
        head, _, self._buf = self._buf.partition(marker)
        return head

    async def next(self) -> tuple[dict[str, str], bytes]:
        if not self._opened:
            await self._need(len(BOUNDARY))
            assert self._buf.startswith(BOUNDARY), self._buf[:40]
            self._buf = self._buf[len(BOUNDARY) :]
            self._opened = True
            self._head = await self._until(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in self._head.decode().split("\r\n"))
        jpeg = await self._until(b"\r\n" + BOUNDARY)
        self._head = await self._until(b"\r\n\r\n")  # the next part's, sent with this JPEG
        return headers, jpeg


async def refusal(client: httpx.AsyncClient, target: str) -> tuple[int, str]:
    """The status and text of a request expected to be refused (a stream, were it served, is
    left unread rather than read for ever)."""
    async with client.stream("GET", target) as r:
        return r.status_code, "" if r.status_code == 200 else (await r.aread()).decode()


def decode(jpeg: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(jpeg))
    image.load()
    assert image.format == "JPEG"
    return image


# --- the picture: what the demo page's ImageView draws -----------------------------------------


def test_mono_uint8_keeps_its_values_and_wider_types_scale_to_their_range() -> None:
    a = np.arange(256, dtype=np.uint8).reshape(16, 16)
    assert np.array_equal(to_8bit(a, "mono"), a)
    b = np.array([[100, 200], [300, 1124]], dtype=np.uint16)  # min 100 .. max 1124 = 1024 span
    assert to_8bit(b, "mono").tolist() == [[0, 25], [50, 255]]
    flat = np.full((2, 3), 7.5)
    assert to_8bit(flat, "mono").tolist() == [[0, 0, 0], [0, 0, 0]]


def test_every_rgb_layout_gives_the_same_picture() -> None:
    rgb = np.random.default_rng(1).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    rgb[0, 0] = (0, 0, 0)
    rgb[0, 1] = (255, 255, 255)  # the full range: values kept as they are
    layouts = {"RGB1": rgb, "RGB2": rgb.transpose(0, 2, 1), "RGB3": rgb.transpose(2, 0, 1)}
    for mode, value in layouts.items():
        assert np.array_equal(to_8bit(np.ascontiguousarray(value), mode), rgb), mode
    # A layout the page cannot tell the colour of is grey: the last two dims, first plane.
    assert to_8bit(rgb.transpose(2, 0, 1), "YUV444").shape == (4, 5)


@pytest.mark.parametrize(
    ("value", "why"),
    [(np.arange(10.0), "1-D"), (3.0, "not a numeric array"), (np.zeros((0, 4)), "empty")],
)
def test_what_is_not_an_image_is_refused(value: Any, why: str) -> None:
    with pytest.raises(NotAnImage, match=why):
        to_8bit(value, None)


def test_options_are_rounded_to_a_few_levels_never_above_what_was_asked() -> None:
    asked = [MjpegOptions(1 << 20, 75, 20.0 + i / 100) for i in range(30)]
    assert {o.rounded() for o in asked} == {MjpegOptions(1 << 20, 75, 20.0)}
    assert MjpegOptions(1_000_000, 77, 49.9).rounded() == MjpegOptions(1 << 19, 75, 30.0)
    assert MjpegOptions(1024, 1, 0.1).rounded() == MjpegOptions(1024, 5, 0.1)
    every = {
        MjpegOptions(p, q, f / 10).rounded()
        for p in range(1024, 1 << 24, 99_991)
        for q in range(1, 96, 7)
        for f in range(1, 501, 13)
    }
    assert len({o.fps for o in every}) <= 11 and len({o.quality for o in every}) <= 6
    assert len({o.max_pixels for o in every}) <= 15


def test_names_as_cs_web_lib_and_plain_urls_carry_them() -> None:
    assert image_ids("BL:DET:IMAGE", "pva") == ["pva://BL:DET:IMAGE"]
    assert image_ids("BL:DET:OUTPUT", "pva") == ["pva://BL:DET:ARRAY", "pva://BL:DET:OUTPUT"]
    assert image_ids("sim://image?width=8", "pva") == ["sim://image?width=8"]
    assert image_ids("ca://BL:DET:OUTPUT", "pva") == ["ca://BL:DET:ARRAY", "ca://BL:DET:OUTPUT"]
    assert build_mjpg_pv_urls(["http://h/mjpeg"], "pva://BL:DET:ARRAY") == [
        "http://h/mjpeg/BL:DET:OUTPUT",
        "/images/disconnectedImage.svg",
    ]


def test_options_bounds_are_named() -> None:
    assert parse_options({}) == MjpegOptions(1 << 20, 75, 10.0)
    assert parse_options({"maxPixels": "4096", "quality": "50", "fps": "2.5"}) == MjpegOptions(
        4096, 50, 2.5
    )
    for query, why in [
        ({"quality": "100"}, "quality must be an integer in [1, 95]"),
        ({"fps": "0"}, "fps must be a number in [0.1, 50]"),
        ({"fps": "50.5"}, "fps must be a number in [0.1, 50]"),
        ({"maxPixels": str((1 << 24) + 1)}, "maxPixels must be an integer in [1024, 16777216]"),
        ({"maxPixels": "12.5"}, "maxPixels must be an integer"),
        ({"fps": "fast"}, "is not a number"),
    ]:
        with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
            parse_options(query)
    # A page's own parameters are not options: a cache-busting `?t=` loads the same stream.
    assert parse_options({"t": "1733300000", "fps": "2"}) == MjpegOptions(1 << 20, 75, 2.0)


def test_a_short_jpeg_is_padded_by_a_comment_every_decoder_skips() -> None:
    out = io.BytesIO()
    Image.fromarray(RGB[..., 0]).save(out, "JPEG", quality=50)
    jpeg = out.getvalue()
    assert len(jpeg) < 1024
    longer = padded(jpeg, 1024)
    assert len(longer) == 1024 and longer[:2] == b"\xff\xd8"
    assert longer[2:4] == b"\xff\xe0"  # the JFIF header still follows the start of image
    assert np.array_equal(np.asarray(decode(longer)), np.asarray(decode(jpeg)))
    assert padded(longer, 1024) is longer and padded(jpeg, 10) is jpeg


# --- the real server process ----------------------------------------------------------------


async def test_frames_of_a_sim_image_decode_at_their_size(server: ServerProcess) -> None:
    channel = "sim://image?width=160&height=120&dtype=uint16&rate=20"
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("GET", url(server.url, channel, fps=20)) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"] == "multipart/x-mixed-replace;boundary=BOUNDARY"
        parts = Parts(r)
        frames = []
        for _ in range(4):
            headers, jpeg = await parts.next()
            assert headers["Content-Type"] == "image/jpeg"
            frames.append(decode(jpeg))
        # A feed is counted as what it is, not as a stream client (this server is shared with
        # other tests' clients: see test_feeds_..._are_not_connections for exact counts).
        clients = server.graphql("{ server { clients { endpoint } } }")
        assert {"endpoint": "mjpeg"} not in clients["data"]["server"]["clients"]
        metrics = await asyncio.to_thread(server.metrics)
        encodes = re.search(r"^pvwire_mjpeg_encodes_total (\d+)$", metrics, re.MULTILINE)
        assert encodes is not None and int(encodes.group(1)) >= 4
    assert all(f.size == (160, 120) and f.mode == "L" for f in frames)
    assert len({f.tobytes() for f in frames}) > 1, "the pattern moves"


async def test_rgb_and_max_pixels(server: ServerProcess) -> None:
    channel = "sim://image?width=320&height=240&dtype=uint8&color=RGB1&rate=10"
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("GET", url(server.url, channel, maxPixels=30000)) as r,
    ):
        _, jpeg = await Parts(r).next()
    image = decode(jpeg)
    # 30,000 rounds down to 16,384 pixels: every 3rd row and column of 320 x 240.
    assert image.mode == "RGB" and image.size == (107, 80)
    # The sim pattern's colour planes differ (grey, a sine, 1 - grey): a colour picture.
    pixels = np.asarray(image, dtype=np.int16)
    assert np.abs(pixels[..., 0] - pixels[..., 2]).mean() > 20


# A smooth picture (JPEG keeps it close) spanning the full uint8 range in every plane, so the
# page's min/max scaling keeps its values.
_Y, _X = np.mgrid[0:48, 0:64]
RGB = np.stack([_X * 255 // 63, _Y * 255 // 47, 255 - _X * 255 // 63], axis=-1).astype(np.uint8)
NT = NTNDArray()
PVA_FRAMES = {
    "MJ:MONO": (RGB[..., 0].copy(), RGB[..., 0]),
    "MJ:RGB1": (RGB, RGB),
    "MJ:RGB2": (RGB.transpose(0, 2, 1).copy(), RGB),
    "MJ:RGB3": (RGB.transpose(2, 0, 1).copy(), RGB),
    "MJ:CAM:ARRAY": (RGB[..., 1].copy(), RGB[..., 1]),  # an areaDetector-style name
}


@pytest.fixture(scope="module")
def pva_server() -> Iterator[ServerProcess]:
    pvs = {name: SharedPV(initial=NT.wrap(served)) for name, (served, _) in PVA_FRAMES.items()}
    with (
        p4p_server("mjpeg", pvs) as client_env,
        ServerProcess(*server_args_for_tests(), env=client_env) as proc,
    ):
        yield proc


@pytest.mark.parametrize("name", PVA_FRAMES)
async def test_pva_ntndarray_colour_modes_as_the_page_shows_them(
    pva_server: ServerProcess, name: str
) -> None:
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("GET", url(pva_server.url, f"pva://{name}", quality=95)) as r,
    ):
        assert r.status_code == 200, await r.aread()
        _, jpeg = await Parts(r).next()
    picture = np.asarray(decode(jpeg), dtype=np.int16)
    expected = PVA_FRAMES[name][1].astype(np.int16)
    assert picture.shape == expected.shape
    assert np.abs(picture - expected).mean() < 4, "the same picture, but for JPEG's loss"


@pytest.mark.parametrize(
    ("pv", "served"), [("pva://MJ:CAM:ARRAY", "MJ:CAM:ARRAY"), ("MJ:RGB1", "MJ:RGB1")]
)
async def test_a_url_built_as_cs_web_lib_builds_it_shows_the_image_at_once(
    pva_server: ServerProcess, pv: str, served: str
) -> None:
    # The name carries no scheme (an image channel: PVA) and `:ARRAY` renamed `:OUTPUT`.
    src = build_mjpg_pv_urls([f"{pva_server.url}/mjpeg"], pv)[0]
    async with httpx.AsyncClient(timeout=30) as client, client.stream("GET", src) as r:
        assert r.status_code == 200, await r.aread()
        # These images never change: the JPEG is complete for a browser only because the
        # next part's header block comes with it, not with a next frame.
        headers, jpeg = await asyncio.wait_for(Parts(r).next(), 30)
    assert headers == {"Content-Type": "image/jpeg"}
    picture = np.asarray(decode(jpeg), dtype=np.int16)
    assert picture.shape[:2] == (48, 64)
    expected = PVA_FRAMES[served][1].astype(np.int16)
    assert np.abs(picture - expected).mean() < 8


async def test_a_still_image_is_complete_without_a_next_frame(pva_server: ServerProcess) -> None:
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("GET", url(pva_server.url, "pva://MJ:MONO")) as r,
    ):
        body = b""
        # The picture never changes: its part must end (the next part's header block, the end a
        # browser waits for) with nothing else to follow.
        async with asyncio.timeout(30):
            async for chunk in r.aiter_raw():
                body += chunk
                if body.count(BOUNDARY + PART_HEAD) == 2:
                    break
    assert body.startswith(BOUNDARY + PART_HEAD) and body.endswith(b"\r\n" + BOUNDARY + PART_HEAD)
    # Chromium shows a cross-origin picture only past 1,024 bytes: this one's JPEG is shorter.
    assert len(body) >= 1024
    decode(body[len(BOUNDARY + PART_HEAD) : -len(b"\r\n" + BOUNDARY + PART_HEAD)])


async def test_a_cache_busting_parameter_is_not_an_option(server: ServerProcess) -> None:
    channel = "sim://image?width=64&height=48&rate=10"
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("GET", url(server.url, channel, t=1733300000)) as r,
    ):
        assert r.status_code == 200, await r.aread()
        _, jpeg = await Parts(r).next()
    assert decode(jpeg).size == (64, 48)


async def test_a_missing_channel_s_answer_names_the_wait_it_came_after(
    server: ServerProcess,
) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.get(url(server.url, "pva://MJ:NOSUCH"))
    assert r.status_code == 504, r.text
    assert f"within {number('mjpeg_first_frame_s'):g} s" in r.text.splitlines()[0], r.text


@pytest.mark.parametrize(
    ("channel", "query", "status", "why"),
    [
        ("sim://image", {"quality": "0"}, 400, "quality must be"),
        ("sim://nosuch(1)", {}, 400, "unknown sim function"),
        ("sim://counter", {}, 504, "not a numeric array"),
        ("sim://waveform?length=100", {}, 504, "1-D array, not an image"),
    ],
)
async def test_refusals_are_plain_and_named(
    server: ServerProcess, channel: str, query: dict[str, str], status: int, why: str
) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.get(url(server.url, channel, **query))
    assert r.status_code == status and why in r.text, (r.status_code, r.text)


# --- in process: count the encodes, stall a viewer ------------------------------------------


@contextlib.asynccontextmanager
async def in_process(
    fake: FakeBackend | None = None, **settings: Any
) -> AsyncIterator[tuple[str, MjpegEndpoint]]:
    """The app under uvicorn in this process, with sim:// and loc:// (and `fake` for fake://,
    whose images the test sends)."""
    config = Settings(default_scheme="sim", linger_s=0.0, stall_timeout_s=2.0, **settings)
    backends: dict[str, Any] = {"sim": SimBackend(), "loc": LocBackend()}
    if fake is not None:
        backends["fake"] = fake
    app = create_app(config, backends=backends)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    await eventually_async(lambda: server.started, "uvicorn started")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app.state.mjpeg
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def app_server() -> AsyncIterator[tuple[str, MjpegEndpoint]]:
    async with in_process() as served:
        yield served


async def test_two_viewers_share_one_encoding() -> None:
    """Each image is encoded once whatever the number of viewers: counted against the images
    the test sends, one at a time (encoding per viewer makes two of each), not against a time
    window."""
    backend = FakeBackend()
    async with (
        in_process(backend) as (base, endpoint),
        httpx.AsyncClient(timeout=30) as a,
        httpx.AsyncClient(timeout=30) as b,
    ):
        target = url(base, "fake://img", fps=20)
        # A viewer's response starts with its first picture: both wait for the first image.
        opening = asyncio.gather(*(c.send(c.build_request("GET", target), stream=True)
                                   for c in (a, b)))  # fmt: skip
        await eventually_async(
            lambda: "img" in backend.sinks and [f.viewers for f in endpoint.feeds.values()] == [2],
            "two viewers of one feed",
        )
        (feed,) = endpoint.feeds.values()
        responses = []
        try:
            backend.update("img", picture(0))
            responses = await opening
            viewers = [Parts(r) for r in responses]
            for k in range(4):
                if k:
                    backend.update("img", picture(k))
                got = await asyncio.gather(*(v.next() for v in viewers))
                assert got[0][1] == got[1][1], "the viewers got the same JPEG"
                assert np.asarray(decode(got[0][1]))[8 * k, 32] > 128, "image k, not another"
                assert feed.encodes == k + 1, "one encode per image for both viewers"
            async with b.stream("GET", url(base, "fake://img", fps=20, quality=30)) as rc:
                parts_c = Parts(rc)  # kept: its reader, collected, would close the stream
                await parts_c.next()
                assert len(endpoint.feeds) == 2, "another option set is another feed"
        finally:
            for r in responses:
                await r.aclose()
    await eventually_async(lambda: not endpoint.feeds, "the last viewer gone, the feed closed")


def picture(k: int) -> np.ndarray:
    """Image k of fake://img: black with a white band at row 8 k."""
    image = np.zeros((48, 64), np.uint8)
    image[8 * k : 8 * k + 4] = 255
    return image


async def test_a_viewer_that_stops_reading_does_not_stall_another(
    app_server: tuple[str, MjpegEndpoint],
) -> None:
    base, endpoint = app_server
    # ~86 KB JPEG frames at 20 a second: the stalled viewer's buffers fill within seconds.
    channel = "sim://image?width=1024&height=1024&dtype=uint8&rate=20"
    target = url(base, channel, fps=20, quality=95, maxPixels=1 << 20)
    host, port = base.removeprefix("http://").split(":")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((host, int(port)))
    path = target.removeprefix(base)
    stalled.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    try:
        await eventually_async(
            lambda: sum(f.viewers for f in endpoint.feeds.values()) == 1, "one viewer"
        )
        async with httpx.AsyncClient(timeout=30) as client, client.stream("GET", target) as r:
            parts = Parts(r)
            (feed,) = endpoint.feeds.values()
            seen = 0
            # Read on until the server has given up on the stalled viewer (stall_timeout_s
            # without progress): all the while this one got every newest frame.
            while feed.viewers > 1 or seen < 5:
                _, jpeg = await asyncio.wait_for(parts.next(), 10)
                assert decode(jpeg).size == (1024, 1024)
                seen += 1
            assert feed.viewers == 1 and seen >= 5
    finally:
        stalled.close()


DENY = '[[rule]]\nchannels = ["sim://image?width=32*"]\naccess = "NONE"\n'


async def test_read_access_is_checked_per_viewer_and_again_when_rules_change(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('default = "READ"\n' + DENY)
    async with (
        in_process(access_rules=str(rules)) as (base, endpoint),
        httpx.AsyncClient(timeout=30) as client,
    ):
        r = await client.get(url(base, "sim://image?width=32&height=32"))
        assert r.status_code == 403 and "may not read sim://image?width=32" in r.text
        assert not endpoint.feeds, "nothing opened for a refused viewer"
        async with client.stream("GET", url(base, "sim://image?width=40&height=32")) as ok:
            parts = Parts(ok)
            await parts.next()
            rules.write_text('default = "READ"\n' + DENY.replace("width=32*", "width=40*"))
            # The rules file is reloaded within a second: the viewer's stream then ends.
            with pytest.raises(StopAsyncIteration):
                while True:
                    await asyncio.wait_for(parts.next(), 30)
        await eventually_async(lambda: not endpoint.feeds, "the feed closed")


# --- bounds: few feeds per channel and per address, encodes in threads of their own -----------


async def test_viewers_asking_nearly_the_same_options_share_one_feed(
    app_server: tuple[str, MjpegEndpoint],
) -> None:
    base, endpoint = app_server
    channel = "sim://image?width=64&height=48&rate=20"
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        viewers = [
            Parts(await stack.enter_async_context(
                client.stream("GET", url(base, channel, fps=f"{20 + i / 100:.2f}"))
            ))
            for i in range(30)
        ]  # fmt: skip
        await asyncio.gather(*(v.next() for v in viewers))
        assert len(endpoint.feeds) == 1, "30 fps values from 20.00 to 20.29: one feed"
        ((_, options),) = endpoint.feeds
        assert options.fps == 20.0 and endpoint.stats().viewers == 30


async def test_a_channel_has_few_feeds_and_the_refusal_names_those_in_use(
    app_server: tuple[str, MjpegEndpoint],
) -> None:
    base, endpoint = app_server
    channel = "sim://image?width=64&height=48&rate=5"
    cap = integer("mjpeg_feeds_per_channel")
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        for quality in QUALITY_LEVELS[:cap]:
            r = await stack.enter_async_context(
                client.stream("GET", url(base, channel, quality=quality))
            )
            assert r.status_code == 200
        status, text = await refusal(client, url(base, channel, quality=QUALITY_LEVELS[cap]))
        assert status == 503, text
        assert f"at most {cap}" in text and "quality=5&fps=10" in text
        assert len(endpoint.feeds) == cap
        # Options that round to a feed in use are served.
        async with client.stream("GET", url(base, channel, quality=26)) as ok:
            assert ok.status_code == 200


async def test_one_address_opens_few_feeds(app_server: tuple[str, MjpegEndpoint]) -> None:
    base, endpoint = app_server
    cap = integer("mjpeg_feeds_per_address")
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        for width in range(32, 32 + cap):
            channel = f"sim://image?width={width}&height=32&rate=2"
            r = await stack.enter_async_context(client.stream("GET", url(base, channel)))
            assert r.status_code == 200
        status, text = await refusal(client, url(base, f"sim://image?width={32 + cap}&rate=2"))
        assert status == 429, text
        assert f"127.0.0.1 has opened {cap} MJPEG feeds already" in text
        assert len(endpoint.feeds) == cap


async def test_a_server_serves_few_viewers(app_server: tuple[str, MjpegEndpoint]) -> None:
    base, endpoint = app_server
    assert endpoint.max_viewers == integer("mjpeg_max_viewers")
    endpoint.max_viewers = 2  # the table's 200, made small enough to reach here
    target = url(base, "sim://image?width=64&height=48&rate=5")
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        for _ in range(2):
            r = await stack.enter_async_context(client.stream("GET", target))
            assert r.status_code == 200
        status, text = await refusal(client, target)
        assert status == 503 and "2 MJPEG viewers at most" in text, text


async def test_one_address_takes_few_viewers_and_leaves_the_rest_to_others() -> None:
    assert Settings().mjpeg_viewers_per_address == integer("mjpeg_viewers_per_address")
    assert integer("mjpeg_viewers_per_address") * 4 <= integer("mjpeg_max_viewers")
    target = "sim://image?width=64&height=48&rate=5"
    # The whole of 127/8 is loopback: a client bound to 127.0.0.2 is another address.
    other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with (
        in_process(mjpeg_viewers_per_address=2) as (base, endpoint),  # the table's 50, made small
        contextlib.AsyncExitStack() as stack,
    ):
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        for _ in range(2):
            r = await stack.enter_async_context(client.stream("GET", url(base, target)))
            assert r.status_code == 200
        status, text = await refusal(client, url(base, target))
        assert status == 503 and "2 MJPEG viewers from 127.0.0.1 already" in text, text
        neighbour = await stack.enter_async_context(httpx.AsyncClient(timeout=30, transport=other))
        async with neighbour.stream("GET", url(base, target)) as r:
            parts = Parts(r)  # kept: its reader, collected, would close the stream
            await parts.next()
            assert endpoint.viewers == {"127.0.0.1": 2, "127.0.0.2": 1}
            metrics = (await neighbour.get(base + "/metrics")).text.splitlines()
            assert "pvwire_mjpeg_viewers 3" in metrics


async def test_feeds_encode_in_threads_of_their_own_and_are_not_connections() -> None:
    # One connection per address: a feed counted as one would refuse the stream client.
    async with (
        in_process(max_connections_per_address=1) as (base, endpoint),
        httpx.AsyncClient(timeout=30) as client,
        client.stream("GET", url(base, "sim://image?width=64&height=48&rate=5")) as r,
    ):
        parts = Parts(r)  # kept: its reader, collected, would close the stream
        await parts.next()
        async with httpx.AsyncClient(timeout=30) as scraper:
            metrics = (await scraper.get(base + "/metrics")).text.splitlines()
        for line in ("pvwire_clients 0", "pvwire_mjpeg_feeds 1", "pvwire_mjpeg_viewers 1"):
            assert line in metrics, line
        names = {t.name for t in threading.enumerate()}
        assert any(n.startswith("pvwire-mjpeg") for n in names), names
        assert endpoint.executor._max_workers == integer("mjpeg_encode_threads")
        ws_url = base.replace("http://", "ws://") + "/stream"
        async with websockets.connect(ws_url) as ws:
            hello = wire.decode_message(await asyncio.wait_for(ws.recv(decode=False), 30))
            assert isinstance(hello, wire.Hello), "admitted beside the MJPEG viewer"


async def test_a_viewer_gone_before_its_first_picture_keeps_no_feed() -> None:
    """The request ends (cancelled) while it waits for a first picture that never comes: its
    feed and its count from the address go with it."""
    async with in_process() as (_, endpoint):
        scope = {
            "type": "http", "method": "GET", "path": "/mjpeg/x", "headers": [],
            "query_string": b"", "client": ("127.0.0.1", 40000),
        }  # fmt: skip
        viewer = asyncio.create_task(endpoint.serve(Request(scope), "sim://sine"))  # no image
        await eventually_async(lambda: endpoint.feeds and endpoint.viewers, "the viewer waits")
        viewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await viewer
        assert not endpoint.feeds and not endpoint.viewers
