"""The image and big-array benchmarks once at a tiny size, so they cannot rot (`make test`).

No timing assertions: only that each ran end to end over the real server and counted frames.
The real runs: bench/README.md, "Images and big arrays".
"""

from __future__ import annotations

from bench import big_arrays, codecs, coniql_compare, pyclient_frame, pyclient_transport


def test_big_arrays_sweep_tiny() -> None:
    sizes = ["--waveform-sizes", "1000", "--image-sides", "32"]
    args = big_arrays.parser().parse_args(
        ["--duration", "1", "--warmup", "0.5", "--clients", "2", *sizes]
    )
    rows = big_arrays.sweep(args)
    assert [(r["kind"], r["clients"]) for r in rows] == [("waveform", 2), ("image", 2)]
    for r in rows:
        assert r["min_frames_per_client"] > 0 and r["MB_per_s"] > 0, r
        assert r["server_cpu_ms_per_MB"] is not None, r


def test_codecs_decode_every_codec_tiny() -> None:
    rows = codecs.measure(64, 2)  # raises if a lossless codec does not give the frame back
    assert [r["codec"] for r in rows] == ["lz4", "bslz4", "blosc", "jpeg"]
    assert all(r["compressed_MB"] > 0 and r["decode_ms"] > 0 for r in rows)


def test_pyclient_frame_tiny() -> None:
    got = pyclient_frame.measure(64, 3)
    assert got["frames"] == 4 and got["frame_MB"] == 64 * 64 * 2 / 1e6
    assert len(got["peak_python_memory_per_frame_in_frames"]) == 3


def test_pyclient_transport_tiny() -> None:
    got = pyclient_transport.measure(64, 2, rounds=1)
    assert set(got["transports"]) == {"websockets", "transport"}
    assert all(t["frames"] == 2 for t in got["transports"].values())


def test_coniql_compare_tiny() -> None:
    """pvwire and Coniql (from `make coniql`'s .venv-coniql) on the same tiny arrays."""
    args = ["--duration", "1", "--waveform", "1000", "--image", "32", "--clients", "1"]
    rows = coniql_compare.main(args)
    assert [(r["system"], r["pv"]) for r in rows] == [
        ("pvwire", "BENCH:WF"), ("coniql-0.4.2", "BENCH:WF"),
        ("pvwire", "BENCH:IMG"), ("coniql-0.4.2", "BENCH:IMG"),
    ]  # fmt: skip
    for r in rows:
        assert r["min_frames_per_client"] > 0 and r["MB_per_s"] > 0 and not r["errors"], r
