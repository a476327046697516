"""When the listener gives the heap back after connections closed (server/heap.py)."""

from __future__ import annotations

from tidalmq_broker.server import heap


class Releases:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> heap.Released:
        self.calls += 1
        return heap.Released(0.0, 0.0, True)


def closes(trimmer: heap.AfterCloses, n: int) -> None:
    for _ in range(n):
        trimmer.closed()


def test_a_wave_is_released_once_it_is_over_not_while_it_closes() -> None:
    released = Releases()
    trimmer = heap.AfterCloses(after=256, max_interval_s=60, release=released)
    closes(trimmer, 300)
    assert trimmer.tick(1.0) is None  # closes came since the last sweep: the wave goes on
    closes(trimmer, 4700)
    assert trimmer.tick(2.0) is None
    assert trimmer.tick(3.0) is not None  # a sweep without a close: over, all 5,000 of it
    assert (released.calls, trimmer.pending) == (1, 0)
    assert trimmer.tick(4.0) is None  # nothing new


def test_a_few_closes_are_not_worth_a_release() -> None:
    released = Releases()
    trimmer = heap.AfterCloses(after=256, max_interval_s=60, release=released)
    closes(trimmer, 255)
    assert trimmer.tick(1.0) is None and trimmer.tick(2.0) is None
    trimmer.closed()  # the 256th, in a later wave: counted with the earlier ones
    assert trimmer.tick(3.0) is None
    assert trimmer.tick(4.0) is not None and released.calls == 1


def test_a_steady_churn_is_released_every_max_interval() -> None:
    released = Releases()
    trimmer = heap.AfterCloses(after=256, max_interval_s=10, release=released)
    calls = []
    for second in range(1, 31):  # 300 closes every second, never a quiet sweep
        closes(trimmer, 300)
        calls.append(trimmer.tick(float(second)) is not None)
    assert [s + 1 for s, c in enumerate(calls) if c] == [11, 22]  # 10 s after it was due


def test_release_empties_the_free_lists_and_trims() -> None:
    released = heap.release()
    assert released.collect_s >= 0 and released.trim_s >= 0
    assert released.trimmed == heap.trim()  # glibc here: True; elsewhere False, never raises
