"""What recent history costs (core/history/, DESIGN.md section 7c), in one run:

- recording: `Channel.on_update` per update with recording off and on, interleaved rounds on the
  same 1,000 channels, each updated once between two ticks (the tick's writes included), and
  `ChannelHistory.record` alone;
- memory: bytes per channel in each ring, and how many channels a budget holds;
- reading: `history` for an hour of 10 Hz data (36,000 updates recorded) at several
  `maxPoints`, and the backfill of an hour, by `ChannelHistory.query` and `.backfill` (no server,
  no HTTP: bench/history_http.py times the same queries over HTTP);
- arrays (`--history-array-max`): bytes per array channel and what its rings hold at 16, 256
  and 1,024 elements, recording a frame, and `history` over an hour of 10 Hz 16-element frames.

    .venv/bin/python -m bench.history [--updates 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from pvwire.core.channel import Channel
from pvwire.core.history import (
    BUCKET_DTYPE,
    CHANNEL_BYTES,
    NS,
    RAW_ITEM_BYTES,
    RAW_POINTS,
    TIERS,
    ChannelHistory,
    HistoryStore,
    array_sizes,
)
from pvwire.core.tick import Ticker
from pvwire.model import ConnState

from tests.hub_doubles import FakeBackend

# Channels updated once each between two ticks, as 1,000 PVs of 10 Hz are at a 10 Hz tick: the
# tick writes their updates into the journal in one call (core/channel.py), so a loop of one
# channel would time that call, not what it costs per update.
CHANNELS = 1_000


def per_update(channels: list[Channel], ticker: Ticker, n: int, start: int) -> float:
    """Seconds per update of 10 Hz counters (values and times change every update), each
    channel updated once between two ticks, the ticks included."""
    calls = [ch.on_update for ch in channels]
    ticks = max(n // len(calls), 1)
    t0 = time.perf_counter()
    for k in range(start, start + ticks):
        value, seconds, nanoseconds = float(k), 1_700_000_000 + k // 10, (k % 10) * 100_000_000
        for on_update in calls:
            on_update(value, seconds, nanoseconds, 0, 0, "")
        ticker.tick()
    return (time.perf_counter() - t0) / (ticks * len(calls))


def record_alone(n: int) -> float:
    record = ChannelHistory("fake://y").record
    t0 = time.perf_counter()
    for i in range(n):
        record(float(i), 1_700_000_000 + i // 10, (i % 10) * 100_000_000, 0, 0)
    return (time.perf_counter() - t0) / n


def loop_alone(n: int) -> float:
    """The benchmark loop with a call that does nothing: what the figures above include."""

    def record(value: float, seconds: int, nanoseconds: int, severity: int, status: int) -> None:
        pass

    t0 = time.perf_counter()
    for i in range(n):
        record(float(i), 1_700_000_000 + i // 10, (i % 10) * 100_000_000, 0, 0)
    return (time.perf_counter() - t0) / n


def recording(updates: int, rounds: int) -> dict[str, float]:
    # The server's own tick, on a loop that never runs: `per_update` calls `tick()` itself.
    loop = asyncio.new_event_loop()
    try:
        return _recording(Ticker(20.0, loop), updates, rounds)
    finally:
        loop.close()


def _recording(ticker: Ticker, updates: int, rounds: int) -> dict[str, float]:
    backend = FakeBackend()
    channels = [Channel(f"fake://x{k}", backend, f"x{k}", ticker) for k in range(CHANNELS)]
    for ch in channels:
        ch.on_connection(ConnState.CONNECTED)
    ticker.tick()
    # Held by a store, as the server's are: written through the store's journal.
    store = HistoryStore(CHANNELS * CHANNEL_BYTES)
    histories = [store.attach(ch.id) for ch in channels]
    assert all(h is not None for h in histories)
    off: list[float] = []
    on: list[float] = []
    alone: list[float] = []
    empty: list[float] = []
    start = 0
    ticks = max(updates // CHANNELS, 1)
    for _ in range(rounds):  # interleaved, so all see the same machine
        # Off as in a server without a budget (its tick does not look for pending updates).
        ticker.records = False
        for ch in channels:
            ch.record_into(None)
        off.append(per_update(channels, ticker, updates, start))
        start += ticks
        ticker.records = True
        for ch, h in zip(channels, histories, strict=True):
            ch.record_into(h)
        on.append(per_update(channels, ticker, updates, start))
        start += ticks
        alone.append(record_alone(updates))
        empty.append(loop_alone(updates))
    assert not ticker.stats.failures, ticker.stats.failures  # recording failed nowhere
    ns = 1e9
    out: dict[str, float] = {}
    print(f"recording ({rounds} interleaved rounds of {updates:,} updates of {CHANNELS:,} "
          "channels; best, median):")  # fmt: skip
    for key, name, xs in (("off", "Channel.on_update, history off", off),
                          ("on", "Channel.on_update, history on", on),
                          ("record", "ChannelHistory.record, loop incl.", alone),
                          ("loop", "the loop with an empty call", empty)):  # fmt: skip
        out[f"{key}_ns_best"] = round(min(xs) * ns, 1)
        out[f"{key}_ns_median"] = round(statistics.median(xs) * ns, 1)
        print(f"  {name:<34} {min(xs) * ns:6.0f} ns  {statistics.median(xs) * ns:6.0f} ns")
    best, median = min(on) - min(off), statistics.median(on) - statistics.median(off)
    out["added_ns_best"] = round(best * ns, 1)
    out["added_ns_median"] = round(median * ns, 1)
    print(f"  recording adds to on_update       {best * ns:6.0f} ns  {median * ns:6.0f} ns")
    return out


def memory() -> dict[str, int]:
    print("memory per channel:")
    raw = RAW_POINTS * RAW_ITEM_BYTES
    out = {"raw_points": RAW_POINTS, "raw_bytes": raw, "channel_bytes": CHANNEL_BYTES}
    print(f"  raw ring: {RAW_POINTS:,} updates x {RAW_ITEM_BYTES} B = {raw / 1024:.1f} KiB")
    for width, size in TIERS:
        nbytes = size * BUCKET_DTYPE.itemsize
        span = width * size / NS
        out[f"tier_{width // NS}s_buckets"] = size
        out[f"tier_{width // NS}s_bytes"] = nbytes
        print(f"  {width // NS:>4} s buckets: {size:,} x {BUCKET_DTYPE.itemsize} B = "
              f"{nbytes / 1024:.1f} KiB, {span / 3600:g} h")  # fmt: skip
    print(f"  total {CHANNEL_BYTES:,} B = {CHANNEL_BYTES / 1024:.1f} KiB per channel")
    for mb in (64, 128, 512):
        out[f"channels_in_{mb}mb"] = (mb << 20) // CHANNEL_BYTES
        print(f"  --history-mb {mb}: {(mb << 20) // CHANNEL_BYTES:,} channels")
    return out


def timed(call: Callable[[], object], repeat: int = 20) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def reading(repeat: int = 20) -> dict[str, float | int]:
    history = ChannelHistory("fake://x")
    now = time.time_ns()
    n = 36_000  # an hour at 10 Hz
    first = now - 3600 * NS
    for i in range(n):
        t = first + i * (NS // 10)
        history.record(float(i), t // NS, t % NS, 0, 0)
    print(f"reading an hour of 10 Hz data ({n:,} updates recorded):")
    out: dict[str, float | int] = {}
    for max_points in (1000, 360, 20, 100_000):
        got = history.query(first, now, max_points)
        best = timed(lambda m=max_points: history.query(first, now, m), repeat)  # type: ignore[misc]
        out[f"hour_max{max_points}_rows"] = len(got)
        out[f"hour_max{max_points}_resolution_s"] = got.resolution // NS
        out[f"hour_max{max_points}_us_best"] = round(best * 1e6, 1)
        kind = "points" if not got.resolution else f"{got.resolution // NS} s buckets"
        print(f"  history(maxPoints={max_points:>6,}): {len(got):>5,} rows ({kind:>13})"
              f"  {best * 1e6:8.0f} us")  # fmt: skip
    recent = history.query(now - 60 * NS, now, 1000)
    best = timed(lambda: history.query(now - 60 * NS, now, 1000), repeat)
    out["last60s_rows"] = len(recent)
    out["last60s_us_best"] = round(best * 1e6, 1)
    print(
        f"  history(last 60 s):        {len(recent):>5,} rows (points)         {best * 1e6:8.0f} us"
    )
    parts = history.backfill(first)
    best = timed(lambda: history.backfill(first), repeat)
    rows = " + ".join(f"{len(p):,}" for p in parts)
    out["backfill_hour_rows"] = sum(len(p) for p in parts)
    out["backfill_hour_us_best"] = round(best * 1e6, 1)
    print(f"  backfill of an hour:        {rows} rows                {best * 1e6:8.0f} us")
    return out


def arrays(frames: int, repeat: int = 20) -> dict[str, float | int]:
    """Array channels: memory per channel, recording a frame, and an hour of 10 Hz frames."""
    import numpy as np

    out: dict[str, float | int] = {}
    print("array channels (--history-array-max):")
    for width in (16, 256, 1024):
        store = HistoryStore(1 << 30, 1024)
        history = store.attach("fake://w")
        assert history is not None
        values = [np.arange(width, dtype=np.float64) + i for i in range(64)]
        now = time.time_ns()
        best = float("inf")
        for r in range(3):
            t0 = time.perf_counter()
            for i in range(frames):
                t = now + (r * frames + i) * (NS // 10)
                history.record(values[i & 63], t // NS, t % NS, 0, 0)
            best = min(best, (time.perf_counter() - t0) / frames)
        held = store.stats().used_bytes
        raw, sizes = array_sizes(width)
        out[f"w{width}_bytes"] = held
        out[f"w{width}_frames"] = raw
        out[f"w{width}_channels_in_128mb"] = (128 << 20) // held
        out[f"w{width}_record_ns_best"] = round(best * 1e9, 1)
        tiers = ", ".join(f"{n} x {w // NS} s" for (w, _), n in zip(TIERS, sizes, strict=True))
        fit = (128 << 20) // held
        print(f"  {width:>5} elements: {held / 1024:7.1f} KiB per channel ({raw} frames; "
              f"{tiers}), {fit:,} in 128 MB; a frame {best * 1e9:6.0f} ns")  # fmt: skip
    store = HistoryStore(1 << 30, 16)
    history = store.attach("fake://w")
    assert history is not None
    now = time.time_ns()
    n = 36_000
    first = now - 3600 * NS
    frame = np.zeros(16)
    for i in range(n):
        t = first + i * (NS // 10)
        frame[:] = i
        history.record(frame, t // NS, t % NS, 0, 0)
    got = history.query(first, now, 1000)
    best = timed(lambda: history.query(first, now, 1000), repeat)
    out["w16_hour_max1000_rows"] = len(got)
    out["w16_hour_max1000_us_best"] = round(best * 1e6, 1)
    parts = history.backfill(first)
    backfill = timed(lambda: history.backfill(first), repeat)
    out["w16_backfill_hour_us_best"] = round(backfill * 1e6, 1)
    print(f"  an hour of 10 Hz 16-element frames: history(maxPoints=1,000) {len(got)} rows "
          f"{best * 1e6:.0f} us; backfill {' + '.join(str(len(p)) for p in parts)} rows "
          f"{backfill * 1e6:.0f} us")  # fmt: skip
    return out


def measure(updates: int = 200_000, rounds: int = 5, repeat: int = 20) -> dict[str, Any]:
    """Every figure of the four parts, for bench_extras.py's `test_history`."""
    return {
        "recording": recording(updates, rounds),
        "memory": memory(),
        "reading": reading(repeat),
        "arrays": arrays(max(updates // 10, 100), repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    measure(args.updates, args.rounds)


if __name__ == "__main__":
    main()
