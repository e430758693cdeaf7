"""The drain's pacing (core/drain.py) with a fake clock: the closes in order, one pass at a time,
each pass closing what is due by the clock but never more than its bound, however late the loop
wakes it; the window kept; each close's reason spreading the clients of its pass again. What a
real server does with it (4012 over HTTP, clients moving) is tests/test_drain.py's."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from pvwire.core.drain import (
    CLOSE_WAIT,
    JITTER_MAX,
    Drain,
    DrainState,
    Pacer,
    draining_reason,
    reconnect_within,
)
from pvwire.wire.codes import DRAINING, RESTART

COUNT, WINDOW = 1000, 20.0  # the defaults' schedule: a close every 20 ms
STEP = WINDOW / COUNT


def run_pacer(
    count: int, window: float, late: Callable[[int], float]
) -> tuple[Pacer, list[tuple[float, int]]]:
    """Pass after pass as a loop would, each wake-up `late(pass number)` s after it was asked
    for: the pacer and its passes, (time, closes)."""
    now = 100.0
    pacer = Pacer(count, window, now)
    passes: list[tuple[float, int]] = []
    while pacer.left:
        n = pacer.take(now)
        if n:
            passes.append((now, n))
        wait = pacer.wait(now)
        if wait is None:
            break
        assert wait > 0
        now += wait + late(len(passes))
        assert len(passes) <= 10 * count, "the pacer makes no progress"
    return pacer, passes


def test_on_time_one_close_per_pass_spread_over_the_window() -> None:
    pacer, passes = run_pacer(COUNT, WINDOW, lambda _: 0.0)
    assert [n for _, n in passes] == [1] * COUNT
    # The first at once, the last one step before the window's end.
    assert passes[0][0] == 100.0
    assert passes[-1][0] == pytest.approx(100.0 + WINDOW - STEP)
    assert pacer.most == 1 and pacer.behind_s == pytest.approx(0.0, abs=1e-9)


def test_a_loop_late_at_every_wake_up_closes_what_is_due_and_keeps_the_window() -> None:
    # Every wake-up 0.3 s late (a busy loop's passes ~0.31 s apart): 15 or 16 closes due per
    # pass, all of them closed, within the bound; the last pass within the window.
    pacer, passes = run_pacer(COUNT, WINDOW, lambda _: 0.3)
    counts = [n for _, n in passes]
    assert pacer.bound == 25
    assert sum(counts) == COUNT and set(counts[1:-1]) <= {15, 16}
    assert passes[-2][0] < 100.0 + WINDOW and passes[-1][0] < 100.0 + WINDOW + 0.31
    assert pacer.behind_s < 0.32


def test_after_a_stall_the_drain_catches_up_at_twice_the_pace_not_at_once() -> None:
    # The 100th wake-up comes 3 s late: 150 closes are due at once. The next pass closes the
    # bound (25), then the rest goes at most twice the even pace: 2 per 20 ms, here 1 per pass
    # of 10 ms.
    stall = 100
    pacer, passes = run_pacer(COUNT, WINDOW, lambda i: 3.0 if i == stall else 0.0)
    counts = [n for _, n in passes]
    assert sum(counts) == COUNT and max(counts) == pacer.bound == 25
    assert counts[:stall] == [1] * stall and counts[stall] == 25
    t0 = passes[stall][0]
    for t, _ in passes[stall:]:
        since = sum(n for u, n in passes[stall:] if u <= t)
        assert since <= 25 + 2 * (t - t0) / STEP + 1
    # Caught up by the window's end: one per pass again, the last one in time.
    assert counts[-50:] == [1] * 50
    assert passes[-1][0] < 100.0 + WINDOW


def test_a_loop_far_behind_still_ends_soon_after_the_window() -> None:
    # Every wake-up 1 s late: 50 closes due per pass, 25 allowed; past the window's end the
    # bound doubles each pass, so what is left goes within a few passes, not 20 s later.
    pacer, passes = run_pacer(COUNT, WINDOW, lambda _: 1.0)
    end = 100.0 + WINDOW
    within = [n for t, n in passes if t < end]
    after = [n for t, n in passes if t >= end]
    assert max(within) == pacer.bound
    assert sum(within) + sum(after) == COUNT
    assert len(after) <= 1 + math.ceil(math.log2(COUNT / pacer.bound))
    # Growing, each at most twice the pass before; the last one what was left.
    assert all(a <= b <= 2 * a for a, b in itertools.pairwise(after[:-1]))


def test_the_bound_is_half_a_second_of_the_schedule() -> None:
    assert Pacer(1000, 20.0, 0.0).bound == 25
    assert Pacer(10_000, 20.0, 0.0).bound == 250
    assert Pacer(9, 4.0, 0.0).bound == 2
    assert Pacer(3, 20.0, 0.0).bound == 1  # closes farther apart than that: one per pass
    # No window: everything at once, in one pass.
    pacer = Pacer(7, 0.0, 0.0)
    assert pacer.take(0.0) == 7 and pacer.wait(0.0) is None


def test_nothing_to_close() -> None:
    pacer = Pacer(0, 20.0, 0.0)
    assert pacer.left == 0 and pacer.wait(0.0) is None


def test_the_reason_spreads_a_pass_over_the_schedule_it_stands_for() -> None:
    assert draining_reason(reconnect_within(STEP)) == "reconnect within 20 ms"
    assert draining_reason(reconnect_within(STEP, 5)) == "reconnect within 100 ms"
    assert reconnect_within(0.5, 10) == JITTER_MAX  # at most the cap
    assert reconnect_within(0.0, 3) == JITTER_MAX  # all at once: the cap


@dataclass
class FakeClient:
    number: int
    endpoint: str = "stream"
    close_request: tuple[int, str] | None = None
    closed_in: int | None = None  # the pass that closed it
    closed_at: float = 0.0  # and when, on the fake clock

    def request_close(self, code: int, reason: str) -> None:
        assert self.close_request is None
        self.close_request = (code, reason)


@dataclass
class LoadedLoop:
    """A fake clock and a sleep on it that wakes `late(n)` s after what was asked, n counting
    the sleeps; it tells each client which pass closed it."""

    clients: list[FakeClient]
    late: Callable[[int], float]
    now: float = 50.0
    sleeps: int = 0
    asked: list[float] = field(default_factory=list)
    drain: Drain | None = None
    leave: bool = False  # clients closed leave the hub at the next sleep (their pumps ran)
    gone: set[int] = field(default_factory=set)

    def clock(self) -> float:
        return self.now

    def sessions(self) -> list[FakeClient]:
        return [c for c in self.clients if c.number not in self.gone]

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        for c in self.clients:
            if c.close_request and c.closed_in is not None and self.leave:
                self.gone.add(c.number)
            if c.close_request and c.closed_in is None:
                c.closed_in, c.closed_at = self.sleeps, self.now
        self.sleeps += 1
        self.now += seconds + self.late(self.sleeps)


async def drained(
    clients: list[FakeClient], late: Callable[[int], float], leave: bool = False
) -> LoadedLoop:
    loop = LoadedLoop(clients, late, leave=leave)
    drain = loop.drain = Drain(loop.sessions, 5.0, WINDOW, loop.clock, loop.sleep)
    assert drain.begin() and not drain.ready
    await drain.run()
    await loop.sleep(0.0)  # marks the last pass's clients
    assert drain.state is DrainState.DONE
    return loop


async def test_drain_closes_oldest_first_a_bounded_few_per_pass_under_a_loaded_loop() -> None:
    # Numbers out of order, as the hub's set gives them; every 7th wake-up 0.3 s late, and one
    # stall of 3 s in the middle.
    clients = [FakeClient(n) for n in reversed(range(COUNT))]
    loop = await drained(clients, lambda i: 3.0 if i == 50 else 0.3 if i % 7 == 0 else 0.0)
    assert loop.drain is not None and loop.drain.closed == COUNT
    assert loop.asked[0] == 5.0  # the delay first, serving on
    by_pass: dict[int, list[FakeClient]] = {}
    for c in clients:
        assert c.closed_in is not None
        by_pass.setdefault(c.closed_in, []).append(c)
    passes = [sorted(by_pass[k], key=lambda c: c.number) for k in sorted(by_pass)]
    # Oldest first: the passes in order of client numbers, none closed twice.
    assert [c.number for p in passes for c in p] == list(range(COUNT))
    # At most the bound (half a second of the schedule) in one pass: after the stall, not 150;
    # and never more than twice the even pace for long: in any second, the bound and 100.
    sizes = [len(p) for p in passes]
    assert max(sizes) == 25 and sizes[by_pass_index(passes, 50)] == 25
    for p in passes:
        t = p[0].closed_at
        assert sum(len(q) for q in passes if t - 1.0 < q[0].closed_at <= t) <= 25 + 100
    assert all(p[0].closed_at < 50.0 + 5.0 + WINDOW + 0.31 for p in passes)
    # Each client is told to spread its reconnect over what its pass stood for.
    for p in passes:
        want = (DRAINING, draining_reason(reconnect_within(STEP, len(p))))
        assert all(c.close_request == want for c in p)
    assert loop.drain.pacer is not None and loop.drain.pacer.most == 25


def by_pass_index(passes: list[list[FakeClient]], sleeps: int) -> int:
    """The index of the first pass after the `sleeps`-th sleep."""
    return next(
        i for i, p in enumerate(passes) if p[0].closed_in is not None and p[0].closed_in >= sleeps
    )


async def test_pvws_clients_get_1012_and_a_client_closing_already_is_left_alone() -> None:
    clients = [FakeClient(0), FakeClient(1, endpoint="pvws"), FakeClient(2)]
    clients[2].close_request = (4008, "slow")
    loop = await drained(clients, lambda _: 0.0)
    assert loop.drain is not None and loop.drain.closed == 2
    assert clients[0].close_request == (DRAINING, "reconnect within 1000 ms")  # 20 s / 3: cap
    assert clients[1].close_request == (RESTART, "server draining: reconnect")
    assert clients[2].close_request == (4008, "slow")


async def test_a_second_sigterm_closes_what_is_left_in_one_pass() -> None:
    clients = [FakeClient(n) for n in range(100)]
    loop = LoadedLoop(clients, lambda _: 0.0)

    async def sleep(seconds: float) -> None:
        await loop.sleep(seconds)
        if loop.sleeps == 10:  # the delay and 9 paced closes
            assert not drain.begin()

    drain = Drain(lambda: list(clients), 1.0, WINDOW, loop.clock, sleep)
    drain.begin()
    await drain.run()
    assert drain.closed == 100
    rest = [c.close_request for c in clients[9:]]
    assert rest == [(DRAINING, draining_reason(JITTER_MAX))] * 91


async def test_the_drain_ends_once_its_closes_went_out() -> None:
    clients = [FakeClient(n) for n in range(10)]
    loop = await drained(clients, lambda _: 0.0, leave=True)
    last = max(c.closed_at for c in clients)
    assert len(loop.gone) == 10
    # Each left a sleep after its close: the drain waited two short sleeps after the last, not
    # its whole bound.
    assert loop.now - last < CLOSE_WAIT / 2


async def test_a_connection_that_never_leaves_holds_the_drain_back_at_most_its_bound() -> None:
    clients = [FakeClient(n) for n in range(10)]
    loop = await drained(clients, lambda _: 0.0)
    last = max(c.closed_at for c in clients)
    assert not loop.gone
    assert CLOSE_WAIT <= loop.now - last <= CLOSE_WAIT + 0.1
