"""The real server's endpoints fed garbage over real sockets: 2,000 random and mutated frames on
`/stream`, and random and adversarial GraphQL requests on `/graphql`. Nothing crashes, every bad
request gets a clear answer (an ERROR message, a documented close code, a GraphQL error; never a
500), the server still serves a good client afterwards, and its RSS and open file descriptors
stay bounded. The bulk of the stream fuzzing runs in memory (tests/test_fuzz_session.py); this
part proves the socket pump around the session holds too, in a few seconds.

The server is private to this module (own port), so its RSS is this module's doing alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pvwire_client import closecodes
from pvwire_dev.ioc import IocProcess

from tests.eventually import eventually_async
from tests.fuzz_frames import HOSTILE, mutate
from tests.server_process import ServerProcess, server_args_for_tests

SOCKET_FRAMES = 2000
QUERY_EXAMPLES = 300
GOOD_QUERY = "{ server { version } }"


@pytest.fixture(scope="module")
def fuzz_server(epics_env: IocProcess) -> Iterator[ServerProcess]:
    with ServerProcess(*server_args_for_tests()) as proc:
        yield proc


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def subscribe(server: ServerProcess, ids: list[str]) -> str:
    doc = server.graphql(
        "mutation($ids: [String!]!) { subscribe(ids: $ids) { token } }", {"ids": ids}
    )
    assert "errors" not in doc, doc
    token: str = doc["data"]["subscribe"]["token"]
    return token


# --- the stream ----------------------------------------------------------------------------


class FuzzConnection:
    """One WebSocket; a reader task keeps reading so the server never sees a stalled client."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.received: list[Any] = []
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str) -> FuzzConnection:
        ws = await websockets.connect(
            url, subprotocols=[websockets.Subprotocol("pvwire.v1")], compression=None,
            max_size=None, open_timeout=10,
        )  # fmt: skip
        return cls(ws)

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                self.received.append(msgpack.unpackb(data, raw=False, strict_map_key=False))
        except websockets.ConnectionClosed:
            pass

    async def close_code(self) -> int | None:
        """The code of the close frame the server sent; None if it sent none."""
        await self.ws.wait_closed()
        rcvd = self.ws.protocol.close_rcvd
        return None if rcvd is None else int(rcvd.code)

    def answers(self) -> int:
        """Messages that answer a client message: ATTACHED, DETACHED, ERROR, PONG."""
        return sum(1 for m in self.received if m[0] in (1, 4, 5, 7))

    async def wait_for(self, predicate: Any, timeout: float = 10.0) -> Any:
        async def answer() -> Any:
            found = next((m for m in self.received if predicate(m)), None)
            if found is None and self.reader.done():
                raise AssertionError(f"closed ({await self.close_code()}) before the answer came")
            return found

        return await eventually_async(answer, "the answer", timeout=timeout, interval=0.01)

    async def close(self) -> None:
        await self.ws.close()
        await self.reader


async def test_stream_survives_random_and_mutated_frames(
    fuzz_server: ServerProcess, record_property: Any
) -> None:
    pid = fuzz_server.pid
    assert pid is not None
    token = subscribe(fuzz_server, ["sim://counter?rate=20", "sim://waveform?length=100"])
    corpus = [
        msgpack.packb([16, 1, token]),
        msgpack.packb([17, 2, 1]),
        msgpack.packb([18, 3]),
        msgpack.packb([18, {"n": [1, b"x", 2.5]}]),
        msgpack.packb([16, 4, token[: len(token) // 2]]),
        *HOSTILE,
    ]
    rng = random.Random(20261122)
    frames = [mutate(rng, corpus) for _ in range(SOCKET_FRAMES)]
    frames[SOCKET_FRAMES // 2] = b"\x91" + b"\x00" * (2 << 20)  # over max_in_bytes (1 MiB)
    closes: dict[int, int] = {}
    sent = answers = 0
    conn = await FuzzConnection.open(fuzz_server.ws_url)
    baseline: tuple[float, int] | None = None
    for i, frame in enumerate(frames):
        if i == 200:  # after the first connections, allocator warm-up
            baseline = rss_mb(pid), open_fds(pid)
        # Lockstep: every client message gets exactly one answer (ATTACHED, DETACHED, ERROR or
        # PONG) or a close, so each frame is known to have been handled before the next is sent.
        # Sending on regardless would leave unread bytes in the server's socket when it closes,
        # and the kernel's RST could then overtake the close frame.
        answered = conn.answers()
        # The oversized frame: the server closes while it is still being sent.
        with contextlib.suppress(websockets.ConnectionClosed):
            await conn.ws.send(frame)
        sent += 1
        async with asyncio.timeout(10):
            while conn.answers() == answered and not conn.reader.done():
                await asyncio.sleep(0.0005)
        if conn.reader.done():
            conn.reader.result()  # the reader itself must not have failed
            code = await conn.close_code()
            if code is None and len(frame) > 1 << 20:
                # The server closed with 1009 while most of the frame was unread, so its kernel
                # answered with a reset that can overtake the close frame.
                code = 1006
            assert code is not None, (
                f"the server dropped the connection without a close frame after {frame[:80]!r}"
            )
            assert code in closecodes.CODES or 4000 <= code < 5000, code
            closes[code] = closes.get(code, 0) + 1
            answers += len(conn.received)
            conn = await FuzzConnection.open(fuzz_server.ws_url)
    # No stuck session: a ping and a good ATTACH on the fuzzed connection still answer, unless
    # its last frame made the server close it (then on a fresh one).
    await conn.ws.send(msgpack.packb([18, "still there?"]))
    try:
        await conn.wait_for(lambda m: m[0] == 7 and m[1] == "still there?")
    except AssertionError:
        conn = await FuzzConnection.open(fuzz_server.ws_url)
    await conn.ws.send(msgpack.packb([16, 777, token]))
    attached = await conn.wait_for(lambda m: m[0] == 1 and m[1] == 777)
    await conn.wait_for(lambda m: m[0] == 2 and m[2] == attached[2])  # its SNAPSHOT
    await conn.wait_for(lambda m: m[0] == 3)  # and live DATA after it
    answers += len(conn.received)
    await conn.close()
    assert baseline is not None
    await wait_settled(pid, baseline[1])
    rss_end, fds_end = rss_mb(pid), open_fds(pid)
    record_property("fuzz_socket_frames_sent", sent)
    record_property("fuzz_socket_rss_mb", f"{baseline[0]:.1f} -> {rss_end:.1f}")
    record_property("fuzz_socket_fds", f"{baseline[1]} -> {fds_end}")
    print(
        f"socket fuzz: {sent} of {SOCKET_FRAMES} frames sent, {answers} messages back, server "
        f"closes {closes}; server RSS "
        f"{baseline[0]:.1f} -> {rss_end:.1f} MB, fds {baseline[1]} -> {fds_end}"
    )
    assert closes.get(1009, 0) + closes.get(1006, 0) == 1  # the oversized frame, and only it
    assert rss_end - baseline[0] < 50, (baseline, rss_end)
    assert fds_end <= baseline[1] + 5, (baseline, fds_end)


async def wait_settled(pid: int, fds: int, timeout: float = 10.0) -> None:
    """Closed connections' sockets are released soon, not at once: wait for the count."""
    await eventually_async(
        lambda: open_fds(pid) <= fds + 5, "closed sockets released", timeout=timeout
    )


# --- GraphQL -------------------------------------------------------------------------------


def post(server: ServerProcess, body: bytes, content_type: str = "application/json") -> Any:
    r = httpx.post(
        f"{server.url}/graphql", content=body, headers={"content-type": content_type}, timeout=60
    )
    return r


def assert_clear(r: httpx.Response, what: str) -> None:
    """A bad request's answer: not a 500, and a message saying what is wrong."""
    assert r.status_code < 500, (what, r.status_code, r.text[:300])
    if r.status_code == 200:
        doc = r.json()
        assert doc.get("errors"), (what, r.text[:300])
        assert all(e.get("message") for e in doc["errors"]), (what, doc["errors"][:3])
    else:
        assert r.text.strip(), (what, r.status_code)


def still_answers(server: ServerProcess) -> None:
    doc = server.graphql(GOOD_QUERY)
    assert doc["data"]["server"]["version"], doc


def nested(depth: int) -> str:
    return "{ server " + "{ clients " * depth + "{ address }" + " }" * depth + " }"


ADVERSARIAL: dict[str, bytes | tuple[bytes, str]] = {
    "deep nesting": json.dumps({"query": nested(2000)}).encode(),
    "deeper than the parser": json.dumps({"query": "{" * 50_000 + "}" * 50_000}).encode(),
    "5,000 aliases": json.dumps(
        {"query": "{" + " ".join(f"a{i}: server {{ version }}" for i in range(5000)) + "}"}
    ).encode(),
    "huge id list": json.dumps(
        {
            "query": "query($i: [String!]!) { channels(ids: $i) { id } }",
            "variables": {"i": [f"sim://value/x{i}" for i in range(200_000)]},
        }
    ).encode(),
    "huge string": json.dumps(
        {"query": '{ channel(id: "' + "x" * (8 << 20) + '") { id } }'}
    ).encode(),
    "wrong variable type": json.dumps(
        {"query": "query($i: String!) { channel(id: $i) { id } }", "variables": {"i": [1, 2]}}
    ).encode(),
    "wrong argument type": json.dumps({"query": "{ channel(id: 12) { id } }"}).encode(),
    "unknown field": json.dumps({"query": "{ nosuch }"}).encode(),
    "query not a string": json.dumps({"query": 42}).encode(),
    "variables not an object": json.dumps({"query": GOOD_QUERY, "variables": [1]}).encode(),
    "body not an object": b"[1, 2, 3]",
    "body not JSON": b"{ server { version } }",
    "invalid UTF-8": b'{"query": "{ server { version \xff\xfe } }"}',
    "invalid UTF-8 in a string": b'{"query": "{ channel(id: \\"\xc3\\") { id } }"}',
    "empty body": b"",
    "NUL bytes": json.dumps({"query": "{ server\u0000 { version } }"}).encode(),
    "wrong content type": (b"query=%7Bserver%7D", "application/x-www-form-urlencoded"),
    "subscribe to 100,000 ids": json.dumps(
        {
            "query": "mutation($i: [String!]!) { subscribe(ids: $i) { token } }",
            "variables": {"i": [f"sim://counter/c{i}" for i in range(100_000)]},
        }
    ).encode(),
    "NaN option": b'{"query": "mutation { subscribe(ids: [\\"sim://ramp\\"], '
    b'options: {maxRate: NaN}) { token } }"}',
    "fragment cycle": json.dumps(
        {"query": "{ ...A } fragment A on Query { ...B } fragment B on Query { ...A }"}
    ).encode(),
    "many operations, none named": json.dumps(
        {"query": " ".join(["{ server { version } }"] * 2000)}
    ).encode(),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_graphql_gets_a_clear_error(
    fuzz_server: ServerProcess, name: str, record_property: Any
) -> None:
    item = ADVERSARIAL[name]
    body, ctype = item if isinstance(item, tuple) else (item, "application/json")
    r = post(fuzz_server, body, ctype)
    assert_clear(r, name)
    record_property("answer", f"{r.status_code} {r.text[:160]}")
    still_answers(fuzz_server)


WORDS = [
    "{", "}", "(", ")", ":", "!", "$", "...", "@", "[", "]", ",", "=", "query", "mutation",
    "subscription", "fragment", "on", "server", "version", "clients", "channel", "channels",
    "search", "put", "subscribe", "id", "ids", "value", "metadata", "units", "token", "__schema",
    "__typename", "types", "name", '"sim://ramp"', '"ca://PVW:AO"', "42", "-1", "1e309", "null",
    "true", '"\\u0000"', '"""block"""', "#c\n", "a1", "$v", "String", "Int", "[String!]!",
]  # fmt: skip

random_queries = st.one_of(
    st.lists(st.sampled_from(WORDS), max_size=60).map(" ".join),
    st.text(max_size=200),
)


def test_random_graphql_queries_never_500(fuzz_server: ServerProcess, record_property: Any) -> None:
    tried = {"queries": 0, "errors": 0}
    client = httpx.Client(base_url=fuzz_server.url, timeout=60)

    @settings(
        max_examples=QUERY_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        query=random_queries,
        variables=st.none()
        | st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
    )
    def run(query: str, variables: dict[str, Any] | None) -> None:
        r = client.post("/graphql", json={"query": query, "variables": variables})
        tried["queries"] += 1
        assert r.status_code < 500, (query, r.status_code, r.text[:300])
        if r.status_code != 200 or "errors" in r.json():
            tried["errors"] += 1
            assert_clear(r, query)

    try:
        run()
    finally:
        client.close()
    still_answers(fuzz_server)
    record_property("fuzz_graphql_queries", tried["queries"])
    print(
        f"graphql fuzz: {tried['queries']} random queries, {tried['errors']} answered with errors, "
        f"+{len(ADVERSARIAL)} adversarial requests"
    )
    assert tried["queries"] >= QUERY_EXAMPLES
