"""What a static topic looks like, from a metadata snapshot (controller, brokers, operator, CLI).

`describe` is the one shape everyone shows: per logic queue its current broker, Kafka leader,
gen, item count and where its leader item starts, the mapping items, each copy's epoch, and what
the epoch check says. Brokers also expose it through DescribeConfigs as read-only `static.*`
entries of the topic, so `tidalmq static-topic describe --bootstrap-server` (and Kafka's own
`kafka-configs --describe`) reach it through the Kafka protocol alone.
"""

from __future__ import annotations

import json
from typing import Any

from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, TopicInfo

STATIC_CONFIG_PREFIX = "static."
MAPPING_KEY = "static.mapping"  # the whole description as JSON: only when asked for by name
# what DescribeConfigs returns as each entry's documentation when asked (IncludeDocumentation)
STATIC_CONFIG_DOCS = {
    "static.total.queues": "Number of logic queues of the static topic. Read-only.",
    "static.epoch": "Epoch of the static topic's mapping of logic queues to brokers. Read-only.",
    "static.consistent": "Whether the brokers' copies of the mapping agree with it (the epoch "
    "check). Read-only.",
    "static.queues": "Each logic queue as queue:broker/gen<generation>/<mapping items>: the "
    "broker holding it now, its generation and how many mapping items it has. Read-only.",
    MAPPING_KEY: "The whole description of the static topic as JSON (its queues, mapping items "
    "and each broker's copy); listed only when asked for by name. Read-only.",
}


def describe(meta: ClusterMetadata, name: str) -> dict[str, Any]:
    st = meta.static_topics[name]
    view = st.view()
    topic = meta.topics.get(name)
    queues = []
    for q in range(st.total_queues):
        items = view.items(q)
        last = items[-1] if items else None
        part = topic.partitions[q] if topic is not None and q < len(topic.partitions) else None
        queues.append(
            {
                "queue": q,
                "broker": last.broker if last else NO_LEADER,
                "leader": part.leader if part else NO_LEADER,
                "gen": last.gen if last else 0,
                "items": len(items),
                "logicOffset": last.logic_offset if last else -1,
                "physicalQueue": last.queue if last else -1,
            }
        )
    return {
        "name": name,
        "totalQueues": st.total_queues,
        "epoch": view.epoch,
        "brokers": st.brokers,
        "consistent": view.consistent,
        "problems": view.problems,
        "ignored": view.ignored,
        "queues": queues,
        "mapping": {str(q): [i.to_json() for i in items] for q, items in view.queues.items()},
        "copies": {
            str(b): {"bname": c.bname, "epoch": c.epoch, "hostedQueues": sorted(c.hosted)}
            for b, c in sorted(st.copies.items())
        },
        "jump": st.jump,
    }


def static_topic_configs(
    meta: ClusterMetadata,
    topic: TopicInfo,
    keys: set[str] | None,
    *,
    include_documentation: bool = False,
) -> list[dict[str, Any]]:
    """DescribeConfigs entries (read-only) of a static topic; none for other topics. Each with
    its documentation when `include_documentation`, null otherwise."""
    if topic.kind != "static" or topic.name not in meta.static_topics:
        return []
    d = describe(meta, topic.name)
    values = {
        "static.total.queues": str(d["totalQueues"]),
        "static.epoch": str(d["epoch"]),
        "static.consistent": "true" if d["consistent"] else "false",
        "static.queues": ",".join(
            f"{q['queue']}:{q['broker']}/gen{q['gen']}/{q['items']}" for q in d["queues"]
        ),
    }
    if keys is not None and MAPPING_KEY in keys:
        values[MAPPING_KEY] = json.dumps(d, separators=(",", ":"))
    return [
        {
            "name": k,
            "value": v,
            "read_only": True,
            "is_default": False,
            "config_source": 5,
            "is_sensitive": False,
            "synonyms": [],
            "config_type": 2,
            "documentation": STATIC_CONFIG_DOCS[k] if include_documentation else None,
        }
        for k, v in values.items()
        if keys is None or k in keys
    ]
