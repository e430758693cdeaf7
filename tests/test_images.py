"""Images: NTNDArrays from a real p4p server, plain and compressed, and `sim://image`, through the
real server to the Python client: exact pixels, dims and `colorMode` (PROTOCOL.md section 4.5).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from typing import Any

import bitshuffle
import blosc
import lz4.block
import numpy as np
import pytest
from p4p.nt import NTNDArray
from p4p.server.thread import SharedPV
from PIL import Image
from pvwire.upstream.sim import parse_sim
from pvwire.upstream.sim_image import image_frame, image_step
from pvwire_client import Client
from pvwire_client.state import ChannelState

from tests.alignment import message_of
from tests.p4p_server import p4p_server
from tests.server_process import ServerProcess, server_args_for_tests

pytestmark = [pytest.mark.ioc, pytest.mark.usefixtures("epics_env")]

NT = NTNDArray()
RNG = np.random.default_rng(12)
GREY16 = RNG.integers(0, 65536, (12, 20), dtype=np.uint16)  # [height, width]
RGB = RNG.integers(0, 256, (6, 10, 3), dtype=np.uint8)  # [height, width, colour]
ND_UINT16 = 3  # areaDetector NDDataType_t numbers, as NDPluginCodec puts in codec.parameters
ND_UINT8 = 1


def _codec_frame(name: str, payload: bytes, code: int, like: np.ndarray[Any, Any]) -> Any:
    v = NT.wrap(like)
    v["value"] = ("ubyteValue", np.frombuffer(payload, np.uint8))
    v["codec.name"] = name
    v["codec.parameters"] = code
    v["compressedSize"] = len(payload)
    return v


def _jpeg(grey: np.ndarray[Any, Any]) -> bytes:
    out = io.BytesIO()
    Image.fromarray(grey).save(out, "JPEG", quality=100)
    return out.getvalue()


GREY8 = (GREY16 >> 8).astype(np.uint8)
JPEG = _jpeg(GREY8)
JPEG_PIXELS = np.asarray(Image.open(io.BytesIO(JPEG)))  # what any JPEG decoder gives back

# name: (Value or array to serve, expected array, expected colorMode, expected type)
FRAMES: dict[str, tuple[Any, np.ndarray[Any, Any], str, str]] = {
    "IMG:U16": (GREY16, GREY16, "mono", "uint16"),
    "IMG:U8": (GREY8, GREY8, "mono", "uint8"),
    "IMG:I32": (GREY16.astype(np.int32) - 30000, GREY16.astype(np.int32) - 30000, "mono", "int32"),
    "IMG:F32": (GREY16.astype(np.float32) / 7, GREY16.astype(np.float32) / 7, "mono", "float32"),
    "IMG:F64": (GREY16 / 3.0, GREY16 / 3.0, "mono", "float64"),
    "IMG:RGB1": (RGB, RGB, "RGB1", "uint8"),
    # RGB2 is row-interleaved [H, 3, W]; RGB3 planar [3, H, W] (C order).
    "IMG:RGB2": (RGB.transpose(0, 2, 1).copy(), RGB.transpose(0, 2, 1), "RGB2", "uint8"),
    "IMG:RGB3": (RGB.transpose(2, 0, 1).copy(), RGB.transpose(2, 0, 1), "RGB3", "uint8"),
    "IMG:LZ4": (
        _codec_frame("lz4", lz4.block.compress(GREY16.tobytes(), store_size=False), 3, GREY16),
        GREY16,
        "mono",
        "uint16",
    ),
    "IMG:BSLZ4": (
        _codec_frame("bslz4", bitshuffle.compress_lz4(GREY16.reshape(-1)).tobytes(), 3, GREY16),
        GREY16,
        "mono",
        "uint16",
    ),
    "IMG:BLOSC": (
        _codec_frame("blosc", blosc.compress(GREY16.tobytes(), typesize=2), ND_UINT16, GREY16),
        GREY16,
        "mono",
        "uint16",
    ),
    "IMG:JPEG": (_codec_frame("jpeg", JPEG, ND_UINT8, GREY8), JPEG_PIXELS, "mono", "uint8"),
}
CORRUPT = _codec_frame("lz4", b"\xff" * 40, ND_UINT16, GREY16)


def _pv(initial: Any) -> SharedPV:
    return SharedPV(initial=initial if not isinstance(initial, np.ndarray) else NT.wrap(initial))


@pytest.fixture(scope="module")
def image_server() -> Iterator[tuple[ServerProcess, dict[str, SharedPV]]]:
    pvs = {name: _pv(served) for name, (served, *_) in FRAMES.items()}
    pvs["IMG:CORRUPT"] = _pv(CORRUPT)
    with (
        p4p_server("images", pvs) as client_env,
        ServerProcess(*server_args_for_tests(), env=client_env) as proc,
    ):
        yield proc, pvs


@pytest.fixture
def client_url(image_server: tuple[ServerProcess, dict[str, SharedPV]]) -> str:
    return image_server[0].url


async def _until(client: Client, ids: list[str], done: Any) -> dict[str, ChannelState]:
    latest: dict[str, ChannelState] = {}
    stream = client.monitor(ids)
    try:
        async with asyncio.timeout(30):
            async for u in stream:
                latest[u.channel.id] = u.channel
                if len(latest) == len(ids) and done(latest):
                    return latest
    finally:
        await stream.aclose()
    raise AssertionError("stream ended")


async def test_every_image_kind_arrives_with_its_pixels_dims_and_colour_mode(
    client: Client,
) -> None:
    ids = [f"pva://{n}" for n in FRAMES]
    latest = await _until(
        client, ids, lambda got: all(isinstance(s.value, np.ndarray) for s in got.values())
    )
    for name, (_, want, mode, type_name) in FRAMES.items():
        s = latest[f"pva://{name}"]
        assert isinstance(s.value, np.ndarray), name
        assert s.value.dtype == want.dtype and s.value.shape == want.shape, (name, s.value.shape)
        assert np.array_equal(s.value, want), name
        assert s.metadata.get("colorMode") == mode, (name, s.metadata)
        assert s.metadata.get("type") == type_name, (name, s.metadata)


async def test_graphql_metadata_names_each_frames_colour_mode(
    client: Client, image_server: tuple[ServerProcess, dict[str, SharedPV]]
) -> None:
    """The control plane tells the same colorMode as the stream: a raw GraphQL query over HTTP,
    then the client's info() and get(), which ask for it."""
    ids = [f"pva://{n}" for n in FRAMES]
    query = (
        "query($ids: [String!]!) { channels(ids: $ids, timeout: 10) { id metadata { colorMode } } }"
    )
    doc = await asyncio.to_thread(image_server[0].graphql, query, {"ids": ids})
    assert "errors" not in doc, doc
    served = {c["id"]: c["metadata"]["colorMode"] for c in doc["data"]["channels"]}
    assert served == {f"pva://{n}": mode for n, (_, _, mode, _) in FRAMES.items()}
    for name in ("IMG:RGB1", "IMG:RGB3", "IMG:U16"):
        mode = FRAMES[name][2]
        assert (await client.info(f"pva://{name}"))["colorMode"] == mode, name
        assert (await client.get(f"pva://{name}")).metadata["colorMode"] == mode, name
    # A channel that is no image has no colour mode: the key is absent, not "mono".
    assert "colorMode" not in (await client.info("sim://sine"))


async def test_a_new_frame_with_another_colour_mode_updates_the_metadata(
    client: Client, image_server: tuple[ServerProcess, dict[str, SharedPV]]
) -> None:
    pvs = image_server[1]
    first = await _until(client, ["pva://IMG:U8"], lambda got: True)
    assert first["pva://IMG:U8"].metadata.get("colorMode") == "mono"
    pvs["IMG:U8"].post(NT.wrap(RGB))
    try:
        got = await _until(
            client,
            ["pva://IMG:U8"],
            lambda got: (
                got["pva://IMG:U8"].metadata.get("colorMode") == "RGB1"
                and getattr(got["pva://IMG:U8"].value, "shape", None) == RGB.shape
            ),
        )
        assert np.array_equal(got["pva://IMG:U8"].value, RGB)
    finally:
        pvs["IMG:U8"].post(NT.wrap(GREY8))


async def test_a_corrupt_compressed_frame_fails_only_its_channel_with_the_reason(
    client: Client,
) -> None:
    latest = await _until(
        client,
        ["pva://IMG:CORRUPT", "pva://IMG:LZ4"],
        lambda got: (
            got["pva://IMG:CORRUPT"].connection == "FAILED"
            and isinstance(got["pva://IMG:LZ4"].value, np.ndarray)
        ),
    )
    assert "lz4" in latest["pva://IMG:CORRUPT"].reason
    assert np.array_equal(latest["pva://IMG:LZ4"].value, GREY16)


async def test_sim_image_moves_its_pattern_by_whole_columns(client: Client) -> None:
    sid = "sim://image?width=40&height=24&dtype=uint8&color=RGB1&rate=20"
    frames: list[np.ndarray[Any, Any]] = []
    serials: list[int] = []
    stream = client.monitor([sid])
    try:
        async with asyncio.timeout(30):
            async for u in stream:
                s = u.channel
                if isinstance(s.value, np.ndarray) and s.serial not in serials:
                    assert s.metadata.get("colorMode") == "RGB1"
                    frames.append(s.value)
                    serials.append(int(s.serial or 0))
                if len(frames) >= 3:
                    break
    finally:
        await stream.aclose()
    step = image_step(40)
    params = parse_sim(sid.removeprefix("sim://")).params
    for frame, serial in zip(frames, serials, strict=True):
        assert frame.shape == (24, 40, 3) and frame.dtype == np.uint8
        # Serial n carries frame n - 1 (the first value is frame 0): the pattern rolled left.
        assert np.array_equal(frame, image_frame(params, serial - 1))
        assert np.array_equal(frame, np.roll(image_frame(params, 0), -(serial - 1) * step, axis=1))


async def test_a_4_megapixel_frame_is_a_read_only_view_of_the_received_message(
    client: Client,
) -> None:
    # PROTOCOL.md 4.1: a reader views the data in place. msgpack copied the ext payload; large
    # messages are read by msgview, so the array's memory is the message's own.
    sid = "sim://image?width=2048&height=2048&dtype=uint16&rate=2"
    async with asyncio.timeout(60):
        stream = client.monitor([sid])
        try:
            async for u in stream:
                if isinstance(u.channel.value, np.ndarray):
                    frame = u.channel.value
                    break
        finally:
            await stream.aclose()
        batches = client.monitor_batches([sid])
        try:
            async for b in batches:
                if isinstance(b.states[0].value, np.ndarray):
                    batch_frame = b.states[0].value
                    break
        finally:
            await batches.aclose()
    for a in (frame, batch_frame):
        assert a.shape == (2048, 2048) and a.dtype == np.uint16
        message = message_of(a)
        # The whole SNAPSHOT or DATA message, not a copy of the ext payload alone.
        assert bytes(message[:2]) in (b"\x94\x02", b"\x93\x03") and len(message) > a.nbytes + 10
        assert np.shares_memory(a, np.frombuffer(message, np.uint8))
        assert not a.flags.writeable
