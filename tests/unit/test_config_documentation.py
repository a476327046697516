"""DescribeConfigs' IncludeDocumentation (v3+, apis/configs.py): asked, each topic config has
its documentation from its row of TOPIC_CONFIG_DEFS (the CRDs' descriptions are the same
sentences), each broker config its BROKER_CONFIG_DOCS entry and each static topic's `static.*`
entry its STATIC_CONFIG_DOCS one; not asked, every documentation is null, as Kafka answers.
tests/integration/compat/test_config_documentation.py asks with the Java AdminClient."""

from __future__ import annotations

import uuid
from typing import Any

from tidalmq_broker.apis.broker_config_docs import BROKER_CONFIG_DOCS
from tidalmq_core.acls import AclOperation, ResourceType
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.static_description import STATIC_CONFIG_DOCS, static_topic_configs
from tidalmq_core.static_mapping import initial_mapping
from tidalmq_core.topics import TOPIC_CONFIG_DEFS, TOPIC_CONFIGS, documentation
from tidalmq_operator.crd_configs import description

from tests.unit.security.test_api_authorization import call
from tests.unit.test_kafka_api_gaps import CLUSTER, allow, broker

TOPIC, BROKER = 2, 4


async def _describe(b: Any, kind: int, name: str, *, documented: bool) -> dict[str, Any]:
    answer = await call(
        b,
        32,
        4,
        {
            "resources": [
                {"resource_type": kind, "resource_name": name, "configuration_keys": None}
            ],
            "include_synonyms": False,
            "include_documentation": documented,
        },
    )
    (result,) = answer["results"]
    assert result["error_code"] == 0, result
    return {c["name"]: c["documentation"] for c in result["configs"]}


async def test_topic_configs_are_documented_only_when_asked() -> None:
    b = broker(allow(ResourceType.TOPIC, "*", AclOperation.DESCRIBE_CONFIGS))
    asked = await _describe(b, TOPIC, "orders", documented=True)
    assert set(asked) == {d.name for d in TOPIC_CONFIG_DEFS if not d.internal}
    assert asked == {name: documentation(TOPIC_CONFIGS[name]) for name in asked}
    not_asked = await _describe(b, TOPIC, "orders", documented=False)
    assert set(not_asked) == set(asked) and set(not_asked.values()) == {None}


async def test_broker_configs_are_documented_only_when_asked() -> None:
    b = broker(allow(ResourceType.CLUSTER, CLUSTER, AclOperation.DESCRIBE_CONFIGS))
    asked = await _describe(b, BROKER, "0", documented=True)
    # every config a broker describes has its documentation: a new one needs an entry
    assert sorted(n for n, doc in asked.items() if not doc) == []
    assert asked == {name: BROKER_CONFIG_DOCS[name] for name in asked}
    assert set(asked) == set(BROKER_CONFIG_DOCS)  # no entry for a config never described
    not_asked = await _describe(b, BROKER, "0", documented=False)
    assert set(not_asked) == set(asked) and set(not_asked.values()) == {None}


def test_every_topic_config_has_documentation_that_says_what_tidalmq_narrows() -> None:
    for d in TOPIC_CONFIG_DEFS:
        assert d.doc.strip(), d.name
        text = documentation(d)
        assert text.startswith(d.doc)
        if d.only:  # what TidalMQ takes, and why, as in its refusal
            assert f"TidalMQ takes only {', '.join(d.only)}: {d.why}." in text, d.name
        # the CRDs' description: the same sentences, with Kafka's type between them
        assert description(d).startswith(d.doc) and description(d).endswith(text[len(d.doc) :])
    static = documentation(TOPIC_CONFIGS["cleanup.policy"], static=True)
    assert static.endswith("A static topic takes only delete.")


def test_a_static_topics_entries_are_documented_when_asked() -> None:
    meta = ClusterMetadata("c", version=1)
    placement = [0, 1]
    meta.static_topics["events"] = initial_mapping(
        "events", 2, placement, brokers=None, now_ms=1, copy_brokers=placement
    )
    topic = TopicInfo(
        "events",
        str(uuid.uuid4()),
        [PartitionState(b, 0, [b]) for b in placement],
        {},
        kind="static",
    )
    meta.topics["events"] = topic
    keys = {*STATIC_CONFIG_DOCS}  # static.mapping is listed only when asked for by name
    asked = static_topic_configs(meta, topic, keys, include_documentation=True)
    assert {e["name"]: e["documentation"] for e in asked} == STATIC_CONFIG_DOCS
    not_asked = static_topic_configs(meta, topic, keys)
    assert {e["documentation"] for e in not_asked} == {None}
