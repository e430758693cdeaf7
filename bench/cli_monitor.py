"""``pvwire monitor`` of many channels: lines per second, and how far behind the lines are.

`python -m bench.cli_monitor [--channels 1000] [--duration 15] [--save]` starts the real server
and runs ``pvwire monitor`` of N sim counters at 10 Hz (10,000 updates/s for 1,000), text then
``--json``, stdout into a pipe this process drains in large reads. Per mode: lines/s over the
window, bytes per line, the command's CPU (% of one core), and the lag of a sample of lines:
arrival time here minus the timestamp the line carries (sim channels stamp updates with the
server's clock, on this host). A command that keeps up prints ~10 lines per channel per second
with a lag of a frame or two; one that falls behind shows a lag growing over the window.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from .harness import _bench_env
from .scenario import RESULTS

PVWIRE = str(Path(sys.executable).with_name("pvwire"))
SAMPLE_EVERY = 50  # lines: parsing every line here would cost more than printing it there


def _stamp(line: bytes, json_mode: bool) -> float | None:
    """The update's time (POSIX seconds) a line carries, if it carries one."""
    if json_mode:
        doc = json.loads(line)
        return None if "seconds" not in doc else doc["seconds"] + doc["nanoseconds"] / 1e9
    parts = line.decode().split("  ")
    if len(parts) < 3 or parts[1].startswith("<"):
        return None
    day, frac = parts[1].split(".")
    return time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + float("0." + frac)


def run_mode(url: str, ids: list[str], json_mode: bool, warmup: float, duration: float) -> Any:
    env = {**_bench_env(), "PVWIRE_URL": url}
    cmd = [PVWIRE, "monitor", *(["--json"] if json_mode else []), *ids]
    cmd += ["--duration", "600"]  # ended by this function once its window is over
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout is not None
    fd = p.stdout.fileno()
    proc = psutil.Process(p.pid)
    launched, opens = (
        time.monotonic(),
        math.inf,
    )  # warmup seconds after the first output, however long the start took
    start: tuple[float, float] | None = None  # wall, CPU at the window's opening
    lines = nbytes = 0
    lags: list[float] = []
    rest = b""
    try:
        while True:
            now = time.monotonic()
            if opens == math.inf and now > launched + 120:
                raise RuntimeError("pvwire monitor printed nothing for 120 s")
            if start is None and now >= opens:
                t = proc.cpu_times()
                start = (now, t.user + t.system)
            elif start is not None and now >= start[0] + duration:
                t = proc.cpu_times()
                cpu = t.user + t.system - start[1]
                break
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"pvwire monitor ended early ({p.wait()})")
            arrived = time.time()
            if start is None:
                opens = min(opens, time.monotonic() + warmup)
                continue
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            whole, rest = data[:cut], data[cut:]
            n = whole.count(b"\n")
            first = lines // SAMPLE_EVERY
            lines += n
            nbytes += len(whole)
            if lines // SAMPLE_EVERY > first:  # sample the last whole line of this read
                last = whole[whole.rfind(b"\n", 0, len(whole) - 1) + 1 : -1]
                stamp = _stamp(last, json_mode)
                if stamp is not None:
                    lags.append(arrived - stamp)
    finally:
        p.stdout.close()  # a write blocked on the full pipe fails (EPIPE) instead of waiting
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    wall = time.monotonic() - start[0]
    lags.sort()
    q = lambda f: 1000 * lags[min(len(lags) - 1, int(f * len(lags)))] if lags else float("nan")  # noqa: E731
    return {
        "mode": "json" if json_mode else "text",
        "lines_per_s": lines / wall,
        "bytes_per_line": nbytes / max(lines, 1),
        "cpu_pct": 100 * cpu / wall,
        "lag_p50_ms": q(0.5),
        "lag_p99_ms": q(0.99),
        "lag_max_ms": 1000 * lags[-1] if lags else float("nan"),
        "lag_samples": len(lags),
    }


def measure(channels: int = 1000, warmup: float = 5.0, duration: float = 15.0) -> dict[str, Any]:
    from tests.server_process import ServerProcess

    ids = [f"sim://counter/cli{i}" for i in range(channels)]
    with ServerProcess("--log-level", "warning", env=_bench_env()) as server:
        return {
            "channels": channels,
            "expected_per_s": 10.0 * channels,
            "modes": [run_mode(server.url, ids, j, warmup, duration) for j in (False, True)],
        }


def table(res: dict[str, Any]) -> str:
    rows = [
        f"`pvwire monitor` of {res['channels']} sim counters x 10 Hz "
        f"({res['expected_per_s']:,.0f} updates/s)",
        "",
        "| output | lines/s | bytes/line | CPU % | lag p50 ms | lag p99 ms | lag max ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in res["modes"]:
        rows.append(
            f"| {m['mode']} | {m['lines_per_s']:,.0f} | {m['bytes_per_line']:.0f} | "
            f"{m['cpu_pct']:.1f} | {m['lag_p50_ms']:.0f} | {m['lag_p99_ms']:.0f} | "
            f"{m['lag_max_ms']:.0f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cli_monitor", description=__doc__)
    p.add_argument("--channels", type=int, default=1000)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--save", action="store_true", help="write results/cli_monitor.json")
    a = p.parse_args(argv)
    res = measure(a.channels, a.warmup, a.duration)
    print(table(res))
    if a.save:
        (RESULTS / "cli_monitor.json").write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
