"""`GET /mjpeg/{channel id}`: JPEG frames of image channels over real HTTP, decoded with Pillow.

The shared-encoding and slow-viewer tests run the real app under uvicorn in this process (so they
can count the feed's encodes); the rest use the real server process and its test IOC.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from p4p.nt import NTNDArray
from p4p.server.thread import SharedPV
from PIL import Image
from pvwire.api.mjpeg import MjpegEndpoint, parse_options
from pvwire.app import create_app
from pvwire.config import Settings
from pvwire.core.mjpeg import MjpegOptions, NotAnImage, to_8bit
from pvwire.upstream.loc import LocBackend
from pvwire.upstream.sim import SimBackend

from tests.p4p_server import p4p_server
from tests.server_process import ServerProcess, server_args_for_tests

BOUNDARY = b"--BOUNDARY\r\n"


def url(base: str, channel: str, **query: object) -> str:
    path = urllib.parse.quote(channel, safe="")
    return f"{base}/mjpeg/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")


class Parts:
    """The JPEG parts of one multipart/x-mixed-replace response, as ffmpegServer frames them."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_raw()
        self._buf = b""
        self._opened = False

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
        head = await self._until(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n"))
        size = int(headers["Content-Length"])
        await self._need(size + 2 + len(BOUNDARY))
        jpeg, rest = self._buf[:size], self._buf[size:]
        assert rest.startswith(b"\r\n" + BOUNDARY), rest[:40]
        self._buf = rest[2 + len(BOUNDARY) :]
        return headers, jpeg


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


def test_options_bounds_are_named() -> None:
    assert parse_options({}) == MjpegOptions(1 << 20, 75, 10.0)
    assert parse_options({"maxPixels": "4096", "quality": "50", "fps": "2.5"}) == MjpegOptions(
        4096, 50, 2.5
    )
    for query, why in [
        ({"quality": "100"}, "quality must be an integer in [1, 95]"),
        ({"fps": "0"}, "fps must be a number in [0.1, 50]"),
        ({"maxPixels": "12.5"}, "maxPixels must be an integer"),
        ({"fps": "fast"}, "is not a number"),
        ({"size": "1"}, "unknown option 'size'"),
    ]:
        with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
            parse_options(query)


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
        # The feed is a client of the server like any other: listed, counted, measured.
        clients = server.graphql("{ server { clients { endpoint channels } } }")
        assert {"endpoint": "mjpeg", "channels": 1} in clients["data"]["server"]["clients"]
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as m:
            assert m.status == 200
    assert all(f.size == (160, 120) and f.mode == "L" for f in frames)
    assert len({f.tobytes() for f in frames}) > 1, "the pattern moves"


async def test_rgb_and_max_pixels(server: ServerProcess) -> None:
    channel = "sim://image?width=320&height=240&dtype=uint8&color=RGB1&rate=10"
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("GET", url(server.url, channel, maxPixels=19200)) as r,
    ):
        _, jpeg = await Parts(r).next()
    image = decode(jpeg)
    assert image.mode == "RGB" and image.size == (160, 120)  # every 2nd row and column
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
async def in_process(**settings: Any) -> AsyncIterator[tuple[str, MjpegEndpoint]]:
    config = Settings(default_scheme="sim", linger_s=0.0, stall_timeout_s=2.0, **settings)
    app = create_app(config, backends={"sim": SimBackend(), "loc": LocBackend()})
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    await wait_for(lambda: server.started)
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


async def wait_for(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_two_viewers_share_one_encoding(app_server: tuple[str, MjpegEndpoint]) -> None:
    base, endpoint = app_server
    channel = "sim://image?width=64&height=48&rate=20"
    target = url(base, channel, fps=20)
    async with (
        httpx.AsyncClient(timeout=30) as a,
        httpx.AsyncClient(timeout=30) as b,
        a.stream("GET", target) as ra,
        b.stream("GET", target) as rb,
    ):
        pa, pb = Parts(ra), Parts(rb)
        await asyncio.gather(pa.next(), pb.next())
        (feed,) = endpoint.feeds.values()
        assert feed.viewers == 2
        before = feed.encodes

        async def read(parts: Parts) -> list[bytes]:
            return [(await parts.next())[1] for _ in range(6)]

        got_a, got_b = await asyncio.gather(read(pa), read(pb))
        # Six frames reached each viewer: encoding per viewer would have made twelve.
        assert feed.encodes - before <= 6 + 2
        assert set(got_a) & set(got_b), "the viewers got the same JPEGs"
        async with b.stream("GET", url(base, channel, fps=20, quality=30)) as rc:
            await Parts(rc).next()
            assert len(endpoint.feeds) == 2, "another option set is another feed"
    await wait_for(lambda: not endpoint.feeds)  # the last viewer gone, the feed is closed


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
        await wait_for(lambda: sum(f.viewers for f in endpoint.feeds.values()) == 1)
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
        await wait_for(lambda: not endpoint.feeds)
