"""The pvws-vs-stream benchmark runs once at a tiny size (no timing assertions)."""

from __future__ import annotations

from bench.pvws_vs_stream import compare


async def test_pvws_vs_stream_tiny() -> None:
    results = await compare(clients=2, pvs=5, rate=10.0, warmup=1.5, duration=1.5)
    assert [r.endpoint for r in results] == ["stream", "pvws"]
    assert all(r.updates_per_s > 0 for r in results)  # both endpoints delivered updates
