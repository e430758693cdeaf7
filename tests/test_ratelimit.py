"""access/ratelimit.py: token buckets per identity, and the table's bound on how many are kept."""

from __future__ import annotations

from pvwire.access.ratelimit import RateLimiter
from pvwire.limits import integer

TRACKED = integer("rate_limited_identities")


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    now = [0.0]
    limiter = RateLimiter(2.0, 4.0, clock=lambda: now[0])
    assert [limiter.take("olga") for _ in range(5)] == [True] * 4 + [False]
    now[0] += 1.0  # two more
    assert [limiter.take("olga") for _ in range(3)] == [True, True, False]
    assert limiter.take("vic")  # another identity has its own bucket


def test_beyond_the_table_s_count_the_least_recently_seen_identity_is_forgotten() -> None:
    """`rate_limited_identities`: memory stays bounded however many identities come; the one
    forgotten starts again with a full burst, which is all it can gain."""
    limiter = RateLimiter(1.0, 1.0, clock=lambda: 0.0)
    assert limiter.take("first") and not limiter.take("first")
    for i in range(TRACKED - 1):
        limiter.take(f"a{i}")
    # TRACKED identities: `first` is still remembered, still empty (and now the most recent).
    assert not limiter.take("first")
    for i in range(TRACKED):  # TRACKED newer ones: one more than fits beside `first`
        limiter.take(f"b{i}")
    assert limiter.take("first")  # forgotten: a fresh bucket
