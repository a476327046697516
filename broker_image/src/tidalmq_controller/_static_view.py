"""A static topic's Kafka view and placement, derived from the cluster metadata (pure functions).

Owns: `sync_view` (the Kafka view `T`: partition q led by the broker of logic queue q's writable
physical queue, or by none while it switches), `view_drifted` (the view no longer matches the
physical queues), which brokers may take logic queues (`placeable_brokers`) or keep a copy of the
mapping (`copy_brokers`), and appending a physical queue (`new_physical_queue`).

Must not touch: anything but the metadata it is given (no I/O, no controller, no tasks): the
manager (_static_topics.py) calls these inside the mutations it commits.
"""

from __future__ import annotations

from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.static_mapping import StaticTopicState, physical_topic_name


def placeable_brokers(meta: ClusterMetadata, st: StaticTopicState) -> list[int]:
    alive = [b for b, info in meta.brokers.items() if info.state == "alive"]
    allowed = alive if st.brokers is None else [b for b in st.brokers if b in alive]
    return sorted(allowed)


def copy_brokers(meta: ClusterMetadata, st: StaticTopicState) -> list[int]:
    """Brokers that keep a copy even when they host nothing (the epoch check sees them)."""
    if st.brokers is not None:
        return sorted(st.brokers)
    return sorted(b for b, info in meta.brokers.items() if info.state != "dead")


def new_physical_queue(phys: TopicInfo, broker: int) -> int:
    phys.partitions.append(PartitionState(broker, 0, [broker]))
    return len(phys.partitions) - 1


def sync_view(meta: ClusterMetadata, name: str) -> None:
    """Derive the Kafka view of static topic `name` (partition q led by the broker of its
    writable physical queue, or by none while it switches) from the mapping and the
    physical topic. A leader change bumps the partition's leader epoch."""
    st = meta.static_topics[name]
    topic = meta.topics[name]
    phys = meta.topics[physical_topic_name(name)]
    view = st.view()
    while len(topic.partitions) < st.total_queues:
        topic.partitions.append(PartitionState(NO_LEADER, 0, []))
    for q in range(st.total_queues):
        part = topic.partitions[q]
        last = view.leader(q)
        leader = NO_LEADER
        writable = last is not None and not last.sealed and last.queue < len(phys.partitions)
        if writable and phys.partitions[last.queue].leader == last.broker:  # type: ignore[union-attr]
            leader = last.broker  # type: ignore[union-attr]
        if leader != part.leader:
            part.leader = leader
            part.leader_epoch += 1
        if last is not None:
            part.replicas = [last.broker]


def view_drifted(meta: ClusterMetadata, name: str) -> bool:
    """The Kafka view no longer matches the physical queues (the controller re-elected a
    restarted broker's physical queue): re-derive it."""
    probe = ClusterMetadata(meta.cluster_id)
    for key in (name, physical_topic_name(name)):
        if key not in meta.topics:
            return False
        probe.topics[key] = TopicInfo.from_json(meta.topics[key].to_json())
    probe.static_topics[name] = meta.static_topics[name]
    sync_view(probe, name)
    before = [(p.leader, p.replicas) for p in meta.topics[name].partitions]
    return before != [(p.leader, p.replicas) for p in probe.topics[name].partitions]
