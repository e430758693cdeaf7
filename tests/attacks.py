"""What one anonymous address can make the server spend, tried as an attacker would: the attacks
of tests/test_attacks.py (at a size that proves each bound) and bench/attacks.py (at full size).

Each attack runs against a real server (tests/server_process.py) while a `Watch` samples the
server process's resident memory (/proc/PID/status) and its own event-loop lag metric
(`pvwire_event_loop_lag_seconds` in /metrics), and a `Bystander` on another connection reads a
50 Hz counter, so what the attack costs everyone else is seen from outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import jwt
import msgpack
import websockets
from p4p.nt import NTScalar
from p4p.server.thread import SharedPV
from pvwire_client import Client, PvwireError, wire

from tests.eventually import eventually, eventually_async
from tests.hostile_pva import (
    HostilePva,
    Name,
    Search,
    doubling_type,
    message_flood,
    unsolicited_types,
)
from tests.p4p_server import Accepting, p4p_server
from tests.pvws_client import PvwsClient
from tests.server_process import ServerProcess, stream_token
from tests.stream_client import RawStream

__all__ = [
    "MIB",
    "Bystander",
    "Cost",
    "PvaPeers",
    "PvaSizes",
    "Sockets",
    "Watch",
    "answer_request",
    "backfill_attack",
    "body_attack",
    "bound_socket",
    "cpu_seconds",
    "forged_sockets",
    "hoard_channels",
    "in_64",
    "metric",
    "mjpeg_viewers",
    "peer_refusals",
    "pva_peers",
    "pva_put",
    "pva_server_args",
    "pvget_flood",
    "pvws_subscribe",
    "pvws_write_burst",
    "reconnect_storm",
    "rotating_refusals",
    "rotating_source",
    "rss_bytes",
    "search_hijack",
    "slow_readers",
    "slow_senders",
    "stream_token",
]

MIB = 1 << 20  # the attacks' sizes are in MiB, here and where they are run
ATTACH = 16  # the client's ATTACH message type (PROTOCOL.md section 2)
# A bystander with no frame during an attack this long was starved by it: far above what a
# busy machine's scheduling delays a 50 Hz frame by.
STARVED_S = 5.0


# --- what the server spends -------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """The process's resident memory now (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_SAMPLE = re.compile(r"^(\w+)(\{[^}]*\})? (\S+)$")


def metric(server: ServerProcess, name: str) -> dict[str, float]:
    """The samples of series `name` (labels as written -> value) from the server's /metrics."""
    out: dict[str, float] = {}
    for line in server.metrics().splitlines():
        m = _SAMPLE.match(line)
        if m and m[1] == name:
            out[m[2] or ""] = float(m[3])
    return out


@dataclass
class Cost:
    """What the server spent while a `Watch` looked: memory and event-loop lag at their worst."""

    rss_start: int = 0
    rss_peak: int = 0
    lag_start: float = 0.0  # s, the metric's value (worst of its last 10 s) when the watch began
    lag_peak: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    started: float = 0.0  # monotonic s

    @property
    def rss_growth(self) -> int:
        return max(0, self.rss_peak - self.rss_start)

    def as_dict(self) -> dict[str, float]:
        return {
            "rss_start_mb": round(self.rss_start / MIB, 1),
            "rss_growth_mb": round(self.rss_growth / MIB, 1),
            "loop_lag_peak_s": round(self.lag_peak, 3),
            "server_cpu_s": round(self.cpu_s, 2),
            "wall_s": round(self.wall_s, 2),
        }


class Watch:
    """Samples the server's RSS (every 20 ms) and its loop-lag metric (every second: the metric
    is the worst of its last 10 s, and each scrape costs the server a walk over its clients) in
    threads of their own, from `with` to its end; `cost` holds the peaks."""

    def __init__(self, server: ServerProcess) -> None:
        assert server.pid is not None, "the server is not running"
        self.server = server
        self.pid = server.pid
        self.cost = Cost()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0
        self._cpu0 = 0.0

    def _lag(self) -> float:
        try:
            return metric(self.server, "pvwire_event_loop_lag_seconds").get("", 0.0)
        except OSError:  # no answer for 30 s (urllib's timeout): a loop lagging that long
            return float("inf")

    def __enter__(self) -> Watch:
        self.cost.rss_start = self.cost.rss_peak = rss_bytes(self.pid)
        self.cost.lag_start = self._lag()
        self._t0, self._cpu0 = time.monotonic(), cpu_seconds(self.pid)
        self.cost.started = self._t0
        self._threads = [
            threading.Thread(target=self._sample_rss, daemon=True),
            threading.Thread(target=self._sample_lag, daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def _sample_rss(self) -> None:
        while not self._stop.wait(0.02):
            self.cost.rss_peak = max(self.cost.rss_peak, rss_bytes(self.pid))

    def _sample_lag(self) -> None:
        while not self._stop.wait(1.0):
            self.cost.lag_peak = max(self.cost.lag_peak, self._lag())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        # The lag of what ran last shows at the next housekeeping pass (once a second).
        self.cost.lag_peak = max(self.cost.lag_peak, self._lag())
        self.cost.rss_peak = max(self.cost.rss_peak, rss_bytes(self.pid))
        self.cost.cpu_s = cpu_seconds(self.pid) - self._cpu0
        self.cost.wall_s = time.monotonic() - self._t0


# --- the bystander ----------------------------------------------------------------------------


@dataclass
class Bystander:
    """Another client of the same server, on a thread and event loop of its own: it reads a
    50 Hz counter over `/stream` and records when each frame came and its sequence number."""

    server: ServerProcess
    channel: str = "sim://counter/bystander?rate=50"
    frames: list[tuple[float, int]] = field(default_factory=list)  # (monotonic s, seq)
    error: BaseException | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        token = stream_token(self.server, [self.channel])
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(token)), daemon=True)
        self._thread.start()
        eventually(lambda: len(self.frames) >= 5 or self.error, "the bystander's first frames")
        assert self.error is None, self.error

    async def _run(self, token: str) -> None:
        try:
            s = await RawStream.connect(self.server.ws_url)
            try:
                _, snapshot = await s.attach(token)
                self.frames.append((time.monotonic(), snapshot.seq))
                while not self._stop.is_set():
                    try:
                        msg = await s.recv(timeout=0.5)
                    except TimeoutError:
                        continue  # only to look at `_stop`; a gap shows in `frames`
                    if isinstance(msg, wire.Data):
                        self.frames.append((time.monotonic(), msg.seq))
            finally:
                await s.close()
        except BaseException as exc:
            self.error = exc

    def mark(self) -> float:
        return time.monotonic()

    def received_since(self, t: float) -> int:
        return sum(1 for at, _ in self.frames if at > t)

    def check(self, start: float, end: float, after: int = 5) -> dict[str, float]:
        """That frames came while the attack ran (from `start` to `end`) and after it (waits
        for `after` of them), with no sequence number missing; the gaps, for the record."""
        eventually(
            lambda: self.received_since(end) >= after or self.error,
            lambda: f"the bystander's frames after the attack ({self.received_since(end)})",
            timeout=60,
        )
        assert self.error is None, f"the bystander failed: {self.error!r}"
        # An attack refused at once (a body answered 413 in 10 ms) is over before the next
        # 50 Hz frame: frames must have come during one only if it lasted long enough.
        during = [at for at, _ in self.frames if start < at <= end]
        assert during or end - start < STARVED_S, (
            f"the bystander got no frame in the {end - start:.1f} s the attack ran"
        )
        seqs = [seq for _, seq in self.frames]
        missing = [(a, b) for a, b in itertools.pairwise(seqs) if b != a + 1]
        assert not missing, f"the bystander's frames skipped sequence numbers: {missing[:5]}"
        times = [at for at, _ in self.frames if start <= at]
        return gap_stats(times)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


def gap_stats(times: Sequence[float]) -> dict[str, float]:
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    if not gaps:
        return {"frames": len(times), "gap_p99_s": 0.0, "gap_max_s": 0.0}
    p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))]
    return {"frames": len(times), "gap_p99_s": round(p99, 3), "gap_max_s": round(gaps[-1], 3)}


# --- (a) a big HTTP body ----------------------------------------------------------------------


def body_attack(server: ServerProcess, size: int, chunked: bool, path: str = "/graphql") -> int:
    """POST `size` bytes to `path`, declared by Content-Length or sent chunked, sending no more
    once the server answers; returns the status it answered with (0: none, the connection cut)."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()
    piece = b" " * MIB  # JSON whitespace: nothing is wrong with it but its size
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.sendall(head)
        reply = b""
        sent = 0
        out = memoryview(chunk)
        while sent < size:
            readable, writable, _ = select.select([sock], [sock], [], 120)
            if readable:
                break  # it answered: an attacker stops too, nothing more can come of it
            if not writable:
                raise AssertionError("the server neither read nor answered for 120 s")
            try:
                n = sock.send(out)
            except OSError:
                break  # it closed: read what it said
            out = out[n:]
            if not out:
                out = memoryview(chunk)
                sent += len(piece)
        else:
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        try:
            while b"\r\n" not in reply:
                data = sock.recv(65536)
                if not data:
                    break
                reply += data
        except OSError:
            pass
    m = re.match(rb"HTTP/1\.[01] (\d{3})", reply)
    return int(m[1]) if m else 0


# --- (b) backfill, read by nobody ------------------------------------------------------------


async def _quiet_socket(url: str) -> Any:
    """A WebSocket whose TCP receive window is small, so that what the server sends it stays
    in the server's memory rather than in the kernel's buffers of the two ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.setblocking(False)
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    return await websockets.connect(
        url,
        sock=sock,
        subprotocols=[websockets.Subprotocol("pvwire.v1")],
        compression=None,
        max_size=None,
        max_queue=1,
    )


async def record_history(server: ServerProcess, ids: Sequence[str], rows: int) -> RawStream:
    """A reader attached to `ids` (which keeps them monitored, so recorded) once each has at
    least `rows` updates recorded (sim counters count their own updates)."""
    reader = await RawStream.connect(server.ws_url)
    await reader.attach(stream_token(server, ids))
    probe = [ids[0], ids[-1]]

    async def recorded() -> bool:
        doc = await asyncio.to_thread(
            server.graphql, "query($ids: [String!]!) { channels(ids: $ids) { value } }",
            {"ids": probe},
        )  # fmt: skip
        values = [c["value"] for c in doc.get("data", {}).get("channels", [])]
        return len(values) == 2 and all(isinstance(v, int | float) and v >= rows for v in values)

    async def drain() -> None:
        while True:
            await reader.recv(timeout=120)

    draining = asyncio.ensure_future(drain())
    try:
        await eventually_async(recorded, f"{rows} updates recorded of {probe}", timeout=60)
    finally:
        draining.cancel()
        await asyncio.gather(draining, return_exceptions=True)
    return reader


async def read_backfill(server: ServerProcess, token: str) -> tuple[dict[int, int], wire.Snapshot]:
    """A client that reads all it asked for: ATTACH with backfill, then every HISTORY message
    up to the SNAPSHOT; returns the rows of every-update resolution received per sid."""
    s = await RawStream.connect(server.ws_url)
    try:
        await s.send(ATTACH, 1, token)
        rows: dict[int, int] = {}
        while True:
            msg = await s.recv(timeout=60)
            if isinstance(msg, wire.History):
                if msg.resolution == 0:
                    rows[msg.sid] = rows.get(msg.sid, 0) + len(msg.t)
            elif isinstance(msg, wire.Snapshot):
                await s.next_data(timeout=60)  # and the stream goes on after it
                return rows, msg
            elif isinstance(msg, wire.Error):
                raise AssertionError(f"the reader's ATTACH was refused: {msg}")
    finally:
        await s.close()


async def backfill_attack(server: ServerProcess, token: str, sockets: int) -> list[Any]:
    """`sockets` connections, each ATTACHing `token` (with backfill) and reading nothing after
    HELLO; returned open, for the caller to close."""
    opened = []
    for _ in range(sockets):
        ws = await _quiet_socket(server.ws_url)
        await asyncio.wait_for(ws.recv(), 30)  # HELLO
        await ws.send(msgpack.packb([ATTACH, 1, token]))
        opened.append(ws)
    return opened


def attachments_of(server: ServerProcess) -> list[dict[str, Any]]:
    """The server's stream clients (admin `server` query: allowed from this machine)."""
    doc = server.graphql("{ server { clients { id attachments queuedBytes endpoint } } }")
    clients: list[dict[str, Any]] = doc["data"]["server"]["clients"]
    return clients


# --- (c) pvws: many names in one subscribe ----------------------------------------------------


async def pvws_subscribe(
    server: ServerProcess, names: Sequence[str], expect_all: bool, timeout: float = 120
) -> tuple[set[str], list[str]]:
    """One pvws `subscribe` naming `names`; reads until every name has an update (`expect_all`)
    or an `error` came; returns the names updated and the errors."""
    client = await PvwsClient.connect(server.url)
    updated: set[str] = set()
    errors: list[str] = []
    try:
        await client.subscribe(*names)
        async with asyncio.timeout(timeout):
            while (len(updated) < len(names)) if expect_all else not errors:
                msg = await client.recv(timeout)
                if msg.get("type") == "update":
                    updated.add(msg["pv"])
                elif msg.get("type") == "error":
                    errors.append(str(msg.get("message")))
                    if expect_all:
                        break
    finally:
        await client.close()
    return updated, errors


# --- (d) MJPEG viewers ------------------------------------------------------------------------


@dataclass
class MjpegViewer:
    frames: int = 0
    status: int = 0
    task: asyncio.Task[None] | None = None


async def _view_mjpeg(port: int, path: str, viewer: MjpegViewer) -> None:
    """Counts the frames of one multipart response: each JPEG ends where a boundary follows
    (a part may or may not say its Content-Length)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        viewer.status = int(head.split()[1])
        if viewer.status != 200:
            return
        found = re.search(rb"boundary=(\S+)", head)
        end = b"\r\n--" + (found[1] if found else b"BOUNDARY")
        tail = b""
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            seen = tail + data
            viewer.frames += seen.count(end)
            tail = seen[-(len(end) - 1) :]
    finally:
        writer.close()


async def mjpeg_viewers(server: ServerProcess, channel: str, fps: Sequence[float]) -> list[Any]:
    """One viewer of `channel` per `fps` value, each reading every frame it gets."""
    viewers = []
    for f in fps:
        v = MjpegViewer()
        path = f"/mjpeg/{quote(channel, safe='')}?fps={f:g}"
        v.task = asyncio.ensure_future(_view_mjpeg(server.port, path, v))
        viewers.append(v)
    return viewers


# --- (e) a burst of pvws writes ---------------------------------------------------------------


async def pvws_write_burst(server: ServerProcess, pv: str, writes: int) -> list[str]:
    """`writes` pvws `write` messages to `pv` (values 1..writes) sent at once by a client that
    subscribed it; returns the errors it was sent until its socket went quiet."""
    client = await PvwsClient.connect(server.url)
    errors: list[str] = []
    try:
        await client.subscribe(pv)
        await client.next("update", pv)
        text = [json.dumps({"type": "write", "pv": pv, "value": i}) for i in range(1, writes + 1)]
        for t in text:
            await client.ws.send(t)
        await client.send(type="echo", body="done")  # answered after every write was read
        while True:
            msg = await client.recv(120)
            if msg.get("type") == "error":
                errors.append(str(msg.get("message")))
            elif msg.get("type") == "echo":
                break
    finally:
        await client.close()
    return errors


# --- (f) a reconnect storm --------------------------------------------------------------------


async def _connect(url: str) -> Any:
    ws = await websockets.connect(
        url, subprotocols=[websockets.Subprotocol("pvwire.v1")], compression=None, max_size=None
    )
    await ws.recv()  # HELLO
    return ws


async def _attach(ws: Any, token: str, count: int, req: int) -> None:
    """`count` ATTACHes of `token` on `ws`, until each one's SNAPSHOT came."""
    for i in range(count):
        await ws.send(msgpack.packb([ATTACH, req + i, token]))
    attached = 0
    while attached < count:
        msg = wire.decode_message(await asyncio.wait_for(ws.recv(), 120))
        if isinstance(msg, wire.Snapshot):
            attached += 1
        elif isinstance(msg, wire.Error):
            raise AssertionError(f"ATTACH refused: {msg}")


async def _attach_interleaved(
    url: str, token: str, connections: int, attachments: int
) -> list[Any]:
    """`connections` clients attaching `token` `attachments` times each, in rounds of
    `STORM_ROUND` per client, so the view's attachments of one client lie all over its list
    (as clients that came over time have them), not side by side."""
    clients = await asyncio.gather(*(_connect(url) for _ in range(connections)))
    for req in range(1, attachments + 1, STORM_ROUND):
        n = min(STORM_ROUND, attachments + 1 - req)
        await asyncio.gather(*(_attach(ws, token, n, req) for ws in clients))
    return clients


STORM_ROUND = 10


async def reconnect_storm(
    server: ServerProcess, token: str, connections: int, attachments: int
) -> tuple[float, float]:
    """`connections` clients each ATTACH `token` `attachments` times; all drop at once and all
    come back at once. Returns the server's CPU seconds for the drop and for the return."""
    assert server.pid is not None
    url = server.ws_url
    clients = await _attach_interleaved(url, token, connections, attachments)
    base = _clients(server)
    cpu0 = cpu_seconds(server.pid)
    await asyncio.gather(*(ws.close() for ws in clients))
    await eventually_async(
        lambda: asyncio.to_thread(lambda: _clients(server) <= base - connections),
        "every dropped client gone", timeout=120, interval=0.5,
    )  # fmt: skip
    cpu1 = cpu_seconds(server.pid)
    clients = await asyncio.gather(*(_connect(url) for _ in range(connections)))
    await asyncio.gather(*(_attach(ws, token, attachments, 1) for ws in clients))
    cpu2 = cpu_seconds(server.pid)
    await asyncio.gather(*(ws.close() for ws in clients))
    return cpu1 - cpu0, cpu2 - cpu1


def _clients(server: ServerProcess) -> int:
    return int(metric(server, "pvwire_clients").get("", 0))


# --- (g) a forged X-Forwarded-For through a real proxy --------------------------------------


@dataclass
class Sockets:
    """What `forged_sockets` opened: the admitted (open; the caller closes them) and, for those
    refused, the HTTP status answered to the upgrade and its text."""

    admitted: list[Any] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)

    async def close(self) -> None:
        await asyncio.gather(*(ws.close() for ws in self.admitted), return_exceptions=True)


async def forged_sockets(
    url: str,
    context: ssl.SSLContext | None,
    sockets: int,
    source: str,
    at_once: int = 20,
    forwarded: Callable[[int], str] = lambda i: rotating_source(i, 198, 51),
) -> Sockets:
    """`sockets` WebSockets to `url` (`wss://` through a proxy) from `source`, the `i`-th with
    `X-Forwarded-For: forwarded(i)` (as if each were another client), `at_once` being opened at
    a time; each waits for HELLO (admitted) or an HTTP refusal of its upgrade (refused)."""
    out = Sockets()
    gate = asyncio.Semaphore(at_once)

    async def one(i: int) -> None:
        async with gate:
            try:
                ws = await websockets.connect(
                    url, ssl=context, local_addr=(source, 0), compression=None,
                    additional_headers={"X-Forwarded-For": forwarded(i)},
                    subprotocols=[websockets.Subprotocol("pvwire.v1")],
                )  # fmt: skip
            except websockets.InvalidStatus as exc:
                response = exc.response
                out.refused.append((response.status_code, response.body.decode(errors="replace")))
                return
            await asyncio.wait_for(ws.recv(), 60)  # HELLO
            out.admitted.append(ws)

    await asyncio.gather(*(one(i) for i in range(sockets)))
    return out


def in_64(i: int, net: str = "2001:db8:a77a:1") -> str:
    """The `i`-th address of the /64 `net::/64` (documentation space, never a source address
    here): a client with a /64 may use any of its 2^64 addresses, a new one for each socket."""
    return f"{net}:{i >> 48 & 0xFFFF:x}:{i >> 32 & 0xFFFF:x}:{i >> 16 & 0xFFFF:x}:{i & 0xFFFF:x}"


# --- (h) refusals from rotating source addresses --------------------------------------------


def rotating_source(i: int, net: int = 127, first: int = 100) -> str:
    """The `i`-th address from `net`.`first`.0.0 on. The whole of 127.0.0.0/8 is loopback: a
    client binds a socket to each in turn, a new source address for every request."""
    return f"{net}.{first + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"


async def rotating_refusals(port: int, requests: int, at_once: int = 32) -> dict[int, int]:
    """`requests` GraphQL requests with a bad bearer token, each on a new connection from an
    address of its own (`rotating_source`); the statuses answered, counted."""
    statuses: dict[int, int] = {}
    gate = asyncio.Semaphore(at_once)
    request = (
        f"POST /graphql HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer forged\r\n"
        "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    ).encode()

    async def one(i: int) -> None:
        async with gate:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(rotating_source(i), 0)
            )
            try:
                writer.write(request)
                line = await asyncio.wait_for(reader.readline(), 60)
                status = int(line.split()[1]) if line.startswith(b"HTTP/") else 0
                statuses[status] = statuses.get(status, 0) + 1
            finally:
                writer.close()
                await writer.wait_closed()

    await asyncio.gather(*(one(i) for i in range(requests)))
    return statuses


# --- (i) a hostile PVA server -----------------------------------------------------------------

PVA_USER = "olga"
PVA_SECRET = "attacks-on-the-pva-client-share-this-secret-0123"
PVA_RULES = """
default = "READ"
[[rule]]
channels = ["pva://LEGIT:*", "pva://HOSTILE:*"]
users = ["olga"]
access = "WRITE"
"""
# pvxs's SEARCHes carry this sequence number ("find"): any other is pvwire's own search.
PVXS_SEARCH_SEQ = 0x66696E64
LEGIT_NAMES = ("LEGIT:X", *(f"LEGIT:B{i}" for i in range(20)))


@dataclass(frozen=True, slots=True)
class PvaSizes:
    doubling_levels: int  # the type's cached levels: ~20 bytes and twice the nodes each
    unsolicited: int  # PUT INIT replies nobody asked for, each a type of its own
    unsolicited_members: int  # strings in each (~6 bytes on the wire, ~230 in memory, each)
    messages: int  # MESSAGEs
    message_bytes: int  # each
    fresh_names: int  # legitimate puts to names not searched yet, while answers are forged


@dataclass
class PvaPeers:
    """A legitimate p4p server (LEGIT:* names, every put recorded) and a hostile one
    (HOSTILE:* names) on loopback, and the EPICS_PVA_* that search those two alone."""

    legit: Accepting
    hostile: HostilePva
    env: dict[str, str]

    def our_searches(self, name: str) -> list[Search]:
        """The searches for `name` the hostile server heard from pvwire's own client."""
        return [s for s in self.hostile.searches
                if name in s.names and s.seq != PVXS_SEARCH_SEQ]  # fmt: skip


@contextlib.contextmanager
def pva_peers(sizes: PvaSizes) -> Iterator[PvaPeers]:
    handler = Accepting()
    pvs = {n: SharedPV(nt=NTScalar("d"), initial=0.0, handler=handler) for n in LEGIT_NAMES}
    names = {
        "HOSTILE:DOUBLE": Name(put_type=doubling_type(sizes.doubling_levels)),
        "HOSTILE:UNSOLICITED": Name(before_init=lambda ioid: unsolicited_types(
            sizes.unsolicited, sizes.unsolicited_members)),
        "HOSTILE:MESSAGES": Name(before_init=lambda ioid: message_flood(
            sizes.messages, sizes.message_bytes, ioid)),
    }  # fmt: skip
    with p4p_server("legit", pvs) as legit_env, HostilePva(names) as hostile:
        env = {
            "EPICS_PVA_ADDR_LIST": f"{legit_env['EPICS_PVA_ADDR_LIST']} {hostile.address_list}",
            "EPICS_PVA_AUTO_ADDR_LIST": "NO",
            "EPICS_PVA_BROADCAST_PORT": legit_env["EPICS_PVA_BROADCAST_PORT"],
        }
        yield PvaPeers(handler, hostile, env)


def pva_server_args(folder: Path) -> list[str]:
    """A server that puts as the user over PVA (--forward-identity), olga allowed to write
    LEGIT:* and HOSTILE:*, logging at INFO (what a server's MESSAGEs cost shows there)."""
    (folder / "secret").write_text(PVA_SECRET)
    (folder / "rules.toml").write_text(PVA_RULES)
    return [
        "--forward-identity", "--jwt-secret-file", str(folder / "secret"),
        "--access-rules", str(folder / "rules.toml"), "--log-level", "info",
    ]  # fmt: skip


def pva_token(user: str = PVA_USER) -> str:
    now = int(time.time())
    claims = {"sub": user, "preferred_username": user, "iat": now, "exp": now + 4 * 3600}
    return jwt.encode(claims, PVA_SECRET, "HS256")


async def pva_put(server: ServerProcess, name: str, value: float, timeout: float = 30) -> str:
    """A GraphQL put as olga, waiting for completion: "ok", or the error's class and words."""
    async with Client(server.url, token=pva_token()) as c:
        try:
            await c.put(f"pva://{name}", value, wait=True, timeout=timeout)
        except PvwireError as exc:
            return f"{type(exc).__name__}: {exc}"
    return "ok"


def peer_refusals(server: ServerProcess) -> dict[str, float]:
    """pvwire_peer_refusals_total of scheme pva, by reason."""
    out = {}
    for labels, n in metric(server, "pvwire_peer_refusals_total").items():
        m = re.search(r'scheme="pva",reason="(\w+)"', labels)
        if m:
            out[m[1]] = n
    return out


async def search_hijack(server: ServerProcess, peers: PvaPeers, names: Sequence[str]) -> list[str]:
    """After one legitimate put (LEGIT:X: its search shows the hostile server pvwire's search
    socket), the hostile server forges answers to that socket from an address nobody searched
    (the cids a counter from 1 would give next, and a copy of every search it hears), while
    olga puts to `names`, each served by the legitimate server and searched for the first time.
    Returns the puts' results."""
    assert await pva_put(server, "LEGIT:X", 1.0) == "ok"
    (seen, *_) = peers.our_searches("LEGIT:X")
    target = (seen.source[0], seen.reply_port)
    peers.hostile.start_forging(target, range(1, 200), seqs=(0, *range(1, 30)))
    try:
        return [await pva_put(server, name, float(i)) for i, name in enumerate(names)]
    finally:
        peers.hostile.stop_forging()


# --- (j) slow senders -------------------------------------------------------------------------

# What each kind of slow sender trickles (a byte every `interval`), after a head sent at once:
# request headers that never end, a body far longer than what comes, a WebSocket upgrade request
# cut in bytes; and a WebSocket whose upgrade is whole but which never says anything after HELLO.
_UPGRADE = (
    b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
SLOW_KINDS: dict[str, tuple[bytes, bytes]] = {
    "headers": (b"", b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4096),
    "body": (
        b"POST /graphql HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n",
        b" " * 4096,
    ),
    "upgrade": (b"", _UPGRADE),
    "silent": (_UPGRADE, b""),
}


@dataclass
class SlowSender:
    """One slow connection and what the server did with it."""

    kind: str
    address: str  # the local address it connected from (all of 127/8 is loopback)
    answer: bytes = b""  # everything the server sent
    seconds: float | None = None  # from connecting to the server's close (None: not closed)

    @property
    def status(self) -> int:
        """The HTTP status the server answered with (0: none)."""
        m = re.match(rb"HTTP/1\.1 (\d{3})", self.answer)
        return int(m[1]) if m else 0

    def close_frame(self) -> tuple[int, bytes] | None:
        """The WebSocket close frame after a 101 answer: (code, reason), or None."""
        _, found, data = self.answer.partition(b"\r\n\r\n")
        while found and len(data) >= 2:
            opcode, size, at = data[0] & 0x0F, data[1] & 0x7F, 2
            if size == 126:
                size, at = int.from_bytes(data[2:4]), 4
            elif size == 127:
                size, at = int.from_bytes(data[2:10]), 10
            payload, data = data[at : at + size], data[at + size :]
            if opcode == 8 and len(payload) >= 2:
                return int.from_bytes(payload[:2]), payload[2:]
        return None


class _Recorder(asyncio.Protocol):
    """Keeps every byte as it comes: a stream reader would raise a reset before the data that
    came just before it (a byte sent as the server closed)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()


async def _slow_one(port: int, s: SlowSender, interval: float, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    head, trickle = SLOW_KINDS[s.kind]
    recorder = _Recorder()
    started = loop.time()
    transport, _ = await loop.create_connection(
        lambda: recorder, "127.0.0.1", port, local_addr=(s.address, 0)
    )
    try:
        if head:
            transport.write(head)
        sent = 0
        while not recorder.closed.is_set() and loop.time() - started < timeout:
            # Once answered it stops, as an attacker would: nothing more can come of it.
            if not recorder.data and sent < len(trickle):
                transport.write(trickle[sent : sent + 1])
                sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(recorder.closed.wait(), interval)
            s.answer = bytes(recorder.data)
            if s.kind == "silent" and s.close_frame() is not None:
                break  # closed by the server's WebSocket close; the TCP close follows ours
        if recorder.closed.is_set() or (s.kind == "silent" and s.close_frame() is not None):
            s.seconds = loop.time() - started
    finally:
        s.answer = bytes(recorder.data)
        transport.close()


async def slow_senders(
    server: ServerProcess,
    kinds: dict[str, int],
    addresses: Sequence[str],
    interval: float = 1.0,
    timeout: float = 120.0,
) -> list[SlowSender]:
    """`kinds[k]` connections of each kind of SLOW_KINDS, the kinds interleaved, from
    `addresses` in turn, all at once, each trickling a byte every `interval` until the server
    answers or closes it (or `timeout`)."""
    order = sorted((i, k) for k, n in kinds.items() for i in range(n))
    senders = [SlowSender(kind, addresses[i % len(addresses)]) for i, (_, kind) in enumerate(order)]
    await asyncio.gather(*(_slow_one(server.port, s, interval, timeout) for s in senders))
    return senders


# --- (n) readers that stop reading ------------------------------------------------------------


def answer_request(channel: str) -> bytes:
    """A GraphQL request for `channel`'s value: the largest answer an anonymous client may ask
    for when the channel is an array of `max_graphql_elements` elements."""
    body = json.dumps({"query": f'{{ channel(id: "{channel}") {{ value }} }}'}).encode()
    return (b"POST /graphql HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s") % (len(body), body)  # fmt: skip


def slow_readers(
    server: ServerProcess, address: str, connections: int, request: bytes, pipelined: int
) -> list[socket.socket]:
    """`connections` connections from `address`, each sending `request` `pipelined` times at
    once (HTTP/1.1 pipelining: each answer waits for the one before it) and reading nothing,
    with a receive buffer of a few KiB so that its kernel takes next to nothing either. The
    caller closes them."""
    readers = []
    try:
        for _ in range(connections):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            readers.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.bind((address, 0))
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(request * pipelined)
    except BaseException:
        for sock in readers:
            sock.close()
        raise
    return readers


# --- (k) channel hoarding ---------------------------------------------------------------------


async def bound_socket(url: str, address: str) -> socket.socket:
    """A TCP connection to `url`'s host and port from the local address `address` (all of 127/8
    is loopback: each is another client address to the server)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.setblocking(False)
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    return sock


@dataclass
class Hoard:
    """What one address got of the channels it asked for, by endpoint."""

    attached: int = 0  # channels of the stream's ATTACHED answers
    stream_errors: list[str] = field(default_factory=list)
    pvws_updated: int = 0
    pvws_errors: list[str] = field(default_factory=list)
    get_errors: list[str] = field(default_factory=list)  # GraphQL `channels`' errorCodes


async def hoard_channels(
    server: ServerProcess,
    address: str,
    names: Sequence[str],
    per_token: int,
    extra: Sequence[str],
    hold: Callable[[Hoard], Awaitable[None]] | None = None,
) -> Hoard:
    """From `address`: one `/stream` connection ATTACHing `names` in tokens of `per_token`
    channels each, then, with those held, a `/pvws/pv` subscribe and a GraphQL `channels` get
    of `extra` names. `hold(hoard)` runs while everything is held; then all is closed."""
    hoard = Hoard()
    chunks = [names[i : i + per_token] for i in range(0, len(names), per_token)]
    tokens = [await asyncio.to_thread(stream_token, server, chunk) for chunk in chunks]
    stream = await RawStream.connect(server.ws_url, sock=await bound_socket(server.url, address))
    pvws = await PvwsClient.connect(server.url, sock=await bound_socket(server.url, address))
    try:
        for req, token in enumerate(tokens, 1):
            await stream.send(ATTACH, req, token)
        answered = 0
        while answered < len(tokens):
            msg = await stream.recv(120)
            if isinstance(msg, wire.Attached):
                hoard.attached += len(msg.ids)
                answered += 1
            elif isinstance(msg, wire.Error):
                hoard.stream_errors.append(msg.message)
                answered += 1
        if extra:
            await _hoard_more(server, address, pvws, extra, hoard)
        if hold is not None:
            await hold(hoard)
    finally:
        await stream.close()
        await pvws.close()
    return hoard


async def _hoard_more(
    server: ServerProcess, address: str, pvws: PvwsClient, extra: Sequence[str], hoard: Hoard
) -> None:
    """`extra` asked for through pvws (each name answered with an update or an error), then as
    a GraphQL get, from `address`."""
    await pvws.subscribe(*extra)
    async with asyncio.timeout(120):
        while hoard.pvws_updated + len(hoard.pvws_errors) < len(extra):
            m = await pvws.recv(120)
            if m.get("type") == "update":
                hoard.pvws_updated += 1
            elif m.get("type") == "error":
                hoard.pvws_errors.append(str(m.get("message")))
    query = "query($ids: [String!]!) { channels(ids: $ids, timeout: 1) { errorCode } }"
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(transport=transport, timeout=120) as client:
        r = await client.post(
            f"{server.url}/graphql", json={"query": query, "variables": {"ids": list(extra)}}
        )
    hoard.get_errors = [str(c["errorCode"]) for c in r.json()["data"]["channels"]]


# --- (l) a pvget flood ------------------------------------------------------------------------


async def pvget_flood(
    server: ServerProcess, address: str, count: int, connections: int, names: Sequence[str]
) -> tuple[dict[str, int], float]:
    """`count` pvgets of `names` (in turn) from `address` over `connections` connections at
    once; the answers' codes counted (`ok` for 200), and the seconds it took."""
    transport = httpx.AsyncHTTPTransport(
        local_address=address, limits=httpx.Limits(max_connections=connections)
    )
    codes: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=server.url, transport=transport, timeout=120) as client:
        room = asyncio.Semaphore(connections)

        async def one(name: str) -> None:
            async with room:
                r = await client.get("/pvws/pvget", params={"name": name})
            code = "ok" if r.status_code == 200 else str(r.json().get("code"))
            codes[code] = codes.get(code, 0) + 1

        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.gather(*(one(names[i % len(names)]) for i in range(count)))
        return codes, loop.time() - started
