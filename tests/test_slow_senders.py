"""Time and descriptors are resources (DESIGN.md section 7e): hundreds of real slow senders
against the real server, each closed by the deadline meant for it, while a bystander is served;
readers that stop reading their answers, dropped by the write deadline; and a process whose
descriptors are nearly all taken still answers its probes.

What a deadline closes is told by its answer, not by timing: a 408 naming the limit, a close
4000 naming it; the waits are generous bounds (the machine is shared), and "not before the
deadline" is the one figure checked, which load can only make larger.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import msgpack
import pytest
import websockets
from pvwire.limits import integer, number
from pvwire_dev.ioc import IocProcess

from tests.attacks import (
    MIB,
    Bystander,
    SlowSender,
    answer_request,
    metric,
    rss_bytes,
    slow_readers,
    slow_senders,
)
from tests.eventually import eventually, eventually_async
from tests.server_process import ServerProcess, server_args_for_tests, stream_token

HEADERS_S = number("http_header_timeout_s")
BODY_S = number("http_body_timeout_s")
FIRST_MESSAGE_S = number("stream_first_message_s")
LINGER_S = number("http_answered_linger_s")
# An event loop's timer may fire this early (uvloop's clock counts milliseconds).
TIMER_SLACK_S = 0.01
PER_KIND = 75  # 300 slow sockets, from four addresses, each within its address's bound
ADDRESSES = [f"127.0.0.{n}" for n in range(41, 45)]
NOFILE = 512  # the small server's descriptor limit
# What it takes: half of it, as the reserve of descriptors is larger than the other half.
CAPACITY = max(NOFILE // 2, NOFILE - integer("reserved_descriptors"))
PROBE_ROOM = integer("probe_connections")
WRITE_S = number("http_write_timeout_s")
# Answers of ~20 MB (a million float64 in JSON): past what the kernel's socket buffers take of
# one (4 MiB here, tcp_wmem), so most of each waits in the server while nobody reads it.
ELEMENTS = 1_000_000
READERS = 4
UNREAD = answer_request(f"sim://waveform/unread?length={ELEMENTS}&rate=1")
# What a server's heap moves by meanwhile (the bystander, the test's requests).
RSS_SLACK = 16 * MIB


@pytest.fixture(scope="module")
def target(epics_env: IocProcess) -> Iterator[ServerProcess]:
    env = {"PVWIRE_MAX_GRAPHQL_ELEMENTS": str(ELEMENTS)}
    with ServerProcess(*server_args_for_tests(), env=env) as proc:
        yield proc


def by_kind(senders: list[SlowSender], kind: str) -> list[SlowSender]:
    return [s for s in senders if s.kind == kind]


def closed_by(senders: list[SlowSender], status: int, limit: bytes, seconds: float) -> None:
    """Every sender closed, answered `status` naming `limit`, not before `seconds`."""
    wrong = [s for s in senders if s.seconds is None or s.status != status or limit not in s.answer]
    assert not wrong, f"{len(wrong)} of {len(senders)}: {wrong[0].answer[:300]!r}, {wrong[0]}"
    early = min(s.seconds or 0.0 for s in senders)
    assert early >= seconds - TIMER_SLACK_S, f"one closed after {early:.3f} s, before {seconds:g} s"


async def test_slow_headers_bodies_and_handshakes_are_each_closed_by_their_deadline(
    target: ServerProcess,
) -> None:
    bystander = Bystander(target)
    bystander.start()
    try:
        before = metric(target, "pvwire_request_timeouts_total")
        closes = metric(target, "pvwire_disconnects_total").get('{code="4000"}', 0.0)
        start = bystander.mark()
        kinds = dict.fromkeys(("headers", "body", "upgrade", "silent"), PER_KIND)
        senders = await slow_senders(target, kinds, ADDRESSES)
        end = bystander.mark()
        # Served meanwhile and after: the bystander's frames, and a request of its own.
        bystander.check(start, end)
        assert target.graphql("{ server { version } }")["data"]["server"]["version"]
    finally:
        bystander.stop()
    closed_by(by_kind(senders, "headers"), 408, b"http_header_timeout_s", HEADERS_S)
    closed_by(by_kind(senders, "upgrade"), 408, b"http_header_timeout_s", HEADERS_S)
    closed_by(by_kind(senders, "body"), 408, b"http_body_min_rate", BODY_S)
    silent = by_kind(senders, "silent")
    frames = [s.close_frame() for s in silent]
    wrong = [
        f for f in frames if f is None or f[0] != 4000 or b"stream_first_message_s" not in f[1]
    ]
    assert all(s.status == 101 for s in silent) and not wrong, wrong[:3]
    assert min(s.seconds or 0.0 for s in silent) >= FIRST_MESSAGE_S - TIMER_SLACK_S
    after = metric(target, "pvwire_request_timeouts_total")
    timed_out = {k: after[k] - before.get(k, 0.0) for k in after}
    assert timed_out['{phase="headers"}'] >= 2 * PER_KIND, timed_out
    assert timed_out['{phase="body"}'] >= PER_KIND, timed_out
    assert metric(target, "pvwire_disconnects_total")['{code="4000"}'] - closes >= PER_KIND
    # Every slow connection is gone from the table once closed.
    await eventually_async(
        lambda: asyncio.to_thread(lambda: metric(target, "pvwire_connections")[""] <= 2),
        lambda: f"connections left: {metric(target, 'pvwire_connections')}",
    )


def _keep_sending_after_the_answer(port: int) -> tuple[bytes, float]:
    """A connection that sends nothing until it is answered (408), then sends on and never
    closes: the answer, and the seconds from it until the server has closed its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(4096)
            assert data, f"closed before its answer: {answer!r}"
            answer += data
        answered = time.monotonic()
        try:
            while time.monotonic() - answered < 60:
                sock.sendall(b"x")  # read and dropped while the server lingers, then refused
                time.sleep(0.05)
        except OSError:
            return answer, time.monotonic() - answered
    raise AssertionError("the server never closed a connection it had answered")


def test_an_answered_connection_is_read_for_a_while_then_closed(target: ServerProcess) -> None:
    """Answered, the connection's sending side is shut at once and what the client still sends
    is read and dropped (it would reset the answer away otherwise), for http_answered_linger_s
    at most: a client that never closes holds it no longer."""
    answer, seconds = _keep_sending_after_the_answer(target.port)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert seconds >= LINGER_S - TIMER_SLACK_S, seconds


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def _answered_at_accept(port: int) -> bytes:
    """What the server says to a connection that sends nothing (b"" if it says nothing soon)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.settimeout(2.0)
        try:
            return sock.recv(4096)
        except TimeoutError:
            return b""


async def _holder(url: str, address: str, token: str) -> websockets.ClientConnection:
    """A /stream client from `address`, attached (so no deadline of its own ends it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.setblocking(False)
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    ws = await websockets.connect(url, sock=sock, compression=None, max_size=None)
    await asyncio.wait_for(ws.recv(), 30)  # HELLO
    await ws.send(msgpack.packb([16, 1, token]))  # ATTACH
    return ws


async def test_a_full_process_refuses_clients_and_still_answers_its_probes(
    epics_env: IocProcess,
) -> None:
    with ServerProcess(*server_args_for_tests(), nofile=NOFILE) as server:
        token = stream_token(server, ["sim://value/full"])
        bystander = Bystander(server)
        bystander.start()
        holders: list[websockets.ClientConnection] = []
        try:
            start = bystander.mark()
            # Clients from several addresses, each within its own bound, until the process
            # has all it takes: the next is refused with 503 (not 429: no address is full).
            refused = None
            for i in range(NOFILE):
                address = ADDRESSES[i % len(ADDRESSES)]
                try:
                    holders.append(await _holder(server.ws_url, address, token))
                except websockets.InvalidStatus as exc:
                    refused = exc.response
                    break
            assert refused is not None and refused.status_code == 503, refused
            assert b"max_connections" in refused.body
            # The bystander and the holders are what it holds (and, for a moment, a connection
            # of the test's just closed, which the server may not have seen close yet).
            assert CAPACITY - 5 <= len(holders) + 1 <= CAPACITY, len(holders)
            status, text = await asyncio.to_thread(_get, server.url + "/readyz")
            assert status == 200 and '"ready":true' in text, (status, text)
            status, text = await asyncio.to_thread(_get, server.url + "/metrics")
            assert status == 503 and "max_connections" in text, (status, text)

            # Past the probes' room too, a connection is answered 503 as it opens, before it
            # sends a byte. The room is held by connections that send nothing, which their
            # header deadline ends: tried until one attempt is quick enough to fill it.
            def answered_at_once() -> bytes:
                silent = [socket.create_connection(("127.0.0.1", server.port), timeout=30)
                          for _ in range(PROBE_ROOM)]  # fmt: skip
                try:
                    return _answered_at_accept(server.port)
                finally:
                    for s in silent:
                        s.close()

            await asyncio.to_thread(
                eventually, lambda: answered_at_once().startswith(b"HTTP/1.1 503"),
                "a 503 at accept past the probes' room", timeout=60,
            )  # fmt: skip
            end = bystander.mark()
            bystander.check(start, end)
        finally:
            for ws in holders:
                await ws.close()
            bystander.stop()
        # Once clients leave, the process serves again, and counted what it refused.
        await eventually_async(
            lambda: asyncio.to_thread(lambda: _get(server.url + "/metrics")[0] == 200),
            "the server answering /metrics again",
        )
        refused_total = metric(server, "pvwire_connections_refused_total")
        assert refused_total['{reason="capacity"}'] >= 3, refused_total


def _read_to_the_end(sock: socket.socket) -> int:
    """Bytes the client gets once it reads again, until the server's close."""
    sock.settimeout(30)
    got = 0
    while data := sock.recv(1 << 20):
        got += len(data)
    return got


def test_readers_that_stop_reading_are_dropped_by_the_write_deadline(
    target: ServerProcess,
) -> None:
    """Clients that ask for a ~20 MB GraphQL answer and never read it: the server holds what
    its socket does not take while the answer makes progress, and drops the connection once it
    has made none for http_write_timeout_s (counted, `phase="response"`); its memory returns,
    and a bystander is served meanwhile. Without the deadline each answer was held for as long
    as its client kept the connection open."""
    pid = target.pid
    assert pid is not None
    with socket.create_connection(("127.0.0.1", target.port), timeout=60) as sock:
        sock.sendall(UNREAD)
        sock.shutdown(socket.SHUT_WR)
        whole = _read_to_the_end(sock)  # the channel is monitored now: the answers come at once
    assert whole > RSS_SLACK, whole
    bystander = Bystander(target)
    bystander.start()
    readers: list[socket.socket] = []
    try:
        timeouts = metric(target, "pvwire_request_timeouts_total").get('{phase="response"}', 0.0)
        base = rss_bytes(pid)
        start = bystander.mark()
        asked = time.monotonic()
        readers = slow_readers(target, "127.0.0.1", READERS, UNREAD, 1)
        # Held: at least half of what was asked for waits in the server.
        eventually(lambda: rss_bytes(pid) - base >= READERS * whole // 2,
                   lambda: f"the answers held: {(rss_bytes(pid) - base) / MIB:.0f} MiB",
                   timeout=60)  # fmt: skip
        # Meanwhile another client's request is answered.
        assert target.graphql("{ server { version } }")["data"]["server"]["version"]

        def dropped() -> bool:
            now = metric(target, "pvwire_request_timeouts_total")['{phase="response"}']
            return now - timeouts >= READERS

        eventually(dropped, "the unread answers dropped", timeout=WRITE_S + 60)
        seconds = time.monotonic() - asked
        end = bystander.mark()
        assert seconds >= WRITE_S - TIMER_SLACK_S, f"dropped after {seconds:.2f} s"
        eventually(lambda: rss_bytes(pid) - base <= RSS_SLACK,
                   lambda: f"RSS still {(rss_bytes(pid) - base) / MIB:.0f} MiB up",
                   timeout=60)  # fmt: skip
        # Reading again, each client gets what its kernel held, then the close: not the answer.
        got = [_read_to_the_end(s) for s in readers]
        assert all(0 < n < whole // 2 for n in got), (got, whole)
        bystander.check(start, end)
    finally:
        bystander.stop()
        for s in readers:
            s.close()
