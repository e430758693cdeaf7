"""The Python client's session core fed random and mutated server messages, in memory.

`pvwire_client.session.Session` is I/O-free, as the server's is (tests/test_fuzz_session.py):
each hypothesis example draws a seed; a seeded mutator (tests/fuzz_frames.py) derives frames from
the server-to-client golden vectors and a valid exchange. The session is driven as the client's
pump drives it: a close it asks for is carried out and the connection opened again. After each
example: nothing raised, every close asked for has a documented code, and the subscription (when
it did not end) is attached again and applies a snapshot on a fresh connection.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pvwire_client import closecodes
from pvwire_client.session import Entries, Event, Failed, Session

from .fuzz_frames import mutate

VECTORS = Path(__file__).resolve().parents[1] / "protocol" / "vectors"
HELLO = msgpack.packb([0, 1, "fuzz", 20, 15000, 65536])
IDS = ["ca://X", "ca://Y"]


def _corpus() -> list[bytes]:
    out = []
    for meaning in sorted(VECTORS.glob("*.json")):
        if json.loads(meaning.read_text()).get("direction") == "server":
            out.append(meaning.with_suffix(".bin").read_bytes())
    entry = [0, 31, 1.5, 1, 1700000000, 0, 0, 0, "", {"units": "mA"}, 1, ""]
    out += [
        msgpack.packb(m)
        for m in (
            [1, 1, 1, IDS],
            [2, 1, 1, [entry, [1, 16, 4, "not found"]]],
            [3, 2, [[1, [[0, 3, 2.5, 2, 1700000001, 0]]]]],
            [5, None, 4403, "no longer readable"],
            [4, None, 1],
            [7, 1],
        )
    ]
    return out


CORPUS = _corpus()
KNOWN_CLOSES = {closecodes.PROTOCOL_ERROR, closecodes.HEARTBEAT_TIMEOUT, closecodes.NORMAL}


def _drain(session: Session) -> list[Event]:
    events = []
    session.data_to_send()
    while (event := session.next_event()) is not None:
        events.append(event)
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_server_messages_never_break_the_session(seed: int) -> None:
    rng = random.Random(seed)
    session = Session()
    session.add("a", "tok-a", tuple(IDS))
    now = 0.0
    failed = False
    session.connection_made(now)
    session.receive(HELLO, now)
    for _ in range(150):
        now += rng.random()
        frame = mutate(rng, CORPUS) if rng.random() < 0.7 else rng.choice(CORPUS)
        session.receive(frame, now)
        if rng.random() < 0.05:
            session.timer(now + rng.choice((1.0, 40.0)))
        failed |= any(isinstance(e, Failed) for e in _drain(session))
        if session.close_request is not None:
            code, reason = session.close_request
            assert code in KNOWN_CLOSES, (code, reason)
            session.connection_lost(code, reason)
            _drain(session)
            if code == closecodes.NORMAL:
                return  # a HELLO of another version: the session ended, as it should
            session.connection_made(now)
            session.receive(HELLO, now)
    # A fresh connection: the subscription, unless it ended, is attached and applies a snapshot.
    if session.close_request is None:
        session.connection_lost(closecodes.ABNORMAL, "")
    _drain(session)
    session.connection_made(now)
    session.receive(HELLO, now)
    sent = [msgpack.unpackb(d) for d in session.data_to_send()]
    if failed or "a" not in session:
        assert sent == []
        return
    assert len(sent) == 1 and sent[0][0] == 16
    session.receive(msgpack.packb([1, sent[0][1], 9, IDS]), now)
    session.receive(msgpack.packb([2, 1, 9, [[0, 16, 1, ""]]]), now)
    events = _drain(session)
    assert any(isinstance(e, Entries) and e.key == "a" for e in events), events
