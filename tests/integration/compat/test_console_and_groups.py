"""kafka-console-producer / kafka-console-consumer and kafka-consumer-groups against one TidalMQ
broker: keyed round trips, group describe/list/state/members, offset resets, deletes."""

from __future__ import annotations

import re
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bench.kafka.harness import (
    console_consume,
    console_produce,
    parse_table,
    run_tool,
    tool_command,
)
from tests.integration.compat.conftest import create_topic, name, tool
from tests.support.broker_process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def test_console_round_trip_with_keys(tidalmq: BrokerProcess) -> None:
    b = tidalmq.bootstrap
    topic = name("console")
    create_topic(b, topic, 3)
    sent = [(f"k{i % 7}", f"value {i} with spaces") for i in range(60)]
    console_produce(b, topic, [f"{k}:{v}" for k, v in sent], key_separator=":")
    lines = _consume_with_positions(b, topic, len(sent))
    assert len(lines) == len(sent)
    by_partition: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
    key_partition: dict[str, int] = {}
    for partition, offset, key, value in lines:
        by_partition[partition].append((offset, key, value))
        # the Java partitioner hashes the key: one key, one partition
        assert key_partition.setdefault(key, partition) == partition, (key, partition)
    assert set(by_partition) <= {0, 1, 2} and len(key_partition) == 7
    for partition, records in by_partition.items():
        offsets = [o for o, _, _ in records]
        assert offsets == list(range(len(records))), (partition, offsets)
    # per key, the values arrive in the order they were sent
    for key in key_partition:
        got = [v for recs in by_partition.values() for _, k, v in recs if k == key]
        assert got == [v for k, v in sent if k == key]

    empty = name("empty")
    create_topic(b, empty)
    assert console_consume(b, empty, 1, timeout_ms=3000) == []


def _consume_with_positions(
    bootstrap: str, topic: str, count: int
) -> list[tuple[int, int, str, str]]:
    proc = run_tool(
        "kafka-console-consumer",
        "--topic",
        topic,
        "--from-beginning",
        "--max-messages",
        str(count),
        "--timeout-ms",
        "30000",
        "--formatter-property",
        "print.key=true",
        "--formatter-property",
        "print.partition=true",
        "--formatter-property",
        "print.offset=true",
        bootstrap=bootstrap,
        check=True,
    )
    out = []
    for line in proc.stdout.splitlines():
        m = re.fullmatch(r"Partition:(\d+)\tOffset:(\d+)\t([^\t]*)\t(.*)", line)
        assert m, line
        out.append((int(m[1]), int(m[2]), m[3], m[4]))
    return out


def _groups(bootstrap: str, *args: str) -> str:
    return tool("kafka-consumer-groups", *args, bootstrap=bootstrap)


@contextmanager
def running_console_consumer(bootstrap: str, topic: str, group: str) -> Iterator[None]:
    """A kafka-console-consumer in group `group` in the background (stopped on exit)."""
    cmd = tool_command(
        "kafka-console-consumer", "--topic", topic, "--group", group, bootstrap=bootstrap
    )
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_state(bootstrap: str, group: str, state: str, timeout_s: float = 120) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    rows: list[dict[str, str]] = []
    while time.monotonic() < deadline:
        out = _groups(bootstrap, "--describe", "--group", group, "--state")
        rows = parse_table(out, "GROUP")
        if rows and rows[0]["STATE"] == state:
            return rows[0]
        time.sleep(1)
    raise AssertionError(f"group {group} not {state} within {timeout_s}s: {rows}")


def test_consumer_groups_describe_list_reset_delete(tidalmq: BrokerProcess) -> None:
    b = tidalmq.bootstrap
    topic, group = name("groups"), name("g")
    create_topic(b, topic, 2)
    console_produce(b, topic, [f"k{i}:m{i}" for i in range(20)], key_separator=":")
    assert len(console_consume(b, topic, 20, group=group)) == 20

    assert group in _groups(b, "--list").split()
    listed = parse_table(_groups(b, "--list", "--state"), "GROUP")
    assert {"GROUP": group, "STATE": "Empty"} in listed, listed
    assert group not in _groups(b, "--list", "--state", "Stable").split()
    # kafka-groups: every TidalMQ group is a classic consumer group
    typed = parse_table(tool("kafka-groups", "--list", bootstrap=b), "GROUP")
    assert {"GROUP": group, "TYPE": "Classic", "PROTOCOL": "consumer"} in typed, typed
    classic = tool("kafka-groups", "--list", "--group-type", "classic", bootstrap=b)
    assert group in classic.split()
    assert group not in tool("kafka-groups", "--list", "--group-type", "consumer", bootstrap=b)

    def offsets() -> dict[int, dict[str, str]]:
        rows = parse_table(_groups(b, "--describe", "--group", group), "GROUP")
        assert all(r["GROUP"] == group and r["TOPIC"] == topic for r in rows), rows
        return {int(r["PARTITION"]): r for r in rows}

    rows = offsets()
    assert sorted(rows) == [0, 1]
    end = {p: int(r["LOG-END-OFFSET"]) for p, r in rows.items()}
    assert sum(end.values()) == 20
    assert all(
        r["CURRENT-OFFSET"] == r["LOG-END-OFFSET"] and r["LAG"] == "0" for r in rows.values()
    ), rows
    state = parse_table(_groups(b, "--describe", "--group", group, "--state"), "GROUP")
    assert state[0]["STATE"] == "Empty" and state[0]["#MEMBERS"] == "0", state
    assert re.fullmatch(
        rf"{re.escape(b)}\s+\(0\)", state[0]["COORDINATOR"] + " " + state[0]["(ID)"]
    )

    # an active member: described with its client id and assignment; the group cannot be deleted
    with running_console_consumer(b, topic, group):
        stable = _wait_state(b, group, "Stable")
        assert stable["#MEMBERS"] == "1" and stable["ASSIGNMENT-STRATEGY"] == "range", stable
        members = parse_table(_groups(b, "--describe", "--group", group, "--members"), "GROUP")
        assert len(members) == 1 and members[0]["#PARTITIONS"] == "2", members
        assert members[0]["CLIENT-ID"].startswith("console-consumer"), members
        busy = run_tool("kafka-consumer-groups", "--delete", "--group", group, bootstrap=b)
        assert "GroupNotEmptyException" in busy.stdout + busy.stderr, busy.stdout + busy.stderr
        reset = run_tool(
            "kafka-consumer-groups",
            "--reset-offsets",
            "--group",
            group,
            "--topic",
            topic,
            "--to-earliest",
            "--execute",
            bootstrap=b,
        )
        assert "inactive" in reset.stdout + reset.stderr, reset.stdout + reset.stderr
    _wait_state(b, group, "Empty")

    def reset(*args: str) -> dict[int, int]:
        out = _groups(b, "--reset-offsets", "--group", group, *args)
        return {int(r["PARTITION"]): int(r["NEW-OFFSET"]) for r in parse_table(out, "GROUP")}

    assert reset("--topic", topic, "--to-earliest", "--execute") == {0: 0, 1: 0}
    assert {p: int(r["LAG"]) for p, r in offsets().items()} == end
    assert reset("--topic", f"{topic}:0", "--to-offset", "3", "--execute") == {0: 3}
    assert reset("--all-topics", "--to-latest", "--dry-run") == end
    assert int(offsets()[0]["CURRENT-OFFSET"]) == 3  # a dry run changes nothing
    assert reset("--topic", f"{topic}:0", "--shift-by", "-1", "--execute") == {0: 2}
    assert reset("--topic", topic, "--to-datetime", "2000-01-01T00:00:00.000", "--dry-run") == {
        0: 0,
        1: 0,
    }
    # the group resumes from the reset positions
    again = console_consume(b, topic, 20 - 2, group=group, from_beginning=False)
    assert len(again) == 20 - 2
    assert {p: r["LAG"] for p, r in offsets().items()} == {0: "0", 1: "0"}

    out = _groups(b, "--delete-offsets", "--group", group, "--topic", topic)
    assert f"Request succeeded for deleting offsets from group {group}." in out
    assert {(r["PARTITION"], r["STATUS"]) for r in parse_table(out, "TOPIC")} == {
        ("0", "Successful"),
        ("1", "Successful"),
    }
    out = _groups(b, "--delete", "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in out
    assert group not in _groups(b, "--list").split()
    missing = run_tool("kafka-consumer-groups", "--describe", "--group", group, bootstrap=b)
    assert f"GroupIdNotFoundException: Group {group} not found." in missing.stdout + missing.stderr
