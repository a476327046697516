"""MemoryBudget: counts what is charged, says when it is exhausted, wakes waiters oldest first,
and lets one waiter through when nothing in flight could ever free room."""

from __future__ import annotations

import pytest
from tidalmq_broker.server.budget import MemoryBudget


def test_room_and_exhaustion_follow_charges_and_releases() -> None:
    budget = MemoryBudget("request", 100)
    budget.charge(60)
    assert budget.room() == 40 and not budget.exhausted
    budget.charge(50)  # never refused: the bytes are in memory already
    assert budget.used == 110 and budget.room() == 0 and budget.exhausted
    assert budget.peak == 110
    budget.release(30)
    assert budget.used == 80 and not budget.exhausted and budget.peak == 110


def test_waiters_are_woken_oldest_first_and_only_while_there_is_room() -> None:
    budget = MemoryBudget("request", 100)
    woken: list[str] = []
    budget.charge(40, complete=True)
    budget.charge(70)

    def waiter(name: str, takes: int):
        def wake() -> None:
            woken.append(name)
            budget.charge(takes)

        return wake

    assert budget.wait(waiter("a", 30)) is True
    assert budget.wait(waiter("b", 30)) is True
    assert budget.wait(waiter("c", 0)) is True
    assert budget.waiting == 3
    budget.release(40, complete=True)  # 70 used: a takes 30 -> 100, exhausted again
    assert woken == ["a"] and budget.waiting == 2
    budget.release(50)  # 50 used: b takes 30 -> 80, c takes nothing
    assert woken == ["a", "b", "c"] and budget.waiting == 0


def test_a_waiter_that_left_is_forgotten() -> None:
    budget = MemoryBudget("request", 10)
    budget.charge(10, complete=True)
    woken: list[int] = []
    cb = lambda: woken.append(1)  # noqa: E731
    assert budget.wait(cb)
    budget.forget(cb)
    budget.forget(cb)  # twice is harmless
    budget.release(10, complete=True)
    assert woken == []


def test_no_wait_when_there_is_room() -> None:
    budget = MemoryBudget("response", 10)
    budget.charge(5)
    assert budget.wait(lambda: None) is False
    assert budget.waiting == 0


def test_frames_that_need_each_other_are_not_left_waiting_forever() -> None:
    """Every byte charged belongs to frames still arriving (nothing is handled, so nothing
    will be released): the next one may go on, up to `slack` past the limit, not further."""
    budget = MemoryBudget("request", 100, slack=50)
    budget.charge(110)  # partial frames only
    assert budget.wait(lambda: None) is False
    budget.charge(45)  # 155: more than the slack past the limit
    assert budget.wait(lambda: None) is True
    other = MemoryBudget("request", 100, slack=50)
    other.charge(60)
    other.charge(50, complete=True)  # a whole request in flight will free room: wait for it
    assert other.wait(lambda: None) is True


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError):
        MemoryBudget("request", 0)
