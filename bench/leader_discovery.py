"""What KIP-951 leader hints do to a move's gap for Kafka's Java producer (4.3.1).

A two-broker local cluster, one partition moved back and forth; Kafka's Java producer
(`bench/kafka/java/LeaderDiscoveryCheck.java`, default settings) in one of two patterns:

- `idle`: the producer is idle during each move, then sends one record: how long its
  acknowledgement takes (its metadata is from before the move, so it goes to the old leader,
  whose NOT_LEADER_OR_FOLLOWER names the new one), and how many Metadata requests the brokers
  got meanwhile;
- `stream`: the producer sends one record at a time throughout each move: the slowest
  acknowledgement is the gap the move left in its stream.

    .venv/bin/python -m bench.leader_discovery --pattern stream --moves 8
    .venv/bin/python -m bench.leader_discovery --client confluent --moves 8
    .venv/bin/python -m bench.leader_discovery --moves 8 --handover-wait-ms 0   # no holds

Prints one line per move and a summary; also the Java producer's errors by code (what it was
answered while the partition moved). Measured figures and what they mean: docs/performance.md,
"Leader hints (KIP-951) and a move's gap".
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.kafka.harness import java_client_command
from tests.support.local_cluster import LocalClusterProcess

TOPIC = "orders"
CHECK = Path(__file__).parent / "kafka" / "java" / "LeaderDiscoveryCheck.java"


def metadata_requests(cluster: LocalClusterProcess) -> float:
    """Metadata requests the cluster's brokers answered so far (tidalmq_requests_total)."""
    return cluster.metric_totals("tidalmq_requests_total", "api")["Metadata"]


def handover_holds(cluster: LocalClusterProcess) -> dict[str, float]:
    """Partitions of produce requests held through a handover, by outcome, on all brokers
    (tidalmq_produce_handover_holds_total)."""
    held = cluster.metric_totals("tidalmq_produce_handover_holds_total", "outcome")
    return {k: v for k, v in held.items() if v}


def ask(java: subprocess.Popen[str], command: str) -> dict[str, Any]:
    assert java.stdin is not None and java.stdout is not None
    java.stdin.write(command + "\n")
    java.stdin.flush()
    answer: dict[str, Any] = json.loads(java.stdout.readline())
    return answer


def librdkafka_stream(cluster: LocalClusterProcess, moves: int) -> None:
    """`--pattern stream` with librdkafka: a record every ~2 ms through each move; the slowest
    produce-to-acknowledgement of the records sent during the move is its gap."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    cluster.wait_settled()
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    waits: list[tuple[float, float]] = []  # (sent, acknowledged), monotonic
    errors: Counter[str] = Counter()
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            sent = time.monotonic()

            def acked(err: Any, _msg: Any, sent: float = sent) -> None:
                if err is not None:
                    errors[err.name()] += 1
                else:
                    waits.append((sent, time.monotonic()))

            producer.produce(TOPIC, value=b"x" * 100, partition=0, on_delivery=acked)
            producer.poll(0.002)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    gaps: list[float] = []
    try:
        time.sleep(1.0)
        for i in range(moves):
            source = cluster.leaders(TOPIC)[0]
            target = 1 - source
            started = time.monotonic()
            cluster.reassign({(TOPIC, 0): target})
            cluster.wait_settled()
            time.sleep(0.5)
            during = [acked - sent for sent, acked in list(waits) if sent >= started - 0.2]
            gaps.append(max(during) * 1000)
            print(f"move {i}: {source}->{target}: slowest acknowledgement {gaps[-1]:.0f} ms")
    finally:
        stop.set()
        writer.join(10)
        producer.flush(30)
    print(f"median {statistics.median(gaps):.1f} ms, worst {max(gaps):.1f} ms")
    print("delivery errors:", dict(errors) or "none")
    print("the brokers held through handovers:", handover_holds(cluster) or "nothing")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pattern", choices=["idle", "stream"], default="stream")
    parser.add_argument("--moves", type=int, default=8)
    parser.add_argument(
        "--client",
        choices=["java", "confluent"],
        default="java",
        help="java: Kafka's Java producer; confluent: librdkafka (confluent-kafka, "
        "idempotent, acks=all, linger.ms 5, a record every 2 ms; --pattern stream only)",
    )
    parser.add_argument(
        "--handover-wait-ms",
        type=float,
        default=None,
        help="the brokers' produce_handover_wait_ms (0: a partition in a handover is answered "
        "with its error at once, as before handover.py; default: the broker's default)",
    )
    args = parser.parse_args()
    env = {}
    if args.handover_wait_ms is not None:
        env["TIDALMQ_PRODUCE_HANDOVER_WAIT_MS"] = str(args.handover_wait_ms)
    with tempfile.TemporaryDirectory(prefix="leader-discovery-") as tmp:
        cluster = LocalClusterProcess(Path(tmp) / "cluster", brokers=2, env=env)
        cluster.start()
        if args.client == "confluent":
            try:
                librdkafka_stream(cluster, args.moves)
            finally:
                cluster.stop()
            return
        errors = Path(tmp) / "java.err"
        try:
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
            cluster.wait_settled()
            with errors.open("w") as err:
                java = subprocess.Popen(
                    java_client_command(cluster.bootstrap, TOPIC, source=CHECK),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            assert java.stdout is not None and java.stdout.readline().strip() == "ready"
            ask(java, "flood 1000")  # warm: the JIT, the connections
            gaps: list[float] = []
            for i in range(args.moves):
                source = cluster.leaders(TOPIC)[0]
                target = 1 - source
                if args.pattern == "idle":
                    cluster.reassign({(TOPIC, 0): target})
                    cluster.wait_settled()
                    time.sleep(1.0)  # the old leader's image names the new one
                    before = metadata_requests(cluster)
                    gaps.append(ask(java, "send")["micros"] / 1000)
                    time.sleep(0.3)
                    asked = metadata_requests(cluster) - before
                    print(
                        f"move {i}: {source}->{target}: first record acknowledged in "
                        f"{gaps[-1]:.1f} ms; Metadata requests meanwhile: {asked:.0f}"
                    )
                else:
                    assert java.stdin is not None and java.stdout is not None
                    held = handover_holds(cluster)
                    java.stdin.write("flood 2500\n")
                    java.stdin.flush()
                    time.sleep(0.5)
                    cluster.reassign({(TOPIC, 0): target})
                    answer = json.loads(java.stdout.readline())
                    cluster.wait_settled()
                    gaps.append(answer["slowest_micros"] / 1000)
                    after = handover_holds(cluster)
                    print(
                        f"move {i}: {source}->{target}: slowest acknowledgement "
                        f"{gaps[-1]:.0f} ms ({answer['records']} records); held: "
                        f"{ {k: v - held.get(k, 0) for k, v in after.items() if v > held.get(k, 0)} }"
                    )
            assert java.stdin is not None
            java.stdin.close()
            java.wait(30)
            print(f"median {statistics.median(gaps):.1f} ms, worst {max(gaps):.1f} ms")
            answered = Counter(re.findall(r"Error: ([A-Z_]+)", errors.read_text()))
            print("the producer was answered:", dict(answered) or "no errors")
            print("the brokers held through handovers:", handover_holds(cluster) or "nothing")
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
