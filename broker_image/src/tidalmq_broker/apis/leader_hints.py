"""KIP-951 leader discovery, shared by Produce (v10+) and Fetch (v16+): a client that sent
partitions to a broker not leading them is told, in the same answer, each one's current leader
and where that leader is, so it re-routes without first asking Metadata
(docs/architecture/produce-and-fetch.md)."""

from __future__ import annotations

from tidalmq_core.metadata import NO_LEADER, ClusterMetadata

from tidalmq_broker.protocol.fastpath import LeaderAndEpoch, NodeEndpoint


def current_leaders(
    meta: ClusterMetadata, listener: str, partitions: list[tuple[str, int]]
) -> tuple[dict[tuple[str, int], LeaderAndEpoch], list[NodeEndpoint]]:
    """KIP-951's answer to a client that sent `partitions` to a broker not leading them: each
    one's leader and leader epoch in this broker's metadata image, and where those leaders are
    on `listener` (the one the client is connected to), so it re-routes without a Metadata
    request. As Kafka (KafkaApis.getCurrentLeader): a partition without a leader, or not in the
    image, gets (-1, -1) (left out of the response); a leader that is dead or has no endpoint on
    the listener gets its id and epoch but no endpoint (the client then asks Metadata)."""
    leaders: dict[tuple[str, int], LeaderAndEpoch] = {}
    endpoints: dict[int, NodeEndpoint] = {}
    for topic_name, index in partitions:
        topic = meta.topics.get(topic_name)
        if topic is None or not 0 <= index < len(topic.partitions):
            continue
        state = topic.partitions[index]
        if state.leader == NO_LEADER:
            continue
        leaders[(topic_name, index)] = (state.leader, state.leader_epoch)
        node = meta.brokers.get(state.leader)
        if node is None or node.state == "dead" or state.leader in endpoints:
            continue
        endpoint = node.endpoint(listener)
        if endpoint is not None:
            endpoints[state.leader] = (state.leader, endpoint.host, endpoint.port, node.rack)
    return leaders, [endpoints[b] for b in sorted(endpoints)]
