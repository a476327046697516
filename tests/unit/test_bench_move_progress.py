"""bench/move_progress.py: a Metadata poll is published whole.

At 50,000 partitions the bench's add-broker phase once ended "done" with 0 of 728 sampled
moved partitions probed: the tracker had already counted the new broker's fair share from the
poll it was applying while none of that poll's arrivals were recorded yet, so "every sampled
moved partition served" held over an empty set. The checks below look at the tracker from
inside `moved` (the main thread's view while the tracker's thread is mid-poll)."""

from __future__ import annotations

from bench.move_progress import MoveProgress

TP = tuple[str, int]
TOPICS = {"orders-00": 600, "orders-01": 600}
NEW = 3


def poll(leader_of: dict[TP, int]) -> dict[TP, int]:
    return {("__consumer_offsets", 0): 0, **leader_of}


def done(p: MoveProgress, served: set[TP], brokers: int = 4) -> bool:
    """bench/metadata_scale.py's add-broker check: the new broker leads its fair share and
    every sampled moved partition served."""
    share = sum(p.led_by.values()) // brokers
    sampled = p.sampled_moved()
    return p.led_by[NEW] >= share > 0 and sampled <= served


def test_a_poll_being_applied_is_not_visible() -> None:
    before = {(t, i): i % 3 for t, n in TOPICS.items() for i in range(n)}
    after = {tp: NEW if tp[1] % 4 == 3 else leader for tp, leader in before.items()}
    sample = {tp for tp in before if tp[1] % 8 == 7}  # all of them move
    seen_mid_poll: list[tuple[int, int, bool]] = []
    p: MoveProgress

    def moved(tp: TP, leader: int) -> bool:
        seen_mid_poll.append((p.led_by[NEW], len(p.sampled_moved()), done(p, served=set())))
        return leader == NEW

    p = MoveProgress(TOPICS, moved, sample)
    p.apply(poll(before), 1.0)
    seen_mid_poll.clear()
    applied = p.apply(poll(after), 2.0)
    assert seen_mid_poll and set(seen_mid_poll) == {(0, 0, False)}  # the previous poll, whole
    assert sorted(applied.arrived_sampled) == sorted(sample) and applied.left == []
    assert p.led_by[NEW] == 300 and len(p.moved_at) == 300 and p.sampled_moved() == sample
    assert not done(p, served=set())
    assert done(p, served=sample)


def test_partitions_leaving_again_are_reported_and_not_probed_twice() -> None:
    sample = {("orders-00", 1), ("orders-00", 2)}
    p = MoveProgress(["orders-00"], lambda tp, leader: leader == NEW, sample)
    first = p.apply(poll({("orders-00", 1): NEW, ("orders-00", 2): NEW, ("other", 0): NEW}), 1.0)
    assert sorted(first.arrived_sampled) == sorted(sample)
    assert set(p.leaders) == {("orders-00", 1), ("orders-00", 2)}  # only the tracked topics
    again = p.apply(poll({("orders-00", 1): NEW, ("orders-00", 2): 0}), 2.0)
    assert again.arrived_sampled == [] and again.left == [("orders-00", 2)]
    assert p.moved_at == {("orders-00", 1): 1.0} and p.left == 1
    back = p.apply(poll({("orders-00", 1): NEW, ("orders-00", 2): NEW}), 3.0)
    assert back.arrived_sampled == [("orders-00", 2)] and p.moved_at[("orders-00", 2)] == 3.0
