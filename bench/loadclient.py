"""A cheap load client: one process, many WebSocket connections to /stream, every counter checked.

Run by the harness (`bench.harness`), never by hand: `python -m bench.loadclient SPEC.json`.
It connects and attaches every connection of the spec, prints `READY`, waits for
`GO <t0> <t1>` on stdin (wall-clock window), counts what arrives inside the window, and writes
its results as JSON to the spec's `out` file after `t1` (or the hard `deadline`).

Per-entry work is kept minimal so the clients do not starve the server on a 2-core machine:
- a DATA frame is parsed with `msgpack.unpackb`, and the entries of a group become numpy arrays;
  byte-identical groups (the fan-out case: every client of one view gets the same bytes after the
  frame's `seq`) are decoded once per process and the arrays reused;
- every connection then checks its own counters with one vectorised numpy pass per group:
  `serial` jumps are conflation (server side), value jumps larger than the serial jump are
  missing updates (lost before pvwire counted them); latency = receive time - IOC timestamp.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgpack
import numpy as np
import websockets

# Latency histogram: bin = floor(100 * log10(latency in µs)), i.e. ~2.3 % wide bins.
HIST_BINS = 800  # up to 10^8 µs = 100 s


def _ext_hook(code: int, data: bytes) -> Any:
    if code != 1:
        return msgpack.ExtType(code, data)
    ndim = data[1]
    off = 2 + 4 * ndim
    dt = ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8")[data[0]]
    return np.frombuffer(data, dtype="<" + dt, offset=off)


def _payload_offset(buf: bytes) -> int:
    """Offset of `groups` in a DATA frame `[3, seq, groups]` (after the variable-size seq)."""
    b = buf[2]
    if b < 0x80:
        return 3
    return {0xCC: 4, 0xCD: 5, 0xCE: 7, 0xCF: 11}[b]


class Decoded:
    """One group's entries as arrays (only entries carrying VALUE; others are counted)."""

    __slots__ = ("n_other", "serials", "sids", "stamps", "values")

    def __init__(self, entries: list[list[Any]], waveform: bool) -> None:
        if waveform and None in entries:
            # nil items pad array entries (PROTOCOL.md section 3); scalar groups have none.
            entries = [e for e in entries if e is not None]
        if not waveform and entries and all(len(e) == 6 and e[1] == 3 for e in entries):
            a = np.array(entries, dtype=np.float64)
            self.sids = a[:, 0].astype(np.int64)
            self.values = a[:, 2]
            self.serials = a[:, 3].astype(np.int64)
            self.stamps = a[:, 4] + a[:, 5] * 1e-9
            self.n_other = 0
            return
        sids, vals, sers, stamps = [], [], [], []
        other = 0
        for e in entries:
            mask = e[1]
            if not mask & 1:
                other += 1
                continue
            sids.append(e[0])
            v = e[2]
            vals.append(float(v) if not isinstance(v, np.ndarray) else math.nan)
            sers.append(e[3])
            stamps.append(e[4] + e[5] * 1e-9 if mask & 2 else math.nan)
        self.sids = np.array(sids, dtype=np.int64)
        self.values = np.array(vals, dtype=np.float64)
        self.serials = np.array(sers, dtype=np.int64)
        self.stamps = np.array(stamps, dtype=np.float64)
        self.n_other = other


class Conn:
    """One connection's counters state and results."""

    def __init__(self, n: int, kind: str) -> None:
        self.n = n
        self.waveform = kind == "waveform"
        self.last_serial = np.zeros(n, np.int64)
        self.last_value = np.zeros(n, np.float64)  # counter value, or IOC stamp for waveforms
        self.have = np.zeros(n, bool)
        self.frames = 0
        self.bytes = 0
        self.received = 0
        self.conflated = 0
        self.missing = 0
        self.expected = 0
        self.seq_gaps = 0
        self.resets = 0
        self.other = 0
        self.hist = np.zeros(HIST_BINS, np.int64)
        self.lat_max = 0.0
        self.seq = 0
        self.error = ""
        self.snapshot_entries = 0

    def apply(self, d: Decoded, now: float, counting: bool, offset: int = 0) -> None:
        idx = d.sids + offset if offset else d.sids
        if not len(idx):
            self.other += d.n_other if counting else 0
            return
        ser = d.serials
        val = d.stamps * 10.0 if self.waveform else d.values  # waveform: stamp in 100 ms units
        known = self.have[idx]
        ds = ser - self.last_serial[idx]
        dv = val - self.last_value[idx]
        self.last_serial[idx] = ser
        self.last_value[idx] = val
        self.have[idx] = True
        if not counting:
            return
        ok = known & (ds > 0)
        self.resets += int(np.count_nonzero(known & (ds <= 0)))
        dsk = ds[ok]
        # Waveforms: stamps in 100 ms units; a frame is missing when the gap exceeds ~1.7 periods
        # (IOC scan jitter must not count as loss).
        dvk = (np.floor(dv[ok] + 0.3) if self.waveform else np.rint(dv[ok])).astype(np.int64)
        self.received += len(idx)
        self.other += d.n_other
        self.conflated += int(dsk.sum()) - len(dsk)
        self.missing += int(np.clip(dvk - dsk, 0, None).sum())
        self.expected += int(np.maximum(dvk, dsk).sum())
        lat_us = (now - d.stamps) * 1e6
        if len(lat_us):
            m = float(lat_us.max())
            if m > self.lat_max:
                self.lat_max = m
            b = np.clip(np.log10(np.maximum(lat_us, 1.0)) * 100.0, 0, HIST_BINS - 1).astype(np.intp)
            self.hist += np.bincount(b, minlength=HIST_BINS)

    def result(self) -> dict[str, Any]:
        nz = np.nonzero(self.hist)[0]
        return {
            "frames": self.frames,
            "bytes": self.bytes,
            "received": self.received,
            "expected": self.expected,
            "conflated": self.conflated,
            "missing": self.missing,
            "seq_gaps": self.seq_gaps,
            "resets": self.resets,
            "other": self.other,
            "snapshot_entries": self.snapshot_entries,
            "lat_max_us": self.lat_max,
            "hist": [[int(i), int(self.hist[i])] for i in nz],
            "error": self.error,
        }


class Shared:
    """Decoded groups by their bytes, shared by the connections of this process."""

    def __init__(self) -> None:
        self.cache: dict[bytes, list[tuple[int, Decoded]]] = {}
        self.decodes = 0
        self.hits = 0

    def groups(self, payload: bytes, waveform: bool) -> list[tuple[int, Decoded]]:
        got = self.cache.get(payload)
        if got is not None:
            self.hits += 1
            return got
        self.decodes += 1
        groups = msgpack.unpackb(payload, ext_hook=_ext_hook, raw=False)
        got = [(att, Decoded(entries, waveform)) for att, entries in groups]
        if len(self.cache) > 32:
            self.cache.clear()
        self.cache[payload] = got
        return got


async def run_conn(
    url: str,
    tokens: list[tuple[str, int]],
    conn: Conn,
    shared: Shared,
    window: list[float],
    ready: asyncio.Event,
) -> None:
    """Connect, attach every token (sids of attachment k follow those of k-1), then receive
    until the window is over."""
    ws = await websockets.connect(
        url,
        subprotocols=["pvwire.v1.aligned", "pvwire.v1"],
        compression=None,
        max_size=None,
        max_queue=64,
    )
    offsets: dict[int, int] = {}
    try:
        hello = msgpack.unpackb(await ws.recv())
        assert hello[0] == 0, hello
        base = 0
        for req, (token, n) in enumerate(tokens, 1):
            await ws.send(msgpack.packb([16, req, token]))
            while True:
                msg = await ws.recv()
                assert isinstance(msg, bytes)
                kind = msg[1] if msg[0] >> 4 == 9 else -1
                if kind == 2:  # SNAPSHOT: initial state
                    snap = msgpack.unpackb(msg, ext_hook=_ext_hook, raw=False)
                    conn.seq = snap[1]
                    offsets[snap[2]] = base
                    decoded = Decoded(snap[3], conn.waveform)
                    conn.snapshot_entries += len(decoded.sids) + decoded.n_other
                    conn.apply(decoded, time.time(), False, base)
                    break
                if kind == 5:
                    raise RuntimeError(f"server error: {msgpack.unpackb(msg)}")
            base += n
        ready.set()
        waveform = conn.waveform
        while True:
            t1 = window[1]
            remaining = (t1 if t1 else window[2]) - time.time()
            if remaining <= 0:
                return
            try:
                msg = await asyncio.wait_for(ws.recv(), remaining)
            except TimeoutError:
                return
            now = time.time()
            if msg[1] != 3:  # not DATA (heartbeat, ...)
                continue
            counting = window[0] <= now <= t1 if t1 else False
            off = _payload_offset(msg)
            seq = msgpack.unpackb(msg[2:off])
            if seq != conn.seq + 1:
                conn.seq_gaps += 1
            conn.seq = seq
            if counting:
                conn.frames += 1
                conn.bytes += len(msg)
            for att, d in shared.groups(msg[off:], waveform):
                conn.apply(d, now, counting, offsets[att])
    except Exception as exc:  # reported in the results, never hidden
        conn.error = f"{type(exc).__name__}: {exc}"
        ready.set()
    finally:
        await ws.close()


async def main_async(spec: dict[str, Any]) -> None:
    url = spec["url"]
    shared = Shared()
    window = [0.0, 0.0, spec["deadline"]]  # t0, t1 (0 until GO), hard deadline
    conns: list[Conn] = []
    tasks = []
    readies = []
    for c in spec["conns"]:
        tokens = [(t, n) for t, n in c["tokens"]]
        conn = Conn(sum(n for _, n in tokens), c.get("kind", "counter"))
        ev = asyncio.Event()
        conns.append(conn)
        readies.append(ev)
        tasks.append(asyncio.ensure_future(run_conn(url, tokens, conn, shared, window, ev)))
        await asyncio.sleep(0)  # connect gradually
    await asyncio.wait_for(
        asyncio.gather(*(r.wait() for r in readies)), max(1.0, spec["deadline"] - time.time())
    )
    loop = asyncio.get_running_loop()
    go = asyncio.Event()

    def read_go() -> None:
        line = sys.stdin.readline().split()
        if len(line) == 3 and line[0] == "GO":
            window[0], window[1] = float(line[1]), float(line[2])
        loop.call_soon_threadsafe(go.set)

    threading.Thread(target=read_go, daemon=True).start()
    print("READY", flush=True)
    await asyncio.wait_for(go.wait(), max(1.0, spec["deadline"] - time.time()))
    await asyncio.wait(tasks, timeout=max(1.0, spec["deadline"] - time.time()))
    for t in tasks:
        t.cancel()
    out = {
        "conns": [c.result() for c in conns],
        "decodes": shared.decodes,
        "cache_hits": shared.hits,
    }
    with open(spec["out"], "w") as f:
        json.dump(out, f)


def run_child(main_async: Callable[[dict[str, Any]], Coroutine[Any, Any, None]]) -> None:
    """A load-client process's body: `main_async` on the spec in the JSON file named by argv[1],
    on uvloop where it is installed."""
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    try:
        import uvloop

        uvloop.run(main_async(spec))
    except ImportError:  # pragma: no cover
        asyncio.run(main_async(spec))


def main() -> None:
    run_child(main_async)


if __name__ == "__main__":
    main()
