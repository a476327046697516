"""DescribeConfigs' IncludeDocumentation (v3+, apis/configs.py): asked, each topic config has
its documentation from its row of TOPIC_CONFIG_DEFS (the CRDs' descriptions are the same
sentences), each broker config its BROKER_CONFIG_DOCS entry and each static topic's `static.*`
entry its STATIC_CONFIG_DOCS one; not asked, every documentation is null, as Kafka answers.
tests/integration/compat/test_config_documentation.py asks with the Java AdminClient."""

from __future__ import annotations

import re
import uuid
from typing import Any

from tidalmq_broker.apis.broker_config_docs import BROKER_CONFIG_DOCS
from tidalmq_broker.apis.configs import FIXED_BROKER_CONFIGS
from tidalmq_broker.settings import BrokerSettings
from tidalmq_core.acls import AclOperation, ResourceType
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.static_description import STATIC_CONFIG_DOCS, static_topic_configs
from tidalmq_core.static_mapping import initial_mapping
from tidalmq_core.topics import (
    DYNAMIC_BROKER_CONFIG_DEFAULTS,
    TOPIC_CONFIG_DEFAULTS,
    TOPIC_CONFIG_DEFS,
    TOPIC_CONFIGS,
    documentation,
)
from tidalmq_operator.crd_configs import description

from tests.unit.security.test_api_authorization import call
from tests.unit.test_kafka_api_gaps import CLUSTER, allow, broker

TOPIC, BROKER = 2, 4


async def _configs(b: Any, kind: int, name: str, *, documented: bool) -> list[dict[str, Any]]:
    """The configs DescribeConfigs v4 returns for one resource (without synonyms)."""
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
    configs: list[dict[str, Any]] = result["configs"]
    return configs


async def _describe(b: Any, kind: int, name: str, *, documented: bool) -> dict[str, Any]:
    return {
        c["name"]: c["documentation"] for c in await _configs(b, kind, name, documented=documented)
    }


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


# A default is stated only as "Default: <value>" (broker_config_docs.py): the value ends at a
# blank, or at a closing mark before one ("Default: 5.0." is 5.0)
_STATED_DEFAULT = re.compile(r"Default: (\S+?)[.,;)]?(?=\s|$)")
# "default" in any other form would state a default this test cannot check; a config name
# ("default.replication.factor") is not one
_OTHER_DEFAULT = re.compile(r"(?i)\bdefault(?!: |\.[a-z])")


async def _described(b: Any, kind: int, name: str) -> dict[str, tuple[str | None, str]]:
    """{config: (value, documentation)} as a fresh broker describes `name`."""
    return {
        c["name"]: (c["value"], c["documentation"])
        for c in await _configs(b, kind, name, documented=True)
    }


def _stated_defaults(docs: dict[str, str]) -> dict[str, str]:
    out = {}
    for name, text in docs.items():
        assert not _OTHER_DEFAULT.search(text.replace("Default: ", "")), (name, text)
        stated = _STATED_DEFAULT.findall(text)
        assert len(stated) <= 1, (name, text)
        if stated:
            out[name] = stated[0]
    return out


async def test_a_default_the_documentation_states_is_the_one_a_fresh_broker_describes() -> None:
    """Every "Default: X" of a topic or broker config's documentation is the value DescribeConfigs
    returns on a fresh broker with no overrides (its source DEFAULT_CONFIG for a topic, the
    broker's default settings for a broker), and the definition's default: a default that
    drifts from its documentation fails here."""
    b = broker(
        allow(ResourceType.TOPIC, "*", AclOperation.DESCRIBE_CONFIGS),
        allow(ResourceType.CLUSTER, CLUSTER, AclOperation.DESCRIBE_CONFIGS),
    )
    topic = await _described(b, TOPIC, "orders")
    topic_docs = {d.name: documentation(d) for d in TOPIC_CONFIG_DEFS}
    stated = _stated_defaults(topic_docs)
    assert stated, "no topic config states its default: the check checks nothing"
    for name, default in stated.items():
        assert topic[name][0] == default == TOPIC_CONFIG_DEFAULTS[name], name
    # the broker's: described with BrokerSettings' defaults, the fixed and dynamic ones' own
    fresh = broker(
        allow(ResourceType.CLUSTER, CLUSTER, AclOperation.DESCRIBE_CONFIGS),
        settings=BrokerSettings(),
    )
    described = await _described(fresh, BROKER, "0")
    definitions = {
        **BrokerSettings().described(),
        **FIXED_BROKER_CONFIGS,
        **DYNAMIC_BROKER_CONFIG_DEFAULTS,
    }
    stated = _stated_defaults(BROKER_CONFIG_DOCS)
    assert len(stated) >= 5, stated
    for name, default in stated.items():
        assert described[name] == (default, BROKER_CONFIG_DOCS[name]), name
        assert definitions[name] == default, name


def _unit_named(name: str) -> str | None:
    if name.endswith(".ms"):
        return "millisecond"
    if name.endswith(".bytes.per.second"):
        return "bytes per second"
    if name.endswith(".bytes"):
        return "bytes"
    return None


def test_a_config_named_in_a_unit_documents_that_unit() -> None:
    """`*.ms` says milliseconds, `*.bytes` bytes: a reader of `kafka-configs --describe --all`
    is not left to guess (nor told seconds)."""
    docs = {
        **{d.name: documentation(d) for d in TOPIC_CONFIG_DEFS},
        **BROKER_CONFIG_DOCS,
    }
    missing = sorted(
        name
        for name, text in docs.items()
        if (unit := _unit_named(name)) is not None and unit not in text
    )
    assert missing == []
    for name, text in docs.items():
        rest = text.replace("milliseconds", "").replace("bytes per second", "")
        assert "second" not in rest, (name, text)


def test_a_config_tidalmq_takes_and_ignores_says_so() -> None:
    """The configs TidalMQ accepts for Kafka's sake but does not act on (docs/topic-configs.md,
    "Honoured, narrowed, ignored") say so plainly, and only they do."""
    ignored_topic = {
        "segment.index.bytes",
        "flush.messages",
        "flush.ms",
        "index.interval.bytes",
        "file.delete.delay.ms",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "preallocate",
        "local.retention.ms",
        "local.retention.bytes",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
    }
    recorded = {"leader.replication.throttled.replicas", "follower.replication.throttled.replicas"}
    for d in TOPIC_CONFIG_DEFS:
        text = documentation(d)
        assert ("Taken, no effect:" in text) == (d.name in ignored_topic), (d.name, text)
        assert ("limit nothing" in text) == (d.name in recorded), (d.name, text)
    recorded_broker = {
        "leader.replication.throttled.rate",
        "follower.replication.throttled.rate",
        "replica.alter.log.dirs.io.max.bytes.per.second",
    }
    for name, text in BROKER_CONFIG_DOCS.items():
        assert ("limits nothing" in text) == (name in recorded_broker), (name, text)
