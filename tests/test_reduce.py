"""Array reduction for displays (PROTOCOL.md section 4.6): `maxColumns` and `maxPixels`.

Unit tests of core/reduce.py against numpy, then the real server with real sim channels: one
Client monitors a channel whole and reduced at once, and the reduced value of an update equals
numpy's min/max per column (or the subsampled pixels) of the whole value of the same update.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from pvwire.core import channel as channel_module
from pvwire.core.hub import Hub
from pvwire.core.reduce import Reduction, reduce_value
from pvwire.model import CONN, META, TIME, VALUE
from pvwire.upstream.sim import parse_sim
from pvwire.upstream.sim_image import image_frame
from pvwire.wire.tokens import TokenSigner
from pvwire_client import Client

from tests.hub_doubles import Client as HubClient
from tests.hub_doubles import FakeBackend, attach
from tests.server_process import ServerProcess

RNG = np.random.default_rng(7)


def _columns(a: np.ndarray[Any, Any], columns: int) -> list[np.ndarray[Any, Any]]:
    n = len(a)
    return [a[c * n // columns : (c + 1) * n // columns] for c in range(columns)]


def _expected_min_max(a: np.ndarray[Any, Any], columns: int) -> np.ndarray[Any, Any]:
    """What PROTOCOL.md section 4.6 says, written the slow way: numpy's min and max per slice."""
    pairs = [(np.min(s), np.max(s)) for s in _columns(a, columns)]
    return np.array([x for p in pairs for x in p], dtype=a.dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int16", "uint8", "int64", "uint32"])
@pytest.mark.parametrize(("n", "columns"), [(10_007, 300), (2_001, 1_000), (5_000, 7)])
def test_min_max_per_column_equals_numpy(dtype: str, n: int, columns: int) -> None:
    a = (RNG.standard_normal(n) * 100).astype(dtype)
    value, reduced = reduce_value(a, {}, Reduction(columns=columns))
    assert reduced == {"method": "minmax", "from": [n]}
    assert isinstance(value, np.ndarray) and value.dtype == a.dtype
    assert np.array_equal(value, _expected_min_max(a, columns))


def test_a_nan_in_a_column_gives_nan_as_numpy_does() -> None:
    a = RNG.standard_normal(1000)
    a[123] = np.nan
    value, _ = reduce_value(a, {}, Reduction(columns=100))
    assert isinstance(value, np.ndarray)
    assert np.array_equal(value, _expected_min_max(a, 100), equal_nan=True)
    assert np.isnan(value[24]) and np.isnan(value[25]) and not np.isnan(value[26])


def test_short_arrays_scalars_and_strings_pass_unchanged() -> None:
    r = Reduction(columns=500, pixels=1024)
    short = np.arange(1000.0)  # not more than 2 x columns: a reduction would not shrink it
    assert reduce_value(short, {}, r) == (short, None)
    assert reduce_value(3.5, {}, r) == (3.5, None)
    assert reduce_value(["a", "b"], {}, r) == (["a", "b"], None)
    small = np.zeros((32, 32), np.uint16)  # exactly maxPixels
    assert reduce_value(small, {}, r)[1] is None
    assert reduce_value(np.arange(5000.0), {}, Reduction(pixels=1024))[1] is None


@pytest.mark.parametrize(
    ("shape", "pixels", "step"),
    [((2048, 2048), 1 << 20, 2), ((100, 60), 1024, 3), ((1, 5000), 1024, 5), ((999, 3), 1024, 2)],
)
def test_images_are_subsampled_to_at_most_max_pixels(
    shape: tuple[int, int], pixels: int, step: int
) -> None:
    a = RNG.integers(0, 65536, shape, dtype=np.uint16)
    value, reduced = reduce_value(a, {"colorMode": "mono"}, Reduction(pixels=pixels))
    assert reduced == {"method": "subsample", "from": list(shape), "step": step}
    assert isinstance(value, np.ndarray) and value.size <= pixels and value.flags.c_contiguous
    assert np.array_equal(value, a[::step, ::step])


@pytest.mark.parametrize(("mode", "rows", "cols"), [("RGB1", 0, 1), ("RGB2", 0, 2), ("RGB3", 1, 2)])
def test_colour_images_keep_their_three_planes(mode: str, rows: int, cols: int) -> None:
    shape = [3, 3, 3]
    shape[rows], shape[cols] = 64, 48
    a = RNG.integers(0, 256, shape, dtype=np.uint8)
    value, reduced = reduce_value(a, {"colorMode": mode}, Reduction(pixels=1024))
    index: list[slice] = [slice(None)] * 3
    index[rows] = index[cols] = slice(None, None, 2)
    assert reduced == {"method": "subsample", "from": shape, "step": 2}
    assert isinstance(value, np.ndarray) and np.array_equal(value, a[tuple(index)])
    # A 3-D array whose colour layout is unknown is sent whole.
    assert reduce_value(a, {"colorMode": "Bayer"}, Reduction(pixels=1024))[1] is None


def test_tokens_carry_the_reduction_and_omit_it_when_off() -> None:
    signer = TokenSigner({"k": b"0" * 32}, "k")
    claims = signer.verify(signer.issue(["sim://x"], max_columns=1500, max_pixels=1 << 20).token)
    assert (claims.max_columns, claims.max_pixels) == (1500, 1 << 20)
    plain = signer.verify(signer.issue(["sim://x"]).token)
    assert (plain.max_columns, plain.max_pixels) == (0, 0)


# --- the real server, real sim channels -----------------------------------------------------


async def _by_serial(
    client: Client,
    pv: str,
    out: dict[int, tuple[np.ndarray[Any, Any], dict[str, Any]]],
    done: Callable[[], bool],
    max_columns: int = 0,
    max_pixels: int = 0,
) -> None:
    """Put serial -> (value, metadata) of `pv`'s array updates into `out` until `done()`; only
    the last 20 are kept (a whole frame here is up to 800 KB)."""
    stream = client.monitor([pv], max_columns=max_columns, max_pixels=max_pixels)
    try:
        async for u in stream:
            s = u.channel
            if isinstance(s.value, np.ndarray) and s.serial is not None:
                out[int(s.serial)] = (s.value, dict(s.metadata))
                if len(out) > 20:
                    del out[min(out)]
            if done():
                return
    finally:
        await stream.aclose()


async def _both(
    client: Client, pv: str, max_columns: int = 0, max_pixels: int = 0
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], dict[str, Any], int]:
    """The whole and the reduced value of one update of `pv`, monitored side by side.

    Both monitors run until they hold an update of the same serial: on a loaded machine one of
    them may attach seconds after the other (8 updates each did not overlap once), or skip
    serials (conflation).
    """
    whole: dict[int, tuple[np.ndarray[Any, Any], dict[str, Any]]] = {}
    reduced: dict[int, tuple[np.ndarray[Any, Any], dict[str, Any]]] = {}

    def overlap() -> bool:
        return bool(whole.keys() & reduced.keys())

    async with asyncio.timeout(60):
        await asyncio.gather(
            _by_serial(client, pv, whole, overlap),
            _by_serial(client, pv, reduced, overlap, max_columns, max_pixels),
        )
    common = sorted(whole.keys() & reduced.keys())
    assert common, (sorted(whole), sorted(reduced))
    serial = common[-1]
    return whole[serial][0], reduced[serial][0], reduced[serial][1], serial


async def test_a_noisy_waveform_arrives_as_numpys_min_max_per_column(client: Client) -> None:
    # Noise: every update differs, so a stale or shifted reduction cannot match by chance.
    pv = "sim://waveform?length=100003&shape=noise&rate=10"
    whole, reduced, meta, _ = await _both(client, pv, max_columns=1500)
    assert whole.shape == (100003,) and meta["type"] == "float64"
    assert meta["reduced"] == {"method": "minmax", "from": [100003]}
    assert reduced.dtype == np.float64 and reduced.shape == (3000,)
    assert np.array_equal(reduced, _expected_min_max(whole, 1500))


async def test_a_sim_image_arrives_subsampled_with_its_full_dims(client: Client) -> None:
    pv = "sim://image?width=200&height=120&dtype=uint16&rate=10"
    whole, reduced, meta, serial = await _both(client, pv, max_pixels=4096)
    assert meta["colorMode"] == "mono"
    assert meta["reduced"] == {"method": "subsample", "from": [120, 200], "step": 3}
    assert np.array_equal(reduced, whole[::3, ::3])
    # And the whole frame is the one the sim made for that update (serial n: frame n - 1).
    params = parse_sim(pv.removeprefix("sim://")).params
    assert np.array_equal(whole, image_frame(params, serial - 1))


async def test_arrays_under_the_limits_carry_no_reduced_entry(client: Client) -> None:
    pv = "sim://waveform?length=1000&rate=10"
    async with asyncio.timeout(30):
        got: dict[int, tuple[np.ndarray[Any, Any], dict[str, Any]]] = {}
        await _by_serial(client, pv, got, lambda: len(got) >= 2, 500, 4096)
    for value, meta in got.values():
        assert value.shape == (1000,) and "reduced" not in meta and meta["type"] == "float64"


SUBSCRIBE = """mutation($o: SubscribeOptions) {
  subscribe(ids: ["sim://waveform"], options: $o) { token } }"""


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"maxColumns": -1}, "maxColumns must be between 0"),
        ({"maxColumns": 100_001}, "maxColumns must be between 0"),
        ({"maxPixels": 100}, "maxPixels must be 0"),
        ({"maxPixels": -5}, "maxPixels must be 0"),
        ({"maxColumns": 100, "mode": "ALL"}, "need mode LATEST"),
    ],
)
def test_bad_reduction_options_are_refused_clearly(
    server: ServerProcess, options: dict[str, Any], message: str
) -> None:
    doc = server.graphql(SUBSCRIBE, {"o": options})
    assert doc["data"] is None, json.dumps(doc)
    assert message in doc["errors"][0]["message"]
    assert doc["errors"][0]["extensions"]["code"] == "BAD_REQUEST"


# --- the hub in memory (test-double backend, ticks by hand) ---------------------------------


async def test_a_reduced_view_sends_value_and_metadata_together(
    hub: Hub, backend: FakeBackend
) -> None:
    whole, reduced = HubClient(hub), HubClient(hub)
    attach(whole, hub, ["fake://a"])
    attach(reduced, hub, ["fake://a"], max_columns=10)
    assert len(hub.registry.views) == 2  # one view per distinct option set
    backend.update("a", np.zeros(100))  # the first value (it carries the alarm too)
    hub.ticker.tick()
    whole.drain()
    reduced.drain()
    a = np.arange(100.0)
    backend.update("a", a)
    hub.ticker.tick()
    [w] = whole.drain()[0][2][0][1]
    [r] = reduced.drain()[0][2][0][1]
    assert w[1] == VALUE | TIME and np.array_equal(w[2], a)
    # The delta carries META as well, and the metadata says how the value was reduced.
    assert r[1] == VALUE | TIME | META
    assert np.array_equal(r[2], _expected_min_max(a, 10))
    assert r[6]["reduced"] == {"method": "minmax", "from": [100]} and r[6]["units"] == "mm"


async def test_a_failing_reduction_sends_the_whole_array_and_fails_nothing(
    hub: Hub, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: object) -> None:
        raise ValueError("reduction bug")

    monkeypatch.setattr(channel_module, "reduce_value", boom)
    whole, reduced = HubClient(hub), HubClient(hub)
    attach(whole, hub, ["fake://a"])
    attach(reduced, hub, ["fake://a"], max_columns=10)
    a = np.arange(100.0)
    backend.update("a", a)
    hub.ticker.tick()
    for c in (whole, reduced):
        [e] = c.drain()[0][2][0][1]
        assert e[1] & CONN == 0  # not FAILED
        assert np.array_equal(e[2], a)
    assert hub.ticker.stats.failures == {"reduction": 1}
