"""Transaction version 2 (KIP-890 part 2) with Kafka 4.3.1's Java transactional producer, against
one broker at `transaction.version` 1 (the default) and one at 2 (docs/transactions-v2.md).

The producer (bench/kafka/java/TransactionsCheck.java) commits and aborts transactions over
every partition of a topic with sendOffsetsToTransaction; it runs TV2 only if the cluster
finalizes it. Then, on both levels: a read_committed consumer sees every committed record
once, in order, and no aborted one, and the group's offset is the last committed
transaction's. What tells the levels apart, from the broker's side: at level 2 the partitions
joined the transactions by the implicit add (Produce v12 / TxnOffsetCommit v5: the "add"
questions of `tidalmq_transaction_partition_checks_total`) and the coordinator bumped the
producer epoch at every commit and abort (kafka-transactions describe); at level 1 the
partitions were only verified (AddPartitionsToTxn / AddOffsetsToTxn) and the epoch stayed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from bench.kafka.harness import HERE, run_java_client
from tests.integration.compat.conftest import create_topic, name, tool
from tests.support.broker_process import BrokerProcess
from tests.support.txn_checker import java_transactions_problems

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TRANSACTIONS = 9  # 2, 5 and 8 are aborted
PARTITIONS = 2
CHECKS = re.compile(r'^tidalmq_transaction_partition_checks_total\{[^}]*kind="(\w+)"[^}]*\} (\S+)$')


@pytest.fixture(
    scope="module", params=[1, 2], ids=["transaction.version=1", "transaction.version=2"]
)
def broker(
    request: pytest.FixtureRequest,
    s3_server: Any,
    apache_kafka_dist: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[int, BrokerProcess]]:
    level: int = request.param
    proc = BrokerProcess(
        s3_server.url(prefix=s3_server.unique_prefix(f"tv{level}")),
        tmp_path_factory.mktemp(f"tv{level}"),
        env={
            **s3_server.env(),
            "TIDALMQ_TRANSACTION_VERSION": str(level),
            "TIDALMQ_TRANSACTION_STATE_PARTITIONS": "2",
        },
    )
    proc.start(timeout_s=120)
    try:
        yield level, proc
    finally:
        if proc.stop() not in (0, None):
            print(proc.tail_log())


def partition_checks(broker: BrokerProcess) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in broker.metrics().splitlines():
        m = CHECKS.match(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def test_java_transactions_commit_and_abort_at_each_level(
    broker: tuple[int, BrokerProcess],
) -> None:
    level, proc = broker
    b = proc.bootstrap
    topic, tid, group = name("tv"), name("tv-tx"), name("tv-group")
    create_topic(b, topic, partitions=PARTITIONS)
    before = partition_checks(proc)

    report = run_java_client(
        b,
        topic,
        tid,
        str(TRANSACTIONS),
        group,
        source=HERE / "java" / "TransactionsCheck.java",
        timeout=120,
    )

    # every committed record once and in order, nothing aborted, transaction 7's offset (the
    # same judgement against Apache Kafka: tests/integration/apache_kafka/test_transactions.py)
    assert not java_transactions_problems(report, TRANSACTIONS, PARTITIONS), report

    after = partition_checks(proc)
    adds = after.get("add", 0.0) - before.get("add", 0.0)
    verifies = after.get("verify", 0.0) - before.get("verify", 0.0)
    described = tool("kafka-transactions", "describe", "--transactional-id", tid, bootstrap=b)
    header, row = (
        [cell.strip() for cell in line.split("\t")] for line in described.splitlines()[:2]
    )
    epoch = int(dict(zip(header, row, strict=False))["ProducerEpoch"])
    if level == 2:
        # every partition of every transaction, and the group's offsets partition, were added
        # by the client's Produce v12 / TxnOffsetCommit v5; nothing was only verified
        assert adds >= TRANSACTIONS * (PARTITIONS + 1), (before, after)
        assert verifies == 0, (before, after)
        # the epoch was bumped at each commit and abort (InitProducerId gave epoch 0)
        assert epoch == TRANSACTIONS, described
    else:
        assert adds == 0, (before, after)
        assert verifies >= TRANSACTIONS * (PARTITIONS + 1), (before, after)
        assert epoch == 0, described
