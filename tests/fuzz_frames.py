"""Client frames for the stream fuzzers: hostile msgpack headers and a seeded mutator that
derives broken frames from a corpus of valid ones (tests/test_fuzz_session.py in memory,
tests/test_fuzz_endpoints.py over a real socket)."""

from __future__ import annotations

import random

__all__ = ["HOSTILE", "mutate"]

# msgpack headers that promise more than the frame holds, or nest deeply.
HOSTILE = [
    b"\xdd\xff\xff\xff\xff",  # array32 of 4 billion
    b"\xdf\xff\xff\xff\xff",  # map32 of 4 billion
    b"\xdb\xff\xff\xff\xff",  # str32
    b"\xc6\xff\xff\xff\xff",  # bin32
    b"\xc9\xff\xff\xff\xff\x05",  # ext32
    b"\xc1",  # never used
    b"\xd6\xff\x00\x00\x00\x00",  # timestamp ext
    b"\xd7\xff" + b"\xff" * 8,  # timestamp64 with nanoseconds out of range
    b"\x91" * 2000 + b"\x00",  # arrays nested 2,000 deep
    b"\x81\x90\x00",  # map with an array key
]


def mutate(rng: random.Random, corpus: list[bytes]) -> bytes:
    frame = bytearray(rng.choice(corpus))
    if rng.random() < 0.1:  # a valid message now and then: attach, detach and ping run too
        return bytes(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        pos = rng.randint(0, len(frame))
        if op == 0 and frame:  # flip bits
            i = rng.randrange(len(frame))
            frame[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # truncate
            del frame[pos:]
        elif op == 2:  # insert random bytes
            frame[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 3:  # splice with another message
            other = rng.choice(corpus)
            frame[pos:] = other[rng.randint(0, len(other)) :]
        elif op == 4:  # a hostile header somewhere
            frame[pos:pos] = rng.choice(HOSTILE)
        elif op == 5 and frame:  # an interesting byte
            frame[rng.randrange(len(frame))] = rng.choice(b"\x00\x7f\x80\xc0\xc1\xc2\xcf\xd3\xff")
        elif op == 6:  # trailing message
            frame += rng.choice(corpus)
        elif frame:  # duplicate a slice
            a = rng.randrange(len(frame))
            frame[pos:pos] = frame[a : a + rng.randint(1, 32)]
    return bytes(frame)
