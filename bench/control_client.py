"""The control room's load client: many screens on `/stream` and `/pvws/pv`, opened and closed.

Run by `bench.control`, never by hand: `python -m bench.control_client SPEC.json`. It opens the
spec's screens (each its own seeded random subset of the channels), prints `READY`, waits for
`GO <t0> <t1>` on stdin, replaces one screen at a time at the spec's steady rate during the
window (close it, open a new one with a new subset) and writes its results as JSON after `t1`.

Cheap by construction, so that the server's two cores are what is measured:
- a minimal WebSocket reader on asyncio streams (no per-message futures, no UTF-8 checks):
  frames are cut from the byte stream and only their first bytes are looked at;
- `/stream`: a DATA frame's `seq` is checked (gaps counted) and its entries counted from the
  MessagePack array header; one frame in `SAMPLE` is decoded whole for latency (sim or IOC
  timestamp to receipt);
- `/pvws/pv`: one message per PV update. While a screen opens, every message is parsed to see
  when each of its PVs has shown; once open, updates are counted by their prefix in the bytes
  read (no frame parsing: at 1,000,000 messages a second that was more than the server's
  cost), and one read in `SAMPLE` gives the latency of its last whole message.
A screen is open (its `open` time) when every one of its PVs has a value: the `/stream`
snapshot, or the first update of each PV on `/pvws/pv`, timed from the GraphQL `subscribe`
(stream) or from the WebSocket connect (pvws).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import random
import re
import sys
import threading
import time
from typing import Any

import msgpack

from .loadclient import HIST_BINS, run_child

SAMPLE = 8  # one DATA frame (stream) or update (pvws) in SAMPLE is decoded for latency
OPENING_AT_ONCE = 16  # screens of one process opening concurrently at start
SUBSCRIBE = "mutation($ids: [String!]!) { subscribe(ids: $ids) { token } }"
UPDATE_PREFIX = b'{"type":"update"'
PV_PREFIX = UPDATE_PREFIX + b',"pv":"'
STAMP = re.compile(rb'"seconds":(\d+),"nanos":(\d+)\}')


def _frame(payload: bytes, opcode: int) -> bytes:
    """A client frame; the masking key is zero (allowed: XOR with it leaves the payload)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


def _hist_add(hist: list[int], lat_s: float) -> None:
    us = max(lat_s * 1e6, 1.0)
    hist[min(HIST_BINS - 1, int(math.log10(us) * 100.0))] += 1


class Socket:
    """One WebSocket: frames out, and an iterator of (opcode, payload) in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()

    @classmethod
    async def connect(cls, host: str, port: int, path: str, protocol: str = "") -> Socket:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
        key = base64.b64encode(os.urandom(16)).decode()
        extra = f"Sec-WebSocket-Protocol: {protocol}\r\n" if protocol else ""
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"{extra}\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            writer.close()
            raise RuntimeError(f"upgrade refused: {head[:200]!r}")
        return cls(reader, writer)

    def send(self, payload: bytes, opcode: int = 2) -> None:
        self.writer.write(_frame(payload, opcode))

    async def messages(self) -> Any:
        """Yield lists of (opcode, payload) per read; answers pings; ends at close or EOF."""
        buf = self.buf
        while True:
            data = await self.reader.read(1 << 20)
            if not data:
                return
            buf += data
            i, n = 0, len(buf)
            out = []
            while n - i >= 2:
                ln = buf[i + 1] & 0x7F
                h = 2
                if ln == 126:
                    if n - i < 4:
                        break
                    ln = int.from_bytes(buf[i + 2 : i + 4], "big")
                    h = 4
                elif ln == 127:
                    if n - i < 10:
                        break
                    ln = int.from_bytes(buf[i + 2 : i + 10], "big")
                    h = 10
                if n - i < h + ln:
                    break
                op = buf[i] & 0x0F
                payload = bytes(buf[i + h : i + h + ln])
                i += h + ln
                if op == 9:
                    self.send(payload, 10)
                elif op == 8:
                    if out:
                        yield out
                    return
                elif op in (1, 2):
                    out.append((op, payload))
            del buf[:i]
            if out:
                yield out

    def close(self) -> None:
        try:
            self.send(b"\x03\xe8", 8)
            self.writer.close()
        except Exception:
            pass


async def graphql_subscribe(host: str, port: int, ids: list[str]) -> str:
    """The stream token for `ids`, as a page gets it (one HTTP request)."""
    body = json.dumps({"query": SUBSCRIBE, "variables": {"ids": ids}}).encode()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"POST /graphql HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    raw = await reader.read(-1)
    writer.close()
    doc = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    if doc.get("errors"):
        raise RuntimeError(f"GraphQL errors: {doc['errors']}")
    return str(doc["data"]["subscribe"]["token"])


class Screen:
    """One screen's connection and counters."""

    def __init__(self, endpoint: str, ids: list[str]) -> None:
        self.endpoint = endpoint
        self.ids = ids
        self.received = 0
        self.frames = 0
        self.seq_gaps = 0
        self.other = 0
        self.seq = 0
        self.open_s = math.nan
        self.error = ""
        self.sock: Socket | None = None
        self.task: asyncio.Task[None] | None = None
        self.opened = asyncio.Event()


class Process:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.host = spec["host"]
        self.port = spec["port"]
        self.rng = random.Random(spec["seed"])
        self.ids: list[str] = spec["ids"]
        self.window = [0.0, 0.0]
        self.hist = [0] * HIST_BINS
        self.lat_max = 0.0
        self.screens: list[Screen] = []
        self.closed: list[Screen] = []
        self.churn_opens: list[float] = []  # open times (s) of screens opened in the window
        self.initial_opens: list[float] = []
        self.recording: set[asyncio.Future[None]] = set()  # waits for replacements' first values

    def counting(self, now: float) -> bool:
        return self.window[0] <= now <= self.window[1] if self.window[1] else False

    def subset(self) -> list[str]:
        return self.rng.sample(self.ids, self.spec["per_client"])

    def latency(self, now: float, stamp: float) -> None:
        lat = now - stamp
        if lat > self.lat_max:
            self.lat_max = lat
        _hist_add(self.hist, lat)

    async def run_stream(self, sc: Screen, t_start: float) -> None:
        token = await graphql_subscribe(self.host, self.port, sc.ids)
        sock = sc.sock = await Socket.connect(self.host, self.port, "/stream", "pvwire.v1")
        sock.send(msgpack.packb([16, 1, token]))
        k = 0
        async for batch in sock.messages():
            now = time.time()
            counting = self.counting(now)
            for _op, p in batch:
                if p[0] >> 4 != 9:
                    continue
                kind = p[1]
                if kind == 3:
                    off = _seq_end(p)
                    seq = msgpack.unpackb(p[2:off])
                    if seq != sc.seq + 1:
                        sc.seq_gaps += 1
                    sc.seq = seq
                    if not counting:
                        continue
                    sc.frames += 1
                    k += 1
                    if k % SAMPLE:
                        sc.received += _count_entries(p, off)
                        continue
                    groups = msgpack.unpackb(p[off:], raw=False)
                    for _att, entries in groups:
                        sc.received += len(entries)
                        for e in entries:
                            if e[1] & 2:
                                self.latency(now, e[4] + e[5] * 1e-9)
                elif kind == 2:  # SNAPSHOT: the screen is open
                    sc.seq = msgpack.unpackb(p, raw=False)[1]
                    sc.open_s = now - t_start
                    sc.opened.set()
                elif kind == 5:
                    raise RuntimeError(f"server error: {msgpack.unpackb(p)}")
                else:
                    sc.other += 1

    async def run_pvws(self, sc: Screen, t_start: float) -> None:
        sock = sc.sock = await Socket.connect(self.host, self.port, "/pvws/pv")
        # cs-web-lib sends one subscribe per PV.
        for name in sc.ids:
            sock.send(json.dumps({"type": "subscribe", "pvs": [name]}).encode(), 1)
        # The PV of an update is read from its bytes, not parsed: while 100 screens open at
        # once, the others' updates come at ~200,000 a second to this one process.
        waiting = {json.dumps(name).encode()[1:-1] for name in sc.ids}
        async for batch in sock.messages():
            now = time.time()
            counting = self.counting(now)
            for _op, p in batch:
                if not p.startswith(PV_PREFIX):
                    sc.other += 1
                    continue
                if waiting:
                    waiting.discard(p[len(PV_PREFIX) : p.index(b'"', len(PV_PREFIX))])
                    if not waiting:
                        sc.open_s = now - t_start
                        sc.opened.set()
                elif counting:
                    sc.received += 1
            if not waiting:
                break  # open: counted from the bytes from now on (`count_pvws`)
        await self.count_pvws(sc, sock)

    async def count_pvws(self, sc: Screen, sock: Socket) -> None:
        """An open pvws screen's updates, counted in the bytes as they come: a message per PV
        update is ~1,000,000 a second at 500 screens, more than a frame parser in Python keeps
        up with on the cores the server needs. The JSON is ASCII, so a byte 0x89 (a ping's
        first) or 0x88 (a close's) is never in it."""
        tail = bytes(sock.buf)
        k = 0
        while True:
            data = await sock.reader.read(1 << 20)
            if not data:
                return
            now = time.time()
            chunk = tail + data
            if b"\x88" in data:
                return
            ping = data.find(b"\x89")
            if ping >= 0 and ping + 2 <= len(data) and data[ping + 1] < 126:
                sock.send(data[ping + 2 : ping + 2 + data[ping + 1]], 10)
            if self.counting(now):
                sc.received += chunk.count(UPDATE_PREFIX) - tail.count(UPDATE_PREFIX)
                k += 1
                if k % SAMPLE == 0:
                    stamps = STAMP.findall(data[-400:])
                    if stamps:
                        seconds, nanos = stamps[-1]
                        self.latency(now, int(seconds) + int(nanos) * 1e-9)
            tail = data[-(len(UPDATE_PREFIX) - 1) :]

    async def screen(self, sc: Screen) -> None:
        t_start = time.time()
        try:
            if sc.endpoint == "stream":
                await self.run_stream(sc, t_start)
            else:
                await self.run_pvws(sc, t_start)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # reported in the results, never hidden
            sc.error = f"{type(exc).__name__}: {exc}"
        finally:
            sc.opened.set()
            if sc.sock is not None:
                sc.sock.close()

    def open(self, endpoint: str) -> Screen:
        sc = Screen(endpoint, self.subset())
        sc.task = asyncio.ensure_future(self.screen(sc))
        self.screens.append(sc)
        return sc

    async def start(self) -> None:
        gate = asyncio.Semaphore(self.spec.get("opening_at_once", OPENING_AT_ONCE))

        async def one(endpoint: str) -> None:
            async with gate:
                sc = self.open(endpoint)
                await sc.opened.wait()

        await asyncio.gather(*(one(e) for e in self.spec["endpoints"]))
        self.initial_opens = [s.open_s for s in self.screens if not math.isnan(s.open_s)]

    async def churn(self) -> None:
        """Replace one screen every 1/rate s during the window (same endpoint), steadily."""
        rate = self.spec["churn_per_s"]
        t0, t1 = self.window
        await asyncio.sleep(max(0.0, t0 - time.time()))
        if rate <= 0:
            return
        k = 0
        while True:
            at = t0 + (k + self.rng.random()) / rate
            if at >= t1:
                return
            k += 1
            await asyncio.sleep(max(0.0, at - time.time()))
            old = self.screens.pop(self.rng.randrange(len(self.screens)))
            if old.task is not None:
                old.task.cancel()
            self.closed.append(old)
            sc = self.open(old.endpoint)
            self.recording.add(asyncio.ensure_future(self._record_open(sc)))

    async def _record_open(self, sc: Screen) -> None:
        await sc.opened.wait()
        if not math.isnan(sc.open_s):
            self.churn_opens.append(sc.open_s)

    def result(self) -> dict[str, Any]:
        every = self.screens + self.closed
        by: dict[str, dict[str, int]] = {}
        for sc in every:
            d = by.setdefault(sc.endpoint, {"received": 0, "frames": 0, "seq_gaps": 0})
            d["received"] += sc.received
            d["frames"] += sc.frames
            d["seq_gaps"] += sc.seq_gaps
        nz = [[i, c] for i, c in enumerate(self.hist) if c]
        return {
            "by_endpoint": by,
            "received": sum(sc.received for sc in every),
            "seq_gaps": sum(sc.seq_gaps for sc in every),
            "other": sum(sc.other for sc in every),
            "hist": nz,
            "lat_max_us": self.lat_max * 1e6,
            "churn_opens_s": self.churn_opens,
            "initial_opens_s": self.initial_opens,
            "screens_opened": len(every),
            "errors": [sc.error for sc in every if sc.error],
        }


def _seq_end(p: bytes) -> int:
    """Offset of `groups` in a DATA frame `[3, seq, groups]` (after the variable-size seq)."""
    b = p[2]
    if b < 0x80:
        return 3
    return {0xCC: 4, 0xCD: 5, 0xCE: 7, 0xCF: 11}[b]


def _count_entries(p: bytes, off: int) -> int:
    """Entries of a DATA frame's groups, from array headers (one group: no decoding at all)."""
    if p[off] == 0x91 and p[off + 1] == 0x92:
        i = off + 2
        b = p[i]
        i += 1 if b < 0x80 else {0xCC: 2, 0xCD: 3, 0xCE: 5}[b]
        h = p[i]
        if 0x90 <= h <= 0x9F:
            return h & 0x0F
        if h == 0xDC:
            return int.from_bytes(p[i + 1 : i + 3], "big")
        if h == 0xDD:
            return int.from_bytes(p[i + 1 : i + 5], "big")
    return sum(len(entries) for _att, entries in msgpack.unpackb(p[off:], raw=False))


async def main_async(spec: dict[str, Any]) -> None:
    proc = Process(spec)
    deadline = spec["deadline"]
    await asyncio.wait_for(proc.start(), max(1.0, deadline - time.time()))
    loop = asyncio.get_running_loop()
    go = asyncio.Event()

    def read_go() -> None:
        line = sys.stdin.readline().split()
        if len(line) == 3 and line[0] == "GO":
            proc.window[0], proc.window[1] = float(line[1]), float(line[2])
        loop.call_soon_threadsafe(go.set)

    threading.Thread(target=read_go, daemon=True).start()
    print("READY", flush=True)
    await asyncio.wait_for(go.wait(), max(1.0, deadline - time.time()))
    churn = asyncio.ensure_future(proc.churn())
    await asyncio.sleep(max(0.0, min(proc.window[1], deadline) - time.time()) + 0.3)
    churn.cancel()
    for sc in proc.screens:
        if sc.task is not None:
            sc.task.cancel()
    await asyncio.sleep(0.1)
    with open(spec["out"], "w") as f:
        json.dump(proc.result(), f)


def main() -> None:
    run_child(main_async)


if __name__ == "__main__":
    main()
