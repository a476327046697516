"""docs/metrics.md against what the local cluster's processes export, and the consumer lag the
group coordinators export against what Kafka's `kafka-consumer-groups --describe` reports."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from prometheus_client.parser import text_string_to_metric_families

from bench.kafka.harness import parse_table
from tests.integration.compat.conftest import name, tool
from tests.support.local_cluster import LocalClusterProcess
from tests.support.local_cluster import tidalmq as run_tidalmq

DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
# the client library's own families (and its _created series of counters and histograms)
LIBRARY = re.compile(r"^(python_|process_)|_created$")


def documented() -> dict[str, tuple[str, frozenset[str], str]]:
    """docs/metrics.md's table: name -> (type, labels, exported by)."""
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.fullmatch(r"\| `(tidalmq_\w+)` \| (\w+) \|\s*([\w, ]*?)\s*\| .* \| (\w+) \|", line)
        if m:
            labels = frozenset(x.strip() for x in m[3].split(",") if x.strip())
            assert m[1] not in rows, f"{m[1]} twice in the table"
            rows[m[1]] = (m[2], labels, m[4])
    assert len(rows) > 50, "the table was not found"
    return rows


Exported = dict[str, tuple[str, set[frozenset[str]]]]
"""family name (as documented: counters with _total) -> (type, label sets of its samples)"""


def families(text: str) -> Exported:
    out: Exported = {}
    for family in text_string_to_metric_families(text):
        if LIBRARY.search(family.name):
            continue
        # the parser strips counters' _total; the exposition (and the table) names them with it
        fname = family.name + "_total" if family.type == "counter" else family.name
        labels = {
            frozenset(s.labels) - {"le"} for s in family.samples if not s.name.endswith("_created")
        }
        out[fname] = (family.type, labels)
    return out


def scrape(cluster: LocalClusterProcess) -> dict[str, list[Exported]]:
    """Each process's families, by kind: the controller (`local up`) and every broker."""
    status = cluster.status()
    context = cluster.control_context
    out: dict[str, list[Exported]] = {"broker": [], "controller": []}
    with urllib.request.urlopen(
        status["controller"] + "/metrics", timeout=10, context=context
    ) as r:
        out["controller"].append(families(r.read().decode()))
    for row in status["brokers"]:
        url = f"http://127.0.0.1:{row['http_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            out["broker"].append(families(r.read().decode()))
    return out


def operator_families() -> Exported:
    """The operator's families, from its registry (it is not part of the local cluster)."""
    from prometheus_client import REGISTRY, generate_latest
    from tidalmq_operator import runtime

    assert runtime.DEGRADED is not None  # imported: its families are in this process's registry
    return {
        k: v
        for k, v in families(generate_latest(REGISTRY).decode()).items()
        if k.startswith("tidalmq_operator_")
    }


def produce(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, count in per_partition.items():
        for i in range(count):
            producer.produce(topic, f"v{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[KafkaTopicPartition(topic, p, o) for p, o in offsets.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()


def lag_samples(
    cluster: LocalClusterProcess, group: str
) -> dict[str, dict[tuple[str, ...], float]]:
    """The lag families' samples of `group`, from every broker (one coordinates it)."""
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for row in cluster.status()["brokers"]:
        url = f"http://127.0.0.1:{row['http_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("group") == group:
                    key = tuple(s.labels[k] for k in ("topic", "partition") if k in s.labels)
                    out.setdefault(s.name, {})[key] = s.value
    return out


def test_consumer_lag_matches_kafka_consumer_groups(tidalmq_cluster: LocalClusterProcess) -> None:
    b = tidalmq_cluster.bootstrap
    topic, group = name("lagged"), name("lag-group")
    admin = AdminClient({"bootstrap.servers": b})
    admin.create_topics([NewTopic(topic, 3)])[topic].result(30)
    produce(b, topic, {0: 12, 1: 7, 2: 3})
    commit(b, group, topic, {0: 5, 1: 7, 2: 1})  # lag 7, 0, 2

    # the coordinator sees the ends of partitions led elsewhere once the controller commits
    # their floors (every 2 s here, conftest.py): wait for the lag to settle at the produced ends
    deadline = time.monotonic() + 40
    samples: dict[str, dict[tuple[str, ...], float]] = {}
    while time.monotonic() < deadline:
        samples = lag_samples(tidalmq_cluster, group)
        if samples.get("tidalmq_consumer_group_lag_sum_records", {}).get((topic,)) == 9:
            break
        time.sleep(0.5)
    assert samples.get("tidalmq_consumer_group_lag_sum_records") == {(topic,): 9}, samples

    described = parse_table(
        tool("kafka-consumer-groups", "--describe", "--group", group, bootstrap=b), "GROUP"
    )
    kafka = {int(r["PARTITION"]): int(r["LAG"]) for r in described if r["TOPIC"] == topic}
    assert kafka == {0: 7, 1: 0, 2: 2}, described
    per_partition = samples["tidalmq_consumer_group_lag_records"]
    assert {int(p): v for (_, p), v in per_partition.items()} == kafka
    assert sum(kafka.values()) == samples["tidalmq_consumer_group_lag_sum_records"][(topic,)]

    # nobody consumes: the oldest uncommitted record gets older by a second a second
    first = lag_samples(tidalmq_cluster, group)["tidalmq_consumer_group_lag_seconds"][(topic,)]
    time.sleep(1.5)
    later = lag_samples(tidalmq_cluster, group)["tidalmq_consumer_group_lag_seconds"][(topic,)]
    assert later >= first + 1.4, (first, later)
    commit(b, group, topic, {0: 12, 2: 3})  # caught up
    caught_up = lag_samples(tidalmq_cluster, group)
    assert caught_up["tidalmq_consumer_group_lag_sum_records"] == {(topic,): 0}
    assert caught_up["tidalmq_consumer_group_lag_seconds"] == {(topic,): 0}


def lag_settles_at(
    cluster: LocalClusterProcess, group: str, topic: str, want: dict[int, int]
) -> dict[str, dict[tuple[str, ...], float]]:
    """The group's lag samples once its per-partition lag reads `want` (the ends of queues led
    elsewhere arrive with the controller's floor commits, every 2 s here)."""
    deadline = time.monotonic() + 40
    while True:
        samples = lag_samples(cluster, group)
        per_partition = samples.get("tidalmq_consumer_group_lag_records", {})
        if {int(p): v for (t, p), v in per_partition.items() if t == topic} == want:
            return samples
        assert time.monotonic() < deadline, (want, samples)
        time.sleep(0.5)


def kafka_lag(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """LAG per partition as `kafka-consumer-groups --describe` reports it."""
    described = parse_table(
        tool("kafka-consumer-groups", "--describe", "--group", group, bootstrap=bootstrap),
        "GROUP",
    )
    return {int(r["PARTITION"]): int(r["LAG"]) for r in described if r["TOPIC"] == topic}


def admin_lag(bootstrap: str, group: str, topic: str, queues: int) -> dict[int, int]:
    """Latest offsets (ListOffsets) minus the group's committed offsets (OffsetFetch), from a
    new client (one that knew the logic queues' leaders before a remap is told NOT_LEADER)."""
    tps = [KafkaTopicPartition(topic, q) for q in range(queues)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    ends = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=30)}
    finally:
        consumer.close()
    return {tp.partition: ends[tp].result(30).offset - committed[tp.partition] for tp in tps}


def test_consumer_lag_of_a_static_topic_follows_its_logic_queues_through_remaps(
    tidalmq_cluster: LocalClusterProcess,
) -> None:
    """A static topic's lag is counted in logic offsets: what Kafka's tools report, before and
    after logic queues are remapped to other brokers (strict and available switches)."""
    b = tidalmq_cluster.bootstrap
    topic, group = name("static-lagged"), name("static-lag-group")
    tidalmq_cluster.call(
        "/v1/static-topics/create", {"name": topic, "total_queues": 3}, timeout_s=120
    )
    admin = AdminClient({"bootstrap.servers": b})
    deadline = time.monotonic() + 30  # the brokers learn of the topic asynchronously
    while True:
        meta = admin.list_topics(topic, timeout=30).topics[topic]
        if meta.error is None and len(meta.partitions) == 3:
            break
        assert time.monotonic() < deadline, meta
        time.sleep(0.2)
    produce(b, topic, {0: 12, 1: 7, 2: 3})
    commit(b, group, topic, {0: 5, 1: 7, 2: 1})  # lag 7, 0, 2

    samples = lag_settles_at(tidalmq_cluster, group, topic, {0: 7, 1: 0, 2: 2})
    assert samples["tidalmq_consumer_group_lag_sum_records"] == {(topic,): 9}
    assert samples["tidalmq_consumer_group_lag_seconds"][(topic,)] >= 0
    assert kafka_lag(b, group, topic) == {0: 7, 1: 0, 2: 2}
    assert admin_lag(b, group, topic, 3) == {0: 7, 1: 0, 2: 2}

    # remap queue 0 strictly (it continues at logic offset 12) and queue 2 in the available
    # order (its new physical queue starts past a jump): each to the next broker
    queues = tidalmq_cluster.call("/v1/static-topics/describe", {"name": topic}, timeout_s=120)[
        "queues"
    ]
    brokers = sorted(int(r["broker"]) for r in tidalmq_cluster.status()["brokers"])
    moves = [
        {
            "queue": q["queue"],
            "broker": brokers[(brokers.index(q["broker"]) + 1) % 3],
            "mode": "strict" if q["queue"] == 0 else "available",
        }
        for q in queues
        if q["queue"] in (0, 2)
    ]
    tidalmq_cluster.call("/v1/static-topics/remap", {"name": topic, "moves": moves}, timeout_s=120)
    after = tidalmq_cluster.call("/v1/static-topics/describe", {"name": topic}, timeout_s=120)[
        "queues"
    ]
    assert {q["queue"]: q["gen"] for q in after} == {0: 1, 1: 0, 2: 1}, after
    produce(b, topic, {0: 4, 2: 2})  # onto the new physical queues

    # Kafka's view after the remaps (queue 2's end includes the jump), then the metrics agree
    kafka = kafka_lag(b, group, topic)
    assert kafka[0] == 7 + 4 and kafka[1] == 0 and kafka[2] >= 2 + 2, kafka
    samples = lag_settles_at(tidalmq_cluster, group, topic, kafka)
    assert samples["tidalmq_consumer_group_lag_sum_records"] == {(topic,): sum(kafka.values())}
    assert admin_lag(b, group, topic, 3) == kafka

    # commits after the remap (stored under the new physical queues) count too
    ends = {q: kafka[q] + c for q, c in {0: 5, 1: 7, 2: 1}.items()}
    commit(b, group, topic, {0: ends[0] - 1, 2: ends[2]})
    samples = lag_settles_at(tidalmq_cluster, group, topic, {0: 1, 1: 0, 2: 0})
    assert samples["tidalmq_consumer_group_lag_sum_records"] == {(topic,): 1}
    assert kafka_lag(b, group, topic) == {0: 1, 1: 0, 2: 0}


def test_metrics_table_matches_what_the_processes_export(
    tidalmq_cluster: LocalClusterProcess,
) -> None:
    b = tidalmq_cluster.bootstrap
    topic, group = name("scraped"), name("scrape-group")
    produce(b, topic, {0: 3})  # auto-created: every broker API family gets its series
    consumer = Consumer(
        {
            "bootstrap.servers": b,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        got, deadline = 0, time.monotonic() + 30
        while got < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            got += msg is not None and not msg.error()
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert got == 3

    table = documented()
    by_kind = scrape(tidalmq_cluster)
    by_kind["operator"] = [operator_families()]
    exported: set[str] = set()
    for processes in by_kind.values():
        for process in processes:
            exported |= set(process)
    assert sorted(exported - set(table)) == [], "exported, not in docs/metrics.md"
    assert sorted(set(table) - exported) == [], "in docs/metrics.md, exported by nobody"
    for metric, (kind, labels, exporter) in table.items():
        for process in by_kind[exporter]:
            assert metric in process, f"{metric}: not exported by the {exporter}"
            mtype, label_sets = process[metric]
            assert mtype == kind, f"{metric}: a {mtype}, the table says {kind}"
            for seen in label_sets:
                assert seen == labels, f"{metric}: labels {sorted(seen)}, table {sorted(labels)}"


def test_local_top_shows_traffic_and_lag(tidalmq_cluster: LocalClusterProcess) -> None:
    """`tidalmq local top --once`: the brokers' rates between two scrapes and a group's lag."""
    b = tidalmq_cluster.bootstrap
    topic, group = name("top"), name("top-group")
    produce(b, topic, {0: 20})
    commit(b, group, topic, {0: 0})  # the coordinator's first look: lag from now on
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:  # the floor of a partition led elsewhere: up to 2 s
        lag = lag_samples(tidalmq_cluster, group).get("tidalmq_consumer_group_lag_sum_records")
        if lag == {(topic,): 20}:
            break
        time.sleep(0.5)
    done = run_tidalmq(
        "local", "top", "--once", "--interval", "1", "--data-dir", str(tidalmq_cluster.data_dir)
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert [group, topic, "20"] in [r[:3] for r in rows], done.stdout
    brokers = [r for r in rows if r and r[0].isdigit() and len(r) >= 10]
    assert sorted(int(r[0]) for r in brokers) == [0, 1, 2], done.stdout
