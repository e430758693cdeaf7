"""What a backfill subscription holds of its channels' past (pvwire_client/held.py, PROTOCOL.md
section 2.8): holes where a slow backfill left rows out, the rows kept of what comes again,
and the `since` of each ATTACH. The cases (protocol/cases/history_left_out.json) drive both
clients through the first of these; these go on where a backfill is cut short again."""

from __future__ import annotations

from pvwire_client.held import LEFT_OUT, MAX_HOLES, Held


def rows(
    held: Held, t: list[int], left_out_at: int | None = None, resolution: int = 0
) -> list[int]:
    """One HISTORY of channel 0 (a left-out row appended at `left_out_at`): the times kept."""
    if left_out_at is not None:
        t = [*t, left_out_at]
    gap = [int(x == left_out_at) for x in t]
    status = [LEFT_OUT * g for g in gap]
    runs = held.history(0, t, gap, status, resolution)
    return [t[i] for start, stop in runs for i in range(start, stop)]


def slow_backfill(held: Held, t: list[int], cut: int, snapshot: int) -> list[int]:
    held.attached()
    kept = rows(held, t, cut)
    held.entry(0, snapshot)
    held.snapshot(0, snapshot)
    return kept


def test_a_hole_is_asked_for_and_filled_and_what_is_held_is_dropped() -> None:
    held = Held(1)
    assert held.since() is None
    assert slow_backfill(held, [1, 2, 3], cut=4, snapshot=9) == [1, 2, 3, 4]
    held.entry(0, 10)  # live
    assert held.holes == [[[4, 9]]] and held.since() == [3]
    held.attached()
    assert rows(held, [4, 6, 9, 10, 11]) == [4, 6, 11]  # 9 and 10 are held
    held.snapshot(0, 12)
    assert held.holes == [[]] and held.since() == [11]


def test_a_backfill_cut_short_again_inside_a_hole_keeps_both_spans() -> None:
    held = Held(1)
    slow_backfill(held, [1, 2], cut=3, snapshot=9)
    held.entry(0, 10)
    # Again slow: rows 3 and 5 of the hole, then left out from 7 on, the snapshot at 12.
    assert slow_backfill(held, [3, 5], cut=7, snapshot=12) == [3, 5, 7]
    # Lacked: 7 (the left-out row brings nothing of its time) to 9, and what came after the 10
    # held before up to the new snapshot.
    assert held.holes == [[[7, 9], [11, 12]]] and held.since() == [6]
    held.attached()
    assert rows(held, [7, 8, 9, 10, 11, 12, 13]) == [7, 8, 11, 13]
    held.snapshot(0, 14)
    assert held.holes == [[]]


def test_a_bucket_kept_in_a_hole_fills_it_to_its_end() -> None:
    held = Held(1)
    slow_backfill(held, [10], cut=20, snapshot=100)
    held.attached()
    assert rows(held, [20, 40], resolution=20) == [20, 40]
    assert held.holes == [[[60, 100]]]


def test_holes_are_bounded_the_oldest_given_up() -> None:
    held = Held(1)
    slow_backfill(held, [1], cut=2, snapshot=10)
    for k in range(1, MAX_HOLES + 2):
        held.entry(0, 10 * k + 5)
        slow_backfill(held, [], cut=2, snapshot=10 * (k + 1))
    assert len(held.holes[0]) == MAX_HOLES
    assert held.since() == [held.holes[0][0][0] - 1] and held.holes[0][0][0] > 2
