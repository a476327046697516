"""DescribeConfigs' IncludeDocumentation (v3+) through Apache Kafka's Java AdminClient
(bench/kafka/java/ConfigDocsCheck.java, `describeConfigs` with
`DescribeConfigsOptions.includeDocumentation`), as `kafka-configs`-style tools and admin UIs
ask for it: asked, every config of a topic and of a broker has its documentation; not asked,
none has (null). Run on TidalMQ (tests/integration/compat/test_config_documentation.py, where
the text must be TidalMQ's own, from TOPIC_CONFIG_DEFS and BROKER_CONFIG_DOCS) and on Apache
Kafka 4.3.1 (tests/integration/apache_kafka/test_config_documentation.py)."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from bench.kafka.harness import JAVA_CONFIG_DOCS_SOURCE, run_java_client


def check_config_documentation(bootstrap: str, broker_id: int) -> dict[str, Any]:
    """The Java check's report ({"topic"|"broker": {"with"|"without": {name: doc}}}) after
    checking what holds on both Kafka and TidalMQ; the caller checks the text."""
    topic = f"documented-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, 1, 1, config={"retention.ms": "3600000"})
    admin.create_topics([new])[topic].result(20)
    report: dict[str, Any] = run_java_client(
        bootstrap, topic, str(broker_id), source=JAVA_CONFIG_DOCS_SOURCE, timeout=120
    )
    for kind in ("topic", "broker"):
        asked, not_asked = report[kind]["with"], report[kind]["without"]
        assert set(asked) == set(not_asked), kind  # the same configs, either way
        assert len(asked) > 10, report
        assert all(doc is None for doc in not_asked.values()), not_asked
    # every topic config is documented (Kafka documents them all), and a set one as well
    topic_docs = report["topic"]["with"]
    assert "retention.ms" in topic_docs and "message.timestamp.type" in topic_docs
    undocumented = sorted(name for name, doc in topic_docs.items() if not doc)
    assert not undocumented, f"topic configs without documentation: {undocumented}"
    for name in ("listeners", "advertised.listeners", "num.partitions"):
        assert report["broker"]["with"].get(name), f"broker config {name}: {report['broker']}"
    return report
