"""Every other measurement of bench/README.md as a pytest-benchmark test: `make bench`.

Each test runs one measurement module of bench/ (or a benchmark of the TypeScript client in
clients/ts/bench/) once, at the size bench/README.md reports (a few PVs and second-long windows
with `BENCH_QUICK=1`), and records every number it returned in `extra_info`. Nothing is asserted
about them: performance is measured here, not tested.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from . import (
    aa_http,
    archive_span,
    big_arrays,
    ca_recovery,
    churn,
    cli_monitor,
    client_cpu,
    codecs,
    coniql_compare,
    control_plane,
    drain,
    failover,
    gateway,
    history,
    history_http,
    identity_puts,
    ingest,
    pva_soak,
    pvws_vs_stream,
    pyclient_frame,
    pyclient_transport,
    resume,
)
from .conftest import Measure, flatten
from .scenario import RESULTS

ROOT = Path(__file__).resolve().parent.parent
TS = ROOT / "clients" / "ts"
RAW = RESULTS / "raw"


@contextlib.contextmanager
def own_environ() -> Iterator[None]:
    """Failover, gateway and the soaks point os.environ at their own IOC: give it back."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def keyed(rows: Sequence[dict[str, Any]], *keys: str) -> dict[str, Any]:
    """Rows of a table as one dict, each row under its key fields joined by '.'."""
    return {".".join(str(r[k]) for k in keys): r for r in rows}


def test_failover(measure: Measure, quick: bool) -> None:
    """Three replicas behind HAProxy, the busiest stopped: time to a snapshot, updates missed."""
    with own_environ():
        measure(lambda: failover.measure(trials=1 if quick else 3), flatten)


def test_drain(measure: Measure, quick: bool) -> None:
    """1,000 clients on the replica that stops: drained (4012 paced) against all at once (1012)."""
    with own_environ():
        if quick:
            measure(lambda: drain.measure(clients=12, delay_s=1.0, window_s=2.0), flatten)
        else:
            measure(drain.measure, flatten)


def test_gateway(measure: Measure, quick: bool) -> None:
    """PVA counters direct and through p4p's pvagw: what the gateway adds."""
    with own_environ():
        measure(lambda: gateway.measure(10 if quick else 500, 2.0 if quick else 15.0), flatten)


def test_client_cpu(measure: Measure, quick: bool) -> None:
    """The Python client's CPU: monitor, monitor_batches and a raw floor, one run."""
    args = (20, 2.0, 2.0) if quick else (1000, 5.0, 15.0)
    measure(lambda: client_cpu.measure(*args), flatten)


def test_cli_monitor(measure: Measure, quick: bool) -> None:
    """`pvwire monitor`, text then --json: lines/s, CPU, lag."""
    args = (20, 2.0, 2.0) if quick else (1000, 5.0, 15.0)
    measure(lambda: cli_monitor.measure(*args), lambda got: flatten(keyed(got["modes"], "mode")))


def test_churn(measure: Measure, quick: bool) -> None:
    """Clients registering, attaching, detaching and dropping: server RSS and fds over time
    (plotted into bench/results/raw/churn.png)."""

    def soak() -> dict[str, Any]:
        duration, workers, every = (4.0, 2, 0.5) if quick else (1800.0, 8, 1.0)
        res = asyncio.run(churn.soak(duration, workers=workers, sample_every=every))
        RAW.mkdir(parents=True, exist_ok=True)
        churn.plot(res, RAW / "churn.png")
        return res

    measure(soak, flatten)


def test_pva_soak(measure: Measure, quick: bool) -> None:
    """PVA monitors opened and closed under load: RSS and fds."""
    args = (5, 3, 3.0, 1.0) if quick else (1000, 200, 600.0, 15.0)
    with own_environ():
        measure(lambda: pva_soak.run(*args), flatten)


@pytest.mark.parametrize("source", ["ca", "pva"])
def test_ingest(measure: Measure, quick: bool, source: str) -> None:
    """pvwire's ingest alone (its backend's monitors into a counting sink) against the plain
    library with a trivial callback, rounds interleaved in one run (`ratio`: to the floor)."""
    module = f"bench.{source}_ingest"
    modes = ["aioca" if source == "ca" else "asyncio", "pvwire"]
    pvs, duration, rounds = (5, 1.0, 1) if quick else (1000, 10.0, 2)

    rows = lambda: ingest.run(module, pvs, duration, rounds, modes)  # noqa: E731
    measure(lambda: keyed(rows(), "mode", "round"), flatten)


def test_pvws_vs_stream(measure: Measure, quick: bool) -> None:
    """The pvws JSON endpoint against /stream, same server, same sim load."""
    args = (2, 5, 10.0, 1.5, 1.5) if quick else (10, 200, 10.0, 3.0, 15.0)

    def run() -> dict[str, Any]:
        results = asyncio.run(pvws_vs_stream.compare(*args))
        got: dict[str, Any] = {
            r.endpoint: {**asdict(r), "us_per_update": r.us_per_update} for r in results
        }
        stream_us = got["stream"]["us_per_update"]
        if stream_us:
            got["pvws_over_stream_us_per_update"] = got["pvws"]["us_per_update"] / stream_us
        return got

    measure(run, flatten)


@pytest.mark.parametrize("kind", list(control_plane.REQUESTS))
def test_control_plane(measure: Measure, quick: bool, kind: str) -> None:
    """Gaps between a 50 Hz counter's frames, alone and while GraphQL clients send one kind of
    heavy request back to back."""
    with own_environ():
        control_plane.apply_loopback_env()
        measure(lambda: asyncio.run(control_plane.measure(1.0 if quick else 5.0, [kind])), flatten)


def test_ca_recovery(measure: Measure, quick: bool) -> None:
    """An IOC killed and restarted: DISCONNECTED after the kill, value back after it is ready."""
    runs, outages = (1, [0.0]) if quick else (3, [0.0, 5.0, 15.0])

    def run() -> dict[str, Any]:
        with own_environ():
            ca_recovery.apply_loopback_env()
            got = asyncio.run(ca_recovery.measure("ca", runs, outages))
        out: dict[str, Any] = {}
        for outage in outages:
            backs = [b for o, _, b in got if o == outage]
            out[f"outage_{outage:g}s.back_s_median"] = statistics.median(backs)
            out[f"outage_{outage:g}s.back_s_max"] = max(backs)
        downs = [d * 1000 for _, d, _ in got]
        out["disconnected_ms_median"] = statistics.median(downs)
        out["disconnected_ms_max"] = max(downs)
        backs = [b for _, _, b in got]
        out["back_s_median"], out["back_s_max"] = statistics.median(backs), max(backs)
        return out

    measure(run, flatten)


def test_resume(measure: Measure, quick: bool) -> None:
    """The server killed and restarted: each client's first value after it answers again."""
    outages, trials = ([1.0], 1) if quick else ([10.0, 30.0], 5)
    with own_environ():
        resume.apply_loopback_env()
        measure(lambda: asyncio.run(resume.run(outages, trials, None)), flatten)


def test_big_arrays(measure: Measure, quick: bool) -> None:
    """The largest waveform and image at 10 Hz with zero missing frames, 1 and 10 clients."""
    argv = ["--duration", "1", "--warmup", "0.5", "--clients", "2", "--waveform-sizes", "1000",
            "--image-sides", "32"] if quick else []  # fmt: skip
    rows = lambda: keyed(big_arrays.sweep(big_arrays.parser().parse_args(argv)),  # noqa: E731
                         "kind", "clients", "size")  # fmt: skip
    measure(rows, flatten)


CONIQL_SIZES = {
    "default": [],  # a 1,000,000-point float64 waveform and a 1024 x 1024 image
    "small": ["--waveform", "250000", "--image", "512"],  # sizes Coniql can serve one client
}


@pytest.mark.parametrize("sizes", list(CONIQL_SIZES))
def test_coniql_images(measure: Measure, quick: bool, sizes: str) -> None:
    """pvwire and Coniql 0.4.2 side by side on the same waveform and image, 1 and 10 clients."""
    tiny = ["--duration", "1", "--waveform", "1000", "--image", "32", "--clients", "1"]
    argv = tiny if quick else CONIQL_SIZES[sizes]
    rows = lambda: coniql_compare.main(argv)  # noqa: E731
    measure(lambda: keyed(rows(), "system", "pv", "clients"), flatten)


def test_codecs(measure: Measure, quick: bool) -> None:
    """areaDetector's codecs: decode cost of one frame each."""
    size, repeat = (64, 2) if quick else (2048, 20)
    measure(lambda: keyed(codecs.measure(size, repeat), "codec"), flatten)


def test_identity_puts(measure: Measure, quick: bool) -> None:
    """CA puts through libca, on a user's new circuit and on that user's open one; PVA puts
    through p4p, on a user's new connection and on that user's open one."""
    puts, rounds = (5, 1) if quick else (30, 3)
    with own_environ():
        measure(lambda: identity_puts.measure(puts, rounds), flatten)


def test_history(measure: Measure, quick: bool) -> None:
    """Recent history: on_update with recording off and on, bytes per channel per tier, and
    `history` over an hour of 10 Hz data (bench/history.py)."""
    updates, rounds, repeat = (2000, 1, 2) if quick else (200_000, 5, 20)
    measure(lambda: history.measure(updates, rounds, repeat), flatten)


def test_history_http(measure: Measure, quick: bool) -> None:
    """`history` over real HTTP against a real server holding an hour of 10 Hz data, beside the
    same reads in-process (bench/history_http.py)."""
    measure(lambda: history_http.measure(2 if quick else 20), flatten)


def test_aa_http(measure: Measure, quick: bool) -> None:
    """The Archiver Appliance API (getData.raw, getData.json; raw and mean_60) against GraphQL
    `history`, an hour at 10 Hz and a day at 1 Hz, one real server (bench/aa_http.py)."""
    measure(lambda: aa_http.measure(2 if quick else 20), flatten)


def test_archive_span(measure: Measure, quick: bool) -> None:
    """A day across the facility's archive (a second pvwire) and the recent hour, through the
    front server (GraphQL history, getData.raw/.json, raw and mean_60), cold and cached, against
    the archive alone and the front alone, one run (bench/archive_span.py)."""
    measure(lambda: archive_span.measure(2 if quick else 20), flatten)


def test_pyclient_frame(measure: Measure, quick: bool) -> None:
    """One 4-megapixel frame in the Python client: peak memory, copies, decode time."""
    side, frames, repeat = (64, 3, 3) if quick else (2048, 20, 30)
    measure(lambda: pyclient_frame.measure(side, frames, repeat), flatten)


def test_pyclient_transport(measure: Measure, quick: bool) -> None:
    """The same frame through the client's transport and through websockets, alternated."""
    side, frames, rounds = (64, 2, 1) if quick else (2048, 20, 2)
    measure(lambda: pyclient_transport.measure(side, frames, rounds), flatten)


def node_rows(script: str, *args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run a benchmark of the TypeScript client (built by `make tsbuild`); its JSON lines."""
    python = str(ROOT / ".venv" / "bin" / "python")
    full_env = {**os.environ, "PVWIRE_PYTHON": python, **(env or {})}
    out = subprocess.run(
        ["node", f"bench/{script}", *args], cwd=TS, env=full_env, capture_output=True, text=True,
        check=True, timeout=3600,
    ).stdout  # fmt: skip
    rows = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


@contextlib.contextmanager
def kept(paths: Sequence[Path]) -> Iterator[None]:
    """Put these files back as they were: page_images.mjs writes its JSON and screenshots into
    bench/results/, which a quick run must not replace."""
    saved = {p: p.read_bytes() for p in paths if p.exists()}
    try:
        yield
    finally:
        for p in paths:
            if p in saved:
                p.write_bytes(saved[p])
            else:
                p.unlink(missing_ok=True)


def test_page_images(measure: Measure, quick: bool) -> None:
    """The demo page in headless Chromium at 10 Hz: frames drawn, main-thread ms per frame."""
    env = {"PVWIRE_BENCH_CASES": "image-1024-uint16"} if quick else {}
    window = "2" if quick else "10"
    written = [RESULTS / "page_images.json", RESULTS / "page-image-1024-uint16.png"]
    with kept(written if quick else []):
        measure(lambda: keyed(node_rows("page_images.mjs", window, env=env), "case"), flatten)


def test_decode_aligned(measure: Measure, quick: bool) -> None:
    """decodeServerMessage in headless Chromium, aligned against unaligned ndarray data."""
    measure(lambda: keyed(node_rows("decode_aligned.mjs"), "case"), flatten)
