"""Cluster metadata: brokers, topics, partition leadership and epochs, reassignments in flight.

The controller is its single writer; brokers receive immutable snapshots of it. Everything here
is plain data with a JSON form (the local store keeps it in object storage, the operator keeps it
in custom resources), so any component can read it without I/O of its own.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tidalmq_core.acls import AclBinding, acls_from, acls_json
from tidalmq_core.model import IndexedDict, TopicPartition
from tidalmq_core.scram import ScramCredential
from tidalmq_core.static_mapping import StaticTopicState
from tidalmq_core.topics import (
    CLUSTER_DEFAULT,
    TOPIC_CONFIG_DEFAULTS,
    ProduceRules,
    cleanup_policy,
)

NO_LEADER = -1
OFFSETS_TOPIC = "__consumer_offsets"
# the transaction coordinators' state (transactions/): created by the controller on the first
# transactional request, as Kafka does, with transaction.state.log.num.partitions partitions
TXN_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TXN_STATE_TOPIC})

READ_ONLY_TOPIC_CONFIGS = frozenset({"min.insync.replicas"})

# Configs fixed for the internal topics, whatever their metadata says (older clusters created them
# with no configs, so this is applied when configs are read, not when the topic is created). Their
# logs are compacted by the log cleaner (docs/compaction.md), with Kafka's 100 MiB segments
# (offsets.topic.segment.bytes, transaction.state.log.segment.bytes); time or size retention
# would delete the offsets and metadata of any group idle for longer.
_INTERNAL_CONFIGS = {
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "segment.bytes": str(100 * 1024 * 1024),
}
FIXED_TOPIC_CONFIGS: dict[str, dict[str, str]] = {
    OFFSETS_TOPIC: dict(_INTERNAL_CONFIGS),
    TXN_STATE_TOPIC: dict(_INTERNAL_CONFIGS),
}


def new_cluster_id() -> str:
    """A Kafka-style cluster id: a random UUID in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


PLAINTEXT = "PLAINTEXT"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One advertised listener of a broker: where clients of that listener connect."""

    name: str  # the listener name (Kafka's listener.name), e.g. PLAINTEXT, SASL_SSL, INTERNAL
    host: str
    port: int
    security_protocol: str = PLAINTEXT  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL

    def to_json(self) -> list[Any]:
        return [self.name, self.host, self.port, self.security_protocol]

    @classmethod
    def from_json(cls, data: list[Any] | dict[str, Any]) -> Endpoint:
        if isinstance(data, dict):
            return cls(
                str(data["name"]),
                str(data["host"]),
                int(data["port"]),
                str(data.get("security_protocol", PLAINTEXT)),
            )
        name, host, port, protocol = data
        return cls(str(name), str(host), int(port), str(protocol))


@dataclass(slots=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int
    rack: str | None = None
    control_url: str = ""  # where the controller sends open/close commands (HTTP)
    incarnation: str = ""
    state: str = "alive"  # alive | draining | dead
    # Every advertised listener, when the broker has more than the one PLAINTEXT listener at
    # host:port (empty: exactly that one; what brokers and documents older than listeners
    # mean). host:port is the first listener's endpoint either way.
    listeners: list[Endpoint] = field(default_factory=list)
    # The feature levels the broker's code serves (name -> (lowest, highest) level, its
    # SUPPORTED_FEATURES), sent at registration as Kafka's BrokerRegistration `features`
    # (KIP-584). None: registered by a build from before brokers sent them (records and
    # snapshots without the field); what that means is `supported_range`. Not in `to_json`
    # (a reader older than the field builds BrokerInfo from every key it finds): the snapshot
    # keeps it beside the brokers (ClusterMetadata's "broker_features").
    supported_features: dict[str, tuple[int, int]] | None = None

    def supported_range(self, name: str, finalized: int) -> tuple[int, int]:
        """The levels of feature `name` this broker serves, for the controller's checks
        (docs/transactions-v2.md, "Which levels the brokers support"). A feature the broker
        does not list: level 0 only, as Kafka. A registration without any list (a build from
        before the list): 0-1, which every TidalMQ build serves (0 and 1 behave alike, and a
        build from before the feature behaves as 1), widened to the level finalized now,
        which the broker is serving since it is registered: such a registration never blocks
        the current level, and blocks any level above 1 that is not already current."""
        if self.supported_features is None:
            return 0, max(1, finalized)
        return self.supported_features.get(name, (0, 0))

    def endpoints(self) -> list[Endpoint]:
        return list(self.listeners) or [Endpoint(PLAINTEXT, self.host, self.port, PLAINTEXT)]

    def endpoint(self, listener: str) -> Endpoint | None:
        """This broker's endpoint of the listener named `listener` (None: it has none)."""
        for endpoint in self.endpoints():
            if endpoint.name == listener:
                return endpoint
        return None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("supported_features")  # ClusterMetadata keeps it (older readers)
        # left out when empty: a document without listeners stays readable by older readers
        out.pop("listeners")
        if self.listeners:
            out["listeners"] = [e.to_json() for e in self.listeners]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BrokerInfo:
        fields = dict(data)
        listeners = [Endpoint.from_json(e) for e in fields.pop("listeners", None) or []]
        supported = features_from_json(fields.pop("supported_features", None))
        return cls(**fields, listeners=listeners, supported_features=supported)

    @staticmethod
    def normal_listeners(host: str, port: int, endpoints: list[Endpoint]) -> list[Endpoint]:
        """`endpoints` as BrokerInfo.listeners: empty when they are the one PLAINTEXT
        listener at host:port (documents stay as they were before listeners)."""
        if endpoints == [Endpoint(PLAINTEXT, host, port, PLAINTEXT)]:
            return []
        return list(endpoints)


def features_json(features: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
    """Supported feature ranges as JSON: name -> [lowest, highest]."""
    return {name: [low, high] for name, (low, high) in sorted(features.items())}


def features_from_json(doc: dict[str, Any] | None) -> dict[str, tuple[int, int]] | None:
    if doc is None:
        return None
    return {str(name): (int(r[0]), int(r[1])) for name, r in doc.items()}


def brokers_features_json(brokers: dict[int, BrokerInfo]) -> dict[str, dict[str, list[int]]]:
    """The brokers' supported feature ranges, as a snapshot keeps them: beside the brokers
    rather than in them (a reader older than them builds BrokerInfo from every key it finds,
    and would fail on a new one), only those of brokers that sent them."""
    return {
        str(k): features_json(v.supported_features)
        for k, v in sorted(brokers.items())
        if v.supported_features is not None
    }


def controllers_features_json(
    controllers: dict[str, dict[str, tuple[int, int]]],
) -> dict[str, dict[str, list[int]]]:
    """The controllers' supported feature ranges (`ClusterMetadata.controllers`) as JSON."""
    return {cid: features_json(ranges) for cid, ranges in sorted(controllers.items())}


def controllers_features_from_json(
    doc: dict[str, Any] | None,
) -> dict[str, dict[str, tuple[int, int]]]:
    return {str(cid): features_from_json(v) or {} for cid, v in (doc or {}).items()}


def load_brokers_features(brokers: dict[int, BrokerInfo], doc: dict[str, Any] | None) -> None:
    """Put back what `brokers_features_json` wrote (absent in older snapshots: every broker
    then has None, registered by a build from before the field)."""
    for k, v in (doc or {}).items():
        info = brokers.get(int(k))
        if info is not None:
            info.supported_features = features_from_json(v)


@dataclass(frozen=True, slots=True)
class DataLoss:
    """A broker found a partition's data missing from the object store: the partition had
    acknowledged records up to `expected_end` (exclusive), the store holds them up to
    `found_end`. Kept in the metadata until an operator explicitly accepts the loss."""

    expected_end: int
    found_end: int
    detected_ms: int
    broker: int
    reason: str  # one line: "checkpoint missing", "store identity marker missing", ...

    @property
    def missing_offsets(self) -> int:
        return max(0, self.expected_end - self.found_end)

    def to_json(self) -> dict[str, Any]:
        return {
            "expected_end": self.expected_end,
            "found_end": self.found_end,
            "detected_ms": self.detected_ms,
            "broker": self.broker,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DataLoss:
        return cls(
            expected_end=int(data["expected_end"]),
            found_end=int(data["found_end"]),
            detected_ms=int(data.get("detected_ms", 0)),
            broker=int(data.get("broker", -1)),
            reason=str(data.get("reason", "")),
        )


@dataclass(slots=True)
class PartitionState:
    """Leadership of one partition. `leader` is NO_LEADER while a move closes the source
    (a move's first step: the target is recorded, nobody is elected yet)."""

    leader: int
    leader_epoch: int
    replicas: list[int]  # the assigned broker (one: data is in object storage)
    # reassignment bookkeeping (as Kafka's): original and target replica sets, when moving
    original_replicas: list[int] | None = None
    target_replicas: list[int] | None = None
    move_started_ms: int | None = None
    # data-loss detection ([O2]): once any broker reported the partition opened, its checkpoint
    # must exist in the store; `end_offset_floor` is a durable lower bound of its next offset
    # (raised from acknowledged high watermarks only, lowered never); `lost` is set when a
    # broker found the data missing and cleared only by an explicit accept, which records in
    # `accepted_from` the offset the partition continues from (cleared once it opened there)
    created: bool = False
    end_offset_floor: int = 0
    lost: DataLoss | None = None
    accepted_from: int | None = None

    @property
    def moving(self) -> bool:
        return self.target_replicas is not None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["lost"] = None if self.lost is None else self.lost.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionState:
        fields = dict(data)
        lost = fields.pop("lost", None)
        return cls(**fields, lost=None if lost is None else DataLoss.from_json(lost))


@dataclass(slots=True, init=False)
class TopicInfo:
    name: str
    topic_id: str  # UUID string
    partitions: list[PartitionState]
    configs: dict[str, str] = field(default_factory=dict)  # overrides only
    internal: bool = False
    # "normal"; "static": the Kafka view of a static topic (its partitions are logic queues,
    # each led by the broker of its leader physical queue; no storage of its own); "physical":
    # the hidden topic holding a static topic's physical queues (never moved by the controller)
    kind: str = "normal"
    # produce_rules() with the overrides they were derived from (None until first asked)
    _produce_rules: tuple[dict[str, str], ProduceRules] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __init__(
        self,
        name: str,
        topic_id: str,
        partitions: list[PartitionState],
        configs: dict[str, str] | None = None,
        internal: bool = False,
        kind: str = "normal",
    ) -> None:
        # the dataclass's own __init__, but setting fields past the guard below (a topic being
        # made is not a topic changed; through __setattr__ it cost ten times as much)
        setattr_ = object.__setattr__
        setattr_(self, "name", name)
        setattr_(self, "topic_id", topic_id)
        setattr_(self, "partitions", partitions)
        setattr_(self, "configs", {} if configs is None else configs)
        setattr_(self, "internal", internal)
        setattr_(self, "kind", kind)
        setattr_(self, "_produce_rules", None)

    def __setattr__(self, name: str, value: object) -> None:
        # A topic's id is its identity: never changed in place (a topic re-created under its
        # name is a new TopicInfo). TopicTable's index of names by id relies on it. (A copy
        # being rebuilt, copy.deepcopy or pickle, sets it once on a new object: allowed.)
        if name == "topic_id" and hasattr(self, "topic_id"):
            raise AttributeError(f"topic {self.name}: a topic id is never changed in place")
        object.__setattr__(self, name, value)

    @property
    def pinned(self) -> bool:
        """Partitions the controller never moves, balances or fails over (static topics)."""
        return self.kind != "normal"

    @property
    def listed(self) -> bool:
        """Shown when a client asks for every topic. Kafka's own internal topics are (flagged
        is_internal, which clients use to leave them out of pattern subscriptions); our
        hidden ones (the physical queues of static topics) are not."""
        return not self.internal or self.name in INTERNAL_TOPICS

    @property
    def fixed_configs(self) -> dict[str, str]:
        """Configs no override changes (FIXED_TOPIC_CONFIGS)."""
        return FIXED_TOPIC_CONFIGS.get(self.name, {})

    def config(self, name: str) -> str | None:
        return self.effective_configs().get(name)

    def effective_configs(self) -> dict[str, str]:
        return {**TOPIC_CONFIG_DEFAULTS, **self.configs, **self.fixed_configs}

    def cleanup_policy(self) -> frozenset[str]:
        """`cleanup.policy` as a set of its items: {"delete"}, {"compact"} or both."""
        return cleanup_policy(self.effective_configs()["cleanup.policy"])

    def produce_rules(self) -> ProduceRules:
        """What Produce checks this topic's records against, derived once per config change,
        not per request: merging the defaults with the overrides and parsing the bounds cost
        microseconds, which every produce request paid for each topic it named; comparing the
        overrides with those the rules came from (usually none, or a few) costs far less. A
        change replaces `configs` (a "configs" record) or the whole TopicInfo (a snapshot, a
        re-created topic); the comparison is by value, so even a change made in place is seen
        by the next produce."""
        derived = self._produce_rules
        if derived is not None and derived[0] == self.configs:
            return derived[1]
        rules = ProduceRules.of(self.effective_configs())
        self._produce_rules = (dict(self.configs), rules)
        return rules

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "partitions": [p.to_json() for p in self.partitions],
            "configs": dict(self.configs),
            "internal": self.internal,
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicInfo:
        return cls(
            name=data["name"],
            topic_id=data["topic_id"],
            partitions=[PartitionState.from_json(p) for p in data["partitions"]],
            configs=dict(data.get("configs", {})),
            internal=bool(data.get("internal", False)),
            kind=str(data.get("kind", "normal")),
        )


class TopicTable(IndexedDict[str, TopicInfo]):
    """`ClusterMetadata.topics`: topics by name, with an index of their names by topic id that
    every change to the table keeps (a topic set, replaced, deleted; the table built or cleared),
    so `by_id` is O(1) and never stale: a deleted topic's id finds nothing, a topic re-created
    under its name is found by its new id only. Each change costs O(1) index work; building a
    table from a mapping (a snapshot or a document loaded) indexes it once, O(topics).

    Nothing else can make the index diverge: every mutating dict method goes through the
    index, `TopicInfo.topic_id` cannot change in place, and `ClusterMetadata` turns any plain
    dict given as its topics into a table. Topic ids are unique (the controller makes them with
    uuid4); should two topics share one anyway, the id finds one of them until both are gone."""

    def __init__(self, topics: Mapping[str, TopicInfo] | Iterable[tuple[str, TopicInfo]] = ()):
        self._names: dict[str, str] = {}  # topic id -> the name holding it
        self._shared: dict[str, list[str]] = {}  # topic id -> the other names holding it
        super().__init__(topics)

    def _index(self, name: str, topic: TopicInfo) -> None:
        holder = self._names.setdefault(topic.topic_id, name)
        if holder != name:
            self._shared.setdefault(topic.topic_id, []).append(name)

    def _unindex(self, name: str, topic: TopicInfo) -> None:
        topic_id = topic.topic_id
        others = self._shared.get(topic_id)
        if self._names.get(topic_id) == name:
            if others:
                self._names[topic_id] = others.pop()
            else:
                del self._names[topic_id]
        elif others is not None and name in others:
            others.remove(name)
        if others is not None and not others:
            del self._shared[topic_id]

    def _replaced(self, name: str, old: TopicInfo, new: TopicInfo) -> None:
        if old.topic_id != new.topic_id:  # the same id: the index holds it already
            super()._replaced(name, old, new)

    def _clear_index(self) -> None:
        self._names.clear()
        self._shared.clear()

    def by_id(self, topic_id: str) -> TopicInfo | None:
        """The topic with this id (its canonical UUID string), or None."""
        name = self._names.get(topic_id)
        if name is None:
            return None
        topic = dict.get(self, name)
        return topic if topic is not None and topic.topic_id == topic_id else None

    def name_of(self, topic_id: str) -> str | None:
        """The name of the topic with this id, or None."""
        name = self._names.get(topic_id)
        if name is None:
            return None
        topic = dict.get(self, name)
        return name if topic is not None and topic.topic_id == topic_id else None

    def indexed_ids(self) -> dict[str, str]:
        """The index as it stands (topic id -> a name holding it): for checks."""
        return dict(self._names)


# Kafka's feature names and the levels this code supports (ApiVersions' supported_features),
# with the level a cluster has until its controller sets another (docs/transactions-v2.md).
TRANSACTION_VERSION = "transaction.version"
SUPPORTED_FEATURES: dict[str, tuple[int, int]] = {TRANSACTION_VERSION: (0, 2)}
FEATURE_DEFAULTS: dict[str, int] = {TRANSACTION_VERSION: 1}


@dataclass(slots=True)
class ClusterMetadata:
    cluster_id: str
    controller_epoch: int = 0
    version: int = 0  # bumped on every committed change; brokers ignore older snapshots
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    # by name, indexed by topic id (a plain dict given here or assigned later becomes a table)
    topics: TopicTable = field(default_factory=TopicTable)
    next_producer_id: int = 1000
    # deleted topics whose data is still in object storage: (name, topic id)
    pending_deletions: list[tuple[str, str]] = field(default_factory=list)
    # dynamic broker config overrides: broker id (as a string) or CLUSTER_DEFAULT -> name -> value
    broker_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    # static topics by Kafka name: their queue mapping copies
    static_topics: dict[str, StaticTopicState] = field(default_factory=dict)
    # True once the controller wrote the object store's identity marker (cluster/identity) for
    # this cluster. False in documents older than the marker: write it now (an upgrade), it
    # does not mean the store was lost.
    store_marker: bool = False
    # SCRAM credentials (salted: never a password), user -> mechanism name -> credential
    scram_credentials: dict[str, dict[str, ScramCredential]] = field(default_factory=dict)
    # ACL bindings (CreateAcls/DeleteAcls, tidalmq_core.acls) by their id
    acls: dict[str, AclBinding] = field(default_factory=dict)
    # finalized feature levels the controller set (Kafka's finalized features, KIP-584): name ->
    # level; a feature absent here is at its default (`feature_level`)
    features: dict[str, int] = field(default_factory=dict)
    # the feature levels each controller that claimed the log supports (controller id -> name
    # -> (lowest, highest)), from the `epoch` record it claimed with: UpdateFeatures refuses a
    # level one of them does not support (docs/transactions-v2.md, "Which levels the
    # controllers support"); absent in logs and snapshots from before it
    controllers: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "topics" and not isinstance(value, TopicTable):
            value = TopicTable(value)
        object.__setattr__(self, name, value)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cluster_id": self.cluster_id,
            "controller_epoch": self.controller_epoch,
            "version": self.version,
            "brokers": {str(k): v.to_json() for k, v in sorted(self.brokers.items())},
            "topics": {k: v.to_json() for k, v in sorted(self.topics.items())},
            "next_producer_id": self.next_producer_id,
            "pending_deletions": [list(d) for d in self.pending_deletions],
            "broker_configs": {k: dict(v) for k, v in sorted(self.broker_configs.items())},
            "static_topics": {k: v.to_json() for k, v in sorted(self.static_topics.items())},
            "store_marker": self.store_marker,
        }
        if self.scram_credentials:  # absent when none: older readers see what they know
            out["scram_credentials"] = scram_credentials_json(self.scram_credentials)
        if self.acls:  # the same: absent when none
            out["acls"] = acls_json(self.acls)
        if self.features:  # the same: absent when every feature is at its default
            out["features"] = dict(sorted(self.features.items()))
        supported = brokers_features_json(self.brokers)
        if supported:  # absent when no broker sent any (all registered by older builds)
            out["broker_features"] = supported
        if self.controllers:  # absent when no controller registered any (older builds)
            out["controller_features"] = controllers_features_json(self.controllers)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterMetadata:
        meta = cls(
            cluster_id=data["cluster_id"],
            controller_epoch=int(data.get("controller_epoch", 0)),
            version=int(data.get("version", 0)),
            brokers={int(k): BrokerInfo.from_json(v) for k, v in data.get("brokers", {}).items()},
            topics=TopicTable(
                (k, TopicInfo.from_json(v)) for k, v in data.get("topics", {}).items()
            ),
            next_producer_id=int(data.get("next_producer_id", 1000)),
            pending_deletions=[(n, i) for n, i in data.get("pending_deletions", [])],
            broker_configs={str(k): dict(v) for k, v in data.get("broker_configs", {}).items()},
            static_topics={
                k: StaticTopicState.from_json(v) for k, v in data.get("static_topics", {}).items()
            },
            store_marker=bool(data.get("store_marker", False)),
            scram_credentials=scram_credentials_from(data.get("scram_credentials") or {}),
            acls=acls_from(data.get("acls") or []),
            features={str(k): int(v) for k, v in (data.get("features") or {}).items()},
            controllers=controllers_features_from_json(data.get("controller_features")),
        )
        load_brokers_features(meta.brokers, data.get("broker_features"))
        return meta

    def copy(self) -> ClusterMetadata:
        return ClusterMetadata.from_json(self.to_json())

    def feature_level(self, name: str) -> int:
        """The finalized level of a feature: the controller's, or the feature's default."""
        return self.features.get(name, FEATURE_DEFAULTS.get(name, 0))

    def live_brokers(self) -> list[int]:
        return sorted(b for b, info in self.brokers.items() if info.state == "alive")

    def dynamic_broker_config(self, broker_id: int, name: str) -> tuple[str, str] | None:
        """(scope, value) of a dynamic broker config set for this broker or cluster-wide."""
        for scope in (str(broker_id), CLUSTER_DEFAULT):
            value = self.broker_configs.get(scope, {}).get(name)
            if value is not None:
                return scope, value
        return None

    def lost_partitions(self, topic: str | None = None) -> dict[TopicPartition, DataLoss]:
        """Partitions whose data a broker found missing and nobody accepted the loss of yet."""
        out: dict[TopicPartition, DataLoss] = {}
        for name, info in sorted(self.topics.items()):
            if topic is not None and name != topic:
                continue
            for i, part in enumerate(info.partitions):
                if part.lost is not None:
                    out[TopicPartition(name, i)] = part.lost
        return out

    def topic_by_id(self, topic_id: str) -> TopicInfo | None:
        """The topic with this id (its canonical UUID string), or None: O(1) (TopicTable)."""
        return self.topics.by_id(topic_id)


def scram_credentials_json(
    credentials: dict[str, dict[str, ScramCredential]],
) -> dict[str, dict[str, Any]]:
    return {
        user: {mech: cred.to_json() for mech, cred in sorted(by_mech.items())}
        for user, by_mech in sorted(credentials.items())
    }


def scram_credentials_from(
    data: dict[str, dict[str, Any]],
) -> dict[str, dict[str, ScramCredential]]:
    return {
        str(user): {str(mech): ScramCredential.from_json(c) for mech, c in by_mech.items()}
        for user, by_mech in data.items()
    }
