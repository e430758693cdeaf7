"""The stream protocol's session fed 100,000 random and mutated client frames, in memory.

`Session` is I/O-free, so the bulk runs against the real session and hub code with the in-memory
backend double (tests/hub_doubles.py), at a few microseconds a frame. Each hypothesis example
draws a seed and a few structured messages; a seeded mutator derives the rest of its frames from
a corpus of valid messages (bit flips, truncation, insertion, splicing, msgpack headers that
claim huge or deep contents). Ticks with fresh upstream values run in between, so views are
live while the garbage arrives. After each example: nothing raised, a session still open answers
a good ATTACH with ATTACHED + SNAPSHOT, a session the server chose to close says why with a
documented code, and closing it releases every view. The socket-level fuzzer is
tests/test_fuzz_endpoints.py.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pvwire.core.hub import Hub

from .fuzz_frames import HOSTILE, mutate
from .hub_doubles import Client, FakeBackend

EXAMPLES = 200
MUTATED_PER_EXAMPLE = 500  # + up to 8 structured frames: ~100,000 frames in all
# Close codes a session may choose for a client's misbehaviour (PROTOCOL.md section 8).
CLOSE_CODES = {4008, 4401, 4402, 4403}
IDS = ["fake://a", "fake://b"]
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)  # fmt: skip


@st.composite
def structured(draw: st.DrawFn, token: str) -> bytes:
    """A message shaped like a client message, with wrong parts where hypothesis likes."""
    kind = draw(
        st.sampled_from([16, 17, 18, 0, 1, 19, 255, -1, 2**40]) | st.integers(-(2**63), 2**64 - 1)
    )
    parts: list[Any] = [kind]
    parts.append(draw(st.integers(0, 2**64 - 1) | msgpack_values))
    parts.append(draw(st.sampled_from([token, token[:-3], token + "x", ""]) | msgpack_values))
    parts += draw(st.lists(msgpack_values, max_size=2))
    return bytes(msgpack.packb(parts))


def drain(c: Client) -> list[Any]:
    """Everything the session queued, read by the client. Plain msgpack: a PONG echoes the
    client's nonce, which may hold any ext type (PROTOCOL.md section 1)."""
    out = []
    while (frame := c.session.next_frame()) is not None:
        c.session.sent(len(frame))
        out.append(msgpack.unpackb(frame, raw=False, strict_map_key=False))
    return out


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_session_survives_100k_random_and_mutated_frames(
    hub: Hub, backend: FakeBackend, record_property: Any
) -> None:
    token = hub.signer.issue(IDS).token
    corpus = [
        msgpack.packb([16, 1, token]),
        msgpack.packb([16, 2**64 - 1, token]),
        msgpack.packb([17, 3, 1]),
        msgpack.packb([17, 4, 2]),
        msgpack.packb([18, 7]),
        msgpack.packb([18, {"nonce": [1, 2.5, b"x"]}]),
        msgpack.packb([16, 5, token, "extra", 1]),
        b"\x93\x11\x01\x01",
    ]
    tried = {"frames": 0, "closed": 0, "errors": 0, "attached": 0}
    sessions: list[Client] = []

    def good_attach(c: Client) -> None:
        c.send(16, 424242, token)
        msgs = drain(c)
        kinds = [m[0] for m in msgs if m[0] in (1, 2)]
        assert kinds == [1, 2], msgs  # ATTACHED, then its SNAPSHOT
        attached = next(m for m in msgs if m[0] == 1)
        assert attached[1] == 424242 and attached[3] == IDS

    def connect() -> Client:
        c = Client(hub)
        sessions.append(c)
        drain(c)  # HELLO
        return c

    @FUZZ_SETTINGS
    @given(seed=st.integers(0, 2**32 - 1), first=st.lists(structured(token), max_size=8))
    def run(seed: int, first: list[bytes]) -> None:
        rng = random.Random(seed)
        frames = first + [mutate(rng, corpus) for _ in range(MUTATED_PER_EXAMPLE)]
        c = connect()
        for i, frame in enumerate(frames):
            c.session.receive(frame)  # must never raise
            tried["frames"] += 1
            if i % 16 == 0 and "a" in backend.sinks:  # "a" is open while a view holds it
                backend.update("a", float(i))
                hub.ticker.tick()
            tried["errors"] += sum(1 for m in drain(c) if m[0] == 5)
            if c.session.close_request:
                # The server closes this connection, saying why; the client connects again.
                tried["closed"] += 1
                code, reason = c.session.close_request
                assert code in CLOSE_CODES and reason, c.session.close_request
                c = connect()
        good_attach(c)
        tried["attached"] += 1
        hub.ticker.tick()
        drain(c)
        for s in sessions:
            hub.remove_session(s.session)
        sessions.clear()
        assert not hub.registry.views, "a closed session left a view behind"

    before = rss_kb()
    run()
    grown_mb = (rss_kb() - before) / 1024
    await asyncio.sleep(0.05)  # channels linger 0 s: let the release timers run
    assert not hub.registry.channels, list(hub.registry.channels)
    assert not hub.sessions
    record_property("fuzz_session_frames", tried["frames"])
    record_property("fuzz_session_rss_growth_mb", round(grown_mb, 1))
    print(
        f"session fuzz: {tried['frames']} frames in {EXAMPLES} examples; {tried['errors']} "
        f"ERROR answers, {tried['closed']} sessions closed by the server, {tried['attached']} "
        f"good ATTACHes after garbage; RSS +{grown_mb:.1f} MB"
    )
    assert tried["frames"] >= EXAMPLES * MUTATED_PER_EXAMPLE
    # The test process also holds hypothesis' own data; a leak of the per-frame state would show
    # as hundreds of MB here.
    assert grown_mb < 100, grown_mb


@pytest.mark.parametrize("frame", HOSTILE)
async def test_hostile_headers_alone_get_an_error(hub: Hub, frame: bytes) -> None:
    c = Client(hub)
    drain(c)
    c.session.receive(frame)
    msgs = drain(c)
    assert [m[0] for m in msgs] == [5] and msgs[0][2] == 4400, msgs
    assert c.session.close_request is None
