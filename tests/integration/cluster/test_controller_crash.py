"""[M1] acceptance: kill -9 of the controller (the `tidalmq local up` process) in the middle of
a rebalance; after the restart every move finishes, and nothing acknowledged is lost.

Real processes throughout: `local up` with 3 brokers, `tidalmq local add-broker`, SIGKILL of
`local up` while /v1/moves shows moves in flight and others still Pending, `local up` again on
the same data dir (its controller resumes the moves from the metadata log), an idempotent
confluent-kafka producer writing throughout and a full read-back. The steps are
bench/controller_crash.py's, which runs the same at 20,000 partitions and prints the figures.

6,000 partitions, with the controller's waves at 250 moves per broker
(TIDALMQ_MAX_MOVES_PER_BROKER): the rebalance onto a 4th broker (1,500 moves) takes six waves,
so Pending moves are there to kill in front of (with waves of 1,000 a CI run found the second,
last wave admitted before its first look, 2.2 s after add-broker); the whole test takes about
30 s here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.controller_crash import BROKERS, ControllerCrash

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

PARTITIONS = 6_000
FINISH_BOUND_S = 90.0  # from `local up` again to every move finished by the metadata
WAVE = 250  # moves in flight per broker: a quarter of PARTITIONS takes six waves


def test_kill_9_of_local_up_mid_rebalance_every_move_finishes_and_nothing_acked_is_lost(
    tmp_path: Path,
) -> None:
    run = ControllerCrash(
        tmp_path, PARTITIONS, finish_timeout_s=FINISH_BOUND_S, max_moves_per_broker=WAVE
    )
    try:
        first = run.start()
        topics = run.create(first)
        topic, count = next(iter(topics.items()))
        run.produce(first, topic, count)  # ~200 partitions, acks=all, idempotent, throughout
        new = run.add_broker(first)  # `tidalmq local add-broker`: its fair share in waves
        assert new == BROKERS

        run.kill_mid_rebalance(first)
        at_kill = run.figures["at_kill"]
        assert at_kill["pending"] > 0 and at_kill["in_flight"] > 0, at_kill

        # the same data dir, the 3 brokers and the added one: every move finishes by the
        # metadata (nothing moving or leaderless, broker 3 holds its fair share), none lost
        second = run.restart(BROKERS + 1, new)
        after = run.figures["restart"]
        resumed = after["resumed"]
        queued = sum(n for key, n in resumed.items() if key.startswith("queued:"))
        assert queued > 0, f"the kill left no queued move to the new controller: {resumed}"
        outcomes = after["moves_finished_by_new_controller"]
        assert outcomes.get("done", 0) >= sum(resumed.values()), (outcomes, resumed)
        assert not outcomes.get("failed") and not outcomes.get("cancelled"), outcomes

        # everything the producer sent was acknowledged (it retried across the restart) and is
        # read back exactly once, at its offset, in order, offsets contiguous from 0
        run.read_back(second)
        assert run.figures["producer"]["partitions_moved"] > 0, run.figures["producer"]
    finally:
        run.close()
        print(json.dumps(run.figures))
