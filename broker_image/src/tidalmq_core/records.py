"""Cluster metadata as an ordered log of small records, and the image they build.

Every change the controller decides is one or more records; a commit appends one batch of them
(everything decided in one step goes into one batch), and the controller, the brokers and the
operator all update their `ClusterMetadata` image by applying the batches in order. A record
names only what changed: moving one partition writes a record of a few dozen bytes whatever the
size of the cluster, and applying it costs O(1). A snapshot is the image at a batch number (its
`version`); a reader far behind loads one and applies the batches after it.

Records are plain JSON objects, keyed short because there are many of them (the keys are listed
below, one table per type). Applying a record is idempotent (it sets values, it never adds to
them), so a snapshot followed by batches it may already contain replays correctly.

    t="epoch"     a controller claimed the log, or      epoch (the claim's; a registration
                  (same epoch) a standby registered     or a forget repeats the current one)
                  its levels, or an id was forgotten    cid (its id) sf (the feature levels
                                                        it supports, {name: [lowest,
                                                        highest]}); both absent when
                                                        claimed by a build from before them
                                                        forget (an id no longer counted;
                                                        then no cid)
    t="cluster"   the first record of a new cluster     id
    t="broker"    a broker registered (all its fields)  id host port rack url inc state
                                                        ls (its listeners, when it has more
                                                        than one PLAINTEXT at host:port:
                                                        [[name, host, port, protocol]...])
                                                        sf (its supported feature levels,
                                                        {name: [lowest, highest]}; absent
                                                        when registered by a build from
                                                        before them)
    t="bstate"    a broker's state changed              id state (alive | draining | dead)
    t="bgone"     a broker was removed                  id
    t="topic"     a topic created or replaced whole     name id configs internal kind
                  (its partitions: replicas, and the    r (one broker per partition)
                  leader epochs when not all 0)         e (optional) parts (optional, full
                                                        partition objects when replaced)
    t="tgone"     a topic deleted (its data pending)    name
    t="grow"      partitions added to a topic           name at (the count before)
                                                        r (brokers of the new ones)
    t="configs"   a topic's config overrides            name configs
    t="p"         one partition changed                 n (topic) p (index) and the changed
                                                        fields: l leader, e epoch,
                                                        r replicas, o original, g target,
                                                        s started (ms), c created, f floor,
                                                        x lost, a accepted from
    t="floors"    acknowledged ends of many partitions  name id f ({index: floor})
    t="bconfigs"  dynamic broker configs of a scope     scope configs
    t="pids"      the next unreserved producer id       next
    t="static"    a static topic's queue mapping        name state (null: removed)
    t="deleted"   a deleted topic's data: pending/done  name id pending
    t="marker"    the store's identity marker written   value
    t="scram"     a user's SCRAM credential set         user mech (SCRAM-SHA-256|512)
                  (salted; never a password)            cred {salt stored_key server_key
                                                        iterations} (keys base64)
    t="scramgone" a user's SCRAM credential removed     user mech
    t="acl"       an ACL binding created                id (unique, never reused)
                                                        b [resource type, name, pattern
                                                        type, principal, host, operation,
                                                        permission] (Kafka's codes)
    t="aclgone"   an ACL binding deleted                id
    t="feature"   a finalized feature level set         name (transaction.version) level
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidalmq_core.acls import AclBinding
from tidalmq_core.metadata import (
    NO_LEADER,
    BrokerInfo,
    ClusterMetadata,
    DataLoss,
    Endpoint,
    PartitionState,
    TopicInfo,
    features_from_json,
    features_json,
)
from tidalmq_core.model import TopicPartition
from tidalmq_core.scram import ScramCredential
from tidalmq_core.static_mapping import StaticTopicState

Record = dict[str, Any]

# the partition fields a "p" record can carry: record key -> PartitionState attribute
PARTITION_FIELDS: dict[str, str] = {
    "l": "leader",
    "e": "leader_epoch",
    "r": "replicas",
    "o": "original_replicas",
    "g": "target_replicas",
    "s": "move_started_ms",
    "c": "created",
    "f": "end_offset_floor",
    "x": "lost",
    "a": "accepted_from",
}
_ATTRIBUTE_KEYS = {attr: key for key, attr in PARTITION_FIELDS.items()}


class RecordError(ValueError):
    """A record that does not fit the image it is applied to (a bug, or a corrupt log)."""


# ------------------------------------------------------------------------------ constructors
def epoch_record(
    epoch: int,
    controller_id: str | None = None,
    supported_features: dict[str, tuple[int, int]] | None = None,
) -> Record:
    """A controller claims the log; with its id, it registers the feature levels it supports
    (Kafka's ControllerRegistration `features`), keys older readers ignore."""
    rec: Record = {"t": "epoch", "epoch": epoch}
    if controller_id is not None:
        rec["cid"] = controller_id
        rec["sf"] = features_json(supported_features or {})
    return rec


def controller_record(
    epoch: int, controller_id: str, supported_features: dict[str, tuple[int, int]]
) -> Record:
    """A controller that is not leading (a standby) registers the feature levels it supports
    (KIP-919's ControllerRegistration): an `epoch` record repeating the current epoch, so a
    reader of any earlier build loads it (an older one sets the epoch it already has, one that
    knows `cid` registers it too; a new record type would stop both: unknown types are refused)."""
    return epoch_record(epoch, controller_id, supported_features)


def forget_controller_record(epoch: int, controller_id: str) -> Record:
    """A controller id gone for good no longer counts (`tidalmq controller forget`). The same
    `epoch` record, with `forget` and no `cid`: a build that knows `cid` but not `forget` ignores
    it and keeps counting the id (it refuses more upgrades, never fewer); older builds set the
    epoch they already have."""
    return {"t": "epoch", "epoch": epoch, "forget": controller_id}


def cluster_record(cluster_id: str) -> Record:
    return {"t": "cluster", "id": cluster_id}


def feature_record(name: str, level: int) -> Record:
    return {"t": "feature", "name": name, "level": level}


def broker_record(info: BrokerInfo) -> Record:
    rec: Record = {
        "t": "broker",
        "id": info.broker_id,
        "host": info.host,
        "port": info.port,
        "rack": info.rack,
        "url": info.control_url,
        "inc": info.incarnation,
        "state": info.state,
    }
    if info.listeners:  # absent for the one PLAINTEXT listener: the record older ones wrote
        rec["ls"] = [e.to_json() for e in info.listeners]
    if info.supported_features is not None:  # absent: a registration by an older build
        rec["sf"] = features_json(info.supported_features)
    return rec


def broker_state_record(broker_id: int, state: str) -> Record:
    return {"t": "bstate", "id": broker_id, "state": state}


def broker_removed_record(broker_id: int) -> Record:
    return {"t": "bgone", "id": broker_id}


def topic_record(topic: TopicInfo) -> Record:
    """A topic created, or replaced whole (a static topic's view and physical queues). A new
    topic's partitions are one broker each at epoch 0: only the brokers are written."""
    rec: Record = {
        "t": "topic",
        "name": topic.name,
        "id": topic.topic_id,
        "configs": dict(topic.configs),
        "internal": topic.internal,
        "kind": topic.kind,
    }
    plain = all(_is_plain_new(p) for p in topic.partitions)
    if plain:
        rec["r"] = [p.replicas[0] for p in topic.partitions]
    else:
        rec["parts"] = [p.to_json() for p in topic.partitions]
    return rec


def _is_plain_new(part: PartitionState) -> bool:
    return (
        len(part.replicas) == 1
        and part.leader == part.replicas[0]
        and part.leader_epoch == 0
        and not part.moving
        and part.move_started_ms is None
        and not part.created
        and part.end_offset_floor == 0
        and part.lost is None
        and part.accepted_from is None
    )


def topic_removed_record(name: str) -> Record:
    return {"t": "tgone", "name": name}


def partitions_added_record(name: str, brokers: Iterable[int], *, at: int) -> Record:
    """Partitions `at`, `at` + 1, ... of a topic that had `at` (applied again, it sets them
    again instead of adding more)."""
    return {"t": "grow", "name": name, "at": at, "r": list(brokers)}


def topic_configs_record(name: str, configs: Mapping[str, str]) -> Record:
    return {"t": "configs", "name": name, "configs": dict(configs)}


def partition_record(tp: TopicPartition, **changes: Any) -> Record:
    """One partition's changed fields, by PartitionState attribute name."""
    rec: Record = {"t": "p", "n": tp.topic, "p": tp.partition}
    for attr, value in changes.items():
        key = _ATTRIBUTE_KEYS.get(attr)
        if key is None:
            raise RecordError(f"no partition field {attr!r}")
        if attr == "lost" and value is not None:
            value = value.to_json()
        elif attr in ("replicas", "original_replicas", "target_replicas") and value is not None:
            value = list(value)
        rec[key] = value
    return rec


def partition_diff(tp: TopicPartition, old: PartitionState, new: PartitionState) -> Record | None:
    """The record that turns `old` into `new` (None when they are equal)."""
    changes = {
        attr: getattr(new, attr)
        for attr in _ATTRIBUTE_KEYS
        if getattr(old, attr) != getattr(new, attr)
    }
    return partition_record(tp, **changes) if changes else None


def floors_record(name: str, topic_id: str, floors: Mapping[int, int]) -> Record:
    return {
        "t": "floors",
        "name": name,
        "id": topic_id,
        "f": {str(p): f for p, f in floors.items()},
    }


def broker_configs_record(scope: str, configs: Mapping[str, str]) -> Record:
    return {"t": "bconfigs", "scope": scope, "configs": dict(configs)}


def producer_ids_record(next_id: int) -> Record:
    return {"t": "pids", "next": next_id}


def static_topic_record(name: str, state: StaticTopicState | None) -> Record:
    return {"t": "static", "name": name, "state": None if state is None else state.to_json()}


def deletion_record(name: str, topic_id: str, *, pending: bool) -> Record:
    return {"t": "deleted", "name": name, "id": topic_id, "pending": pending}


def marker_record(value: bool) -> Record:
    return {"t": "marker", "value": value}


def scram_record(user: str, mechanism: str, credential: ScramCredential) -> Record:
    return {"t": "scram", "user": user, "mech": mechanism, "cred": credential.to_json()}


def scram_removed_record(user: str, mechanism: str) -> Record:
    return {"t": "scramgone", "user": user, "mech": mechanism}


def acl_record(acl_id: str, binding: AclBinding) -> Record:
    return {"t": "acl", "id": acl_id, "b": binding.to_json()}


def acl_removed_record(acl_id: str) -> Record:
    return {"t": "aclgone", "id": acl_id}


# ------------------------------------------------------------------------------ the delta
@dataclass(slots=True)
class MetadataDelta:
    """What a run of records changed, for readers that act on changes only (a broker opens
    and closes the partitions whose leadership changed; the controller keeps its indexes)."""

    partitions: set[TopicPartition] = field(default_factory=set)
    topics: set[str] = field(default_factory=set)  # created, replaced, grown, configs changed
    removed_topics: dict[str, TopicInfo] = field(default_factory=dict)  # as they were
    brokers: set[int] = field(default_factory=set)
    static_topics: set[str] = field(default_factory=set)
    acls: bool = False  # ACL bindings created or deleted (brokers rebuild their authorizer)
    other: bool = False  # broker configs, producer ids, deletions, marker, epoch, SCRAM

    def __bool__(self) -> bool:
        return bool(
            self.partitions
            or self.topics
            or self.removed_topics
            or self.brokers
            or self.static_topics
            or self.acls
            or self.other
        )

    def merge(self, other: MetadataDelta) -> None:
        self.partitions |= other.partitions
        self.topics |= other.topics
        for name, info in other.removed_topics.items():
            self.removed_topics.setdefault(name, info)
        self.brokers |= other.brokers
        self.static_topics |= other.static_topics
        self.acls = self.acls or other.acls
        self.other = self.other or other.other

    def changed_partitions(self, meta: ClusterMetadata) -> set[TopicPartition]:
        """Every partition whose state may differ: the changed ones, every partition of the
        changed topics (as they are now) and of the removed ones (as they were)."""
        out = set(self.partitions)
        for name in self.topics:
            topic = meta.topics.get(name)
            if topic is not None:
                out.update(TopicPartition(name, i) for i in range(len(topic.partitions)))
        for name, info in self.removed_topics.items():
            out.update(TopicPartition(name, i) for i in range(len(info.partitions)))
        return out


# ------------------------------------------------------------------------------ applying
def apply_batch(
    meta: ClusterMetadata,
    records: Iterable[Record],
    version: int,
    delta: MetadataDelta | None = None,
) -> MetadataDelta:
    """Apply one committed batch in place; `meta.version` becomes the batch's number."""
    delta = MetadataDelta() if delta is None else delta
    for rec in records:
        apply_record(meta, rec, delta)
    meta.version = version
    return delta


def apply_record(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    kind = rec["t"]
    handler = _HANDLERS.get(kind)
    if handler is None:
        raise RecordError(f"unknown record type {kind!r}")
    handler(meta, rec, delta)


def _partition(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    topic = meta.topics.get(rec["n"])
    index = rec["p"]
    if topic is None or index >= len(topic.partitions):
        return  # a topic deleted later in the same replay (a snapshot that already has it)
    part = topic.partitions[index]
    for key, value in rec.items():
        attr = PARTITION_FIELDS.get(key)
        if attr is None:
            continue  # t, n, p
        if attr == "lost":
            value = None if value is None else DataLoss.from_json(value)
        elif attr in ("replicas", "original_replicas", "target_replicas") and value is not None:
            value = list(value)
        setattr(part, attr, value)
    delta.partitions.add(TopicPartition(rec["n"], index))


def _topic(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    name = rec["name"]
    if "parts" in rec:
        partitions = [PartitionState.from_json(p) for p in rec["parts"]]
    else:
        partitions = [PartitionState(b, 0, [b]) for b in rec["r"]]
    old = meta.topics.get(name)
    if old is not None and old.topic_id != rec["id"]:
        delta.removed_topics.setdefault(name, old)
    meta.topics[name] = TopicInfo(
        name=name,
        topic_id=rec["id"],
        partitions=partitions,
        configs=dict(rec.get("configs", {})),
        internal=bool(rec.get("internal", False)),
        kind=str(rec.get("kind", "normal")),
    )
    delta.topics.add(name)


def _topic_removed(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    old = meta.topics.pop(rec["name"], None)
    if old is not None:
        delta.removed_topics.setdefault(rec["name"], old)
        delta.topics.discard(rec["name"])


def _grow(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    topic = meta.topics.get(rec["name"])
    if topic is None:
        return
    added = [PartitionState(b, 0, [b]) for b in rec["r"]]
    at = rec.get("at")
    if at is None:  # written before records said where (no replay of those)
        topic.partitions.extend(added)
    elif at <= len(topic.partitions):
        # a replay: the partitions after these were added by later records, applied again next
        topic.partitions[at:] = added
    else:
        return  # a later incarnation of the topic (a replay): its own record follows
    delta.topics.add(rec["name"])


def _configs(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    topic = meta.topics.get(rec["name"])
    if topic is None:
        return
    topic.configs = dict(rec["configs"])
    delta.topics.add(rec["name"])


def _floors(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    topic = meta.topics.get(rec["name"])
    if topic is None or topic.topic_id != rec["id"]:
        return
    for index, floor in rec["f"].items():
        i = int(index)
        if i < len(topic.partitions):
            part = topic.partitions[i]
            if floor > part.end_offset_floor:
                part.end_offset_floor = floor
                delta.partitions.add(TopicPartition(rec["name"], i))


def _broker(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    meta.brokers[rec["id"]] = BrokerInfo(
        broker_id=rec["id"],
        host=rec["host"],
        port=rec["port"],
        rack=rec.get("rack"),
        control_url=rec.get("url", ""),
        incarnation=rec.get("inc", ""),
        state=rec.get("state", "alive"),
        listeners=[Endpoint.from_json(e) for e in rec.get("ls") or []],
        supported_features=features_from_json(rec.get("sf")),
    )
    delta.brokers.add(rec["id"])


def _broker_state(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    info = meta.brokers.get(rec["id"])
    if info is not None:
        info.state = rec["state"]
        delta.brokers.add(rec["id"])


def _broker_removed(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    if meta.brokers.pop(rec["id"], None) is not None:
        delta.brokers.add(rec["id"])


def _broker_configs(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    if rec["configs"]:
        meta.broker_configs[rec["scope"]] = dict(rec["configs"])
    else:
        meta.broker_configs.pop(rec["scope"], None)
    delta.other = True


def _producer_ids(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    meta.next_producer_id = max(meta.next_producer_id, int(rec["next"]))
    delta.other = True


def _static(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    if rec["state"] is None:
        meta.static_topics.pop(rec["name"], None)
    else:
        meta.static_topics[rec["name"]] = StaticTopicState.from_json(rec["state"])
    delta.static_topics.add(rec["name"])


def _deleted(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    entry = (rec["name"], rec["id"])
    if rec["pending"]:
        if entry not in meta.pending_deletions:
            meta.pending_deletions.append(entry)
    elif entry in meta.pending_deletions:
        meta.pending_deletions.remove(entry)
    delta.other = True


def _marker(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    meta.store_marker = bool(rec["value"])
    delta.other = True


def _scram(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    meta.scram_credentials.setdefault(rec["user"], {})[rec["mech"]] = ScramCredential.from_json(
        rec["cred"]
    )
    delta.other = True


def _scram_removed(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    by_mechanism = meta.scram_credentials.get(rec["user"])
    if by_mechanism is not None:
        by_mechanism.pop(rec["mech"], None)
        if not by_mechanism:
            del meta.scram_credentials[rec["user"]]
    delta.other = True


def _acl(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    meta.acls[str(rec["id"])] = AclBinding.from_json(rec["b"])
    delta.acls = True


def _acl_removed(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    meta.acls.pop(str(rec["id"]), None)
    delta.acls = True


def _epoch(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    meta.controller_epoch = max(meta.controller_epoch, int(rec["epoch"]))
    if "cid" in rec:  # its registration replaces the one it made at an earlier start
        meta.controllers[str(rec["cid"])] = features_from_json(rec.get("sf")) or {}
    elif "forget" in rec:  # gone for good: its levels no longer count
        meta.controllers.pop(str(rec["forget"]), None)
    delta.other = True


def _cluster(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    meta.cluster_id = rec["id"]
    delta.other = True


def _feature(meta: ClusterMetadata, rec: Record, delta: MetadataDelta) -> None:
    meta.features[str(rec["name"])] = int(rec["level"])
    delta.other = True


_HANDLERS = {
    "p": _partition,
    "topic": _topic,
    "tgone": _topic_removed,
    "grow": _grow,
    "configs": _configs,
    "floors": _floors,
    "broker": _broker,
    "bstate": _broker_state,
    "bgone": _broker_removed,
    "bconfigs": _broker_configs,
    "pids": _producer_ids,
    "static": _static,
    "deleted": _deleted,
    "marker": _marker,
    "scram": _scram,
    "scramgone": _scram_removed,
    "acl": _acl,
    "aclgone": _acl_removed,
    "epoch": _epoch,
    "cluster": _cluster,
    "feature": _feature,
}


def leaderless(part: PartitionState) -> bool:
    return part.leader == NO_LEADER
