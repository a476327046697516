"""Whether a topic's partitions are served (tidalmq_operator.availability): the Degraded
condition's reason and message, the brokers that are not alive, the status rows."""

from __future__ import annotations

from prometheus_client import REGISTRY
from tidalmq_core.metadata import NO_LEADER, BrokerInfo, ClusterMetadata, PartitionState
from tidalmq_operator.availability import (
    BROKER_NOT_ALIVE,
    DATA_LOST,
    LEADERLESS,
    SEVERITY,
    STORE_LOST,
    Problem,
    brokers_not_alive,
    compress,
    naming,
    partition_problem,
    row_fields,
    verdict,
)
from tidalmq_operator.runtime import (
    MAX_CONDITION_MESSAGE,
    clear_gauges,
    condition,
    set_gauges,
)


def cluster(*states: str) -> ClusterMetadata:
    meta = ClusterMetadata("c")
    for i, state in enumerate(states):
        meta.brokers[i] = BrokerInfo(i, "h", 9092 + i, state=state)
    return meta


def test_partition_lists_are_compressed() -> None:
    assert compress([11, 0, 1, 2, 3, 4, 5, 9, 12, 13, 14, 15, 16, 3]) == "0-5, 9, 11-16"
    assert compress([]) == ""
    assert naming([7]) == "partition 7"
    assert naming(range(12)) == "12 partitions: 0-11"
    assert naming([1, 3], "logic queue") == "2 logic queues: 1, 3"


def test_a_broker_is_not_alive_when_dead_or_silent_past_its_lease() -> None:
    meta = cluster("alive", "dead", "alive", "draining", "alive")
    beats = {0: 100.0, 2: 95.0, 3: 99.0}  # broker 4: never heartbeated to this controller
    out = brokers_not_alive(meta, beats, now=100.0, lease_s=4.5)
    # (no figure that changes every second: the condition's message would churn)
    assert out == {
        1: "declared dead",
        2: "heartbeats stopped, lease expired",
        4: "not heartbeating",
    }


def test_partition_problems() -> None:
    meta = cluster("alive", "dead")
    not_alive = {1: "declared dead"}
    ok = PartitionState(0, 3, [0])
    assert partition_problem(0, ok, meta, not_alive, None, 15) is None
    on_dead = partition_problem(1, PartitionState(1, 3, [1]), meta, not_alive, None, 15)
    assert on_dead == Problem(1, BROKER_NOT_ALIVE, 1, "declared dead")
    unknown = partition_problem(2, PartitionState(7, 3, [7]), meta, not_alive, None, 15)
    assert unknown is not None and unknown.why == "not registered"
    none = PartitionState(NO_LEADER, 3, [0])
    assert partition_problem(3, none, meta, not_alive, 2.0, 15) is None  # within the grace
    late = partition_problem(3, none, meta, not_alive, 20.0, 15)
    assert late is not None and late.kind == LEADERLESS


def test_the_gravest_reason_wins_and_the_message_names_everything() -> None:
    problems = [
        Problem(0, BROKER_NOT_ALIVE, 2, "silent for 9 s"),
        Problem(1, BROKER_NOT_ALIVE, 2, "silent for 9 s"),
        Problem(4, DATA_LOST, 0, "checkpoint missing", 300, 300, 0),
        Problem(5, DATA_LOST, 0, "checkpoint missing", 200, 200, 0),
        Problem(7, LEADERLESS),
    ]
    v = verdict(problems, None)
    assert v.degraded and v.reason == DATA_LOST
    assert "data lost in 2 partitions: 4-5, 500 acknowledged offsets missing" in v.message
    assert "4: 300 missing (expected end 300, found 0)" in v.message
    assert "2 partitions: 0-1 on broker 2, which is not alive (silent for 9 s)" in v.message
    assert "partition 7 without a leader" in v.message
    assert verdict(problems, "store identity marker missing").reason == STORE_LOST
    assert verdict(problems[:2], None).reason == BROKER_NOT_ALIVE
    assert not verdict([], None).degraded


def test_rows_show_lost_partitions_and_their_missing_offsets() -> None:
    lost = Problem(4, DATA_LOST, 0, "checkpoint missing", 300, 300, 0)
    assert row_fields(lost, None) == {
        "problem": DATA_LOST,
        "lost": True,
        "missingOffsets": 300,
        "expectedEnd": 300,
        "foundEnd": 0,
        "lostReason": "checkpoint missing",
    }
    assert row_fields(None, None) == {}
    assert row_fields(None, "marker missing") == {"problem": STORE_LOST}


def test_degraded_gauge_has_every_reason_of_a_resource_at_0_or_1() -> None:
    """tidalmq_operator_degraded: a resource not Degraded shows 0 for each reason (a panel and
    the alert see it), the reason of its condition 1; a deleted resource leaves no series."""

    def degraded() -> dict[str, float | None]:
        return {
            reason: REGISTRY.get_sample_value(
                "tidalmq_operator_degraded",
                {"kind": "Topic", "resource": "gauged", "reason": reason},
            )
            for reason in SEVERITY
        }

    set_gauges("Topic", "gauged", "gauged", [], None)
    assert degraded() == dict.fromkeys(SEVERITY, 0.0)
    set_gauges("Topic", "gauged", "gauged", [], "BrokerNotAlive")
    assert degraded() == {**dict.fromkeys(SEVERITY, 0.0), "BrokerNotAlive": 1.0}
    set_gauges("Topic", "gauged", "gauged", [], None)
    assert degraded() == dict.fromkeys(SEVERITY, 0.0)
    clear_gauges("Topic", "gauged")
    assert degraded() == dict.fromkeys(SEVERITY, None)


def test_a_long_list_of_partitions_is_cut_short_and_says_how_many_more() -> None:
    """Every third partition of a 10,000-partition topic on a broker that is not alive, named
    one by one, made a Degraded message over the 32 KiB a condition may hold, and the whole
    status update was refused (seen in CI, 2026-11-28)."""
    text = naming(range(0, 30_000, 3))
    assert text.startswith("10000 partitions: 0, 3, 6")
    assert text.endswith(", ... and 9960 more")
    assert len(text) < 400
    assert compress(range(0, 120, 3)).count(",") == 39  # 40 ranges: all named
    assert compress(range(0, 123, 3)).endswith("117, ... and 1 more")
    assert compress(iter([7, 5, 6, 1])) == "1, 5-7"


def test_a_condition_message_never_exceeds_what_the_resource_may_hold() -> None:
    c = condition("Degraded", True, "BrokerNotAlive", "x" * 100_000, 3)
    assert len(c["message"]) <= MAX_CONDITION_MESSAGE
    assert c["message"].endswith("(truncated)")
    assert condition("Ready", True, "Serving", "3 partitions served", 3)["message"] == (
        "3 partitions served"
    )
