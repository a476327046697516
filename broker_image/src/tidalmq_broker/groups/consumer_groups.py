"""The consumer groups (KIP-848) of one `__consumer_offsets` partition: ConsumerGroupHeartbeat,
session and rebalance timeouts, and the document each group is stored as.

The shard (groups/coordinator/) owns one ConsumerGroups beside its classic groups and hands it a way
to store a group; every change a heartbeat makes (a member joining or leaving, a new target
assignment, a member's epoch or partitions) is stored before it is answered, as one record
holding the whole group under the group's key, so replaying the partition rebuilds the group
and a new coordinator carries on where the old one stopped. Timers and the partitions of
subscribed topics are not stored: a loaded member gets a full session, and the first heartbeat
after a load compares the topics again.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from tidalmq_broker.groups.assignors import Assignment, MemberSpec, assignors_named
from tidalmq_broker.groups.consumer_group import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
    confirm_revocation,
    reconcile,
)

log = logging.getLogger(__name__)

MAX_SUBSCRIBED_TOPICS = 10_000


@dataclass(frozen=True, slots=True)
class ConsumerGroupSettings:
    session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    assignors: str = "uniform,range"  # group.consumer.assignors, the first the default
    max_size: int = 2**31 - 1  # group.consumer.max.size

    def __post_init__(self) -> None:
        assignors_named(self.assignors)  # raises ValueError naming the bad list


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic_id: str
    partitions: int


class Topics(Protocol):
    """The topics a heartbeat looks up, one by name at a time: only those the group's members
    subscribe to, so a heartbeat costs O(the group's subscriptions), never O(topics in the
    cluster). The broker's is apis/consumer_groups.py's `MetadataTopics`, over its metadata; a
    topic created (or grown) since the last heartbeat is found at the next one."""

    def get(self, name: str, /) -> TopicInfo | None: ...


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A ConsumerGroupHeartbeat as the coordinator needs it (None: unchanged since the last)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(slots=True)
class HeartbeatResult:
    error: int = ErrorCode.none
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None


class HeartbeatError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConsumerGroups:
    def __init__(
        self,
        settings: ConsumerGroupSettings,
        store: Callable[[ConsumerGroup], Awaitable[None]],  # durable before it returns
    ) -> None:
        self.settings = settings
        self.store = store
        self.groups: dict[str, ConsumerGroup] = {}
        self._stored: dict[str, dict[str, Any]] = {}  # each group as last stored
        configured = assignors_named(settings.assignors)
        self._assignors = {a.name: a for a in configured}
        self._default_assignor = configured[0].name

    # ------------------------------------------------------------------ heartbeat
    async def heartbeat(self, request: Heartbeat, topics: Topics, now: float) -> HeartbeatResult:
        try:
            group, member, changed = self._apply(request, topics, now)
        except HeartbeatError as exc:
            return HeartbeatResult(error=exc.code, message=str(exc), member_epoch=-1)
        if member is None:  # it left
            await self.store_if_changed(group)
            return HeartbeatResult(
                member_id=request.member_id,
                member_epoch=request.member_epoch,
                heartbeat_interval_ms=0,
            )
        await self.store_if_changed(group)
        return HeartbeatResult(
            member_id=member.member_id,
            member_epoch=member.epoch,
            heartbeat_interval_ms=self.settings.heartbeat_interval_ms,
            assignment=dict(member.assigned)
            if changed or request.owned is not None or request.member_epoch == 0
            else None,
        )

    def _apply(
        self, request: Heartbeat, topics: Topics, now: float
    ) -> tuple[ConsumerGroup, ConsumerMember | None, bool]:
        _validate(request, self._assignors)
        group = self.groups.get(request.group_id)
        if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group, request), None, True
        if request.member_epoch == 0:
            group, member = self._join(group, request, now)
        else:
            known = group.members.get(request.member_id) if group is not None else None
            if group is None or known is None:
                raise HeartbeatError(
                    ErrorCode.unknown_member_id,
                    f"Member {request.member_id} is not a member of group {request.group_id}.",
                )
            member = known
            _check_epoch(member, request)
            _update_subscription(group, member, request)
        member.session_deadline = now + self.settings.session_timeout_ms / 1000
        seen = self._topics_seen(group, topics)
        if seen != group.topics_seen and group.epoch == group.assignment_epoch:
            group.epoch += 1  # the subscribed topics' partitions changed
        if group.epoch > group.assignment_epoch:
            self._assign(group, topics, seen)
        changed = confirm_revocation(member, request.owned)
        changed = reconcile(group, member) or changed
        if member.state is MemberState.UNREVOKED_PARTITIONS and not member.revocation_deadline:
            member.revocation_deadline = now + member.rebalance_timeout_ms / 1000
        return group, member, changed

    def _join(
        self, group: ConsumerGroup | None, request: Heartbeat, now: float
    ) -> tuple[ConsumerGroup, ConsumerMember]:
        if group is None:
            group = self.groups[request.group_id] = ConsumerGroup(request.group_id)
        member_id = request.member_id or str(uuid.uuid4())  # v0 lets the coordinator name it
        old = group.members.get(member_id)
        if old is not None and old.instance_id is None:
            group.remove(member_id)  # it rejoins with nothing: it lost its partitions
        previous = None
        if request.instance_id is not None:
            previous = group.member_by_instance(request.instance_id)
            if previous is not None and previous.epoch != STATIC_LEAVE_EPOCH:
                if previous.member_id != member_id:
                    raise HeartbeatError(
                        ErrorCode.unreleased_instance_id,
                        f"Static member {previous.member_id} with instance id "
                        f"{request.instance_id} is present in the consumer group.",
                    )
                group.remove(member_id)
                previous = None
        if previous is None and len(group.members) >= self.settings.max_size:
            raise HeartbeatError(
                ErrorCode.group_max_size_reached,
                f"The consumer group has reached its maximum capacity of "
                f"{self.settings.max_size} members.",
            )
        member = ConsumerMember(
            member_id=member_id,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            client_id=request.client_id,
            client_host=request.client_host,
            subscribed_topic_names=request.subscribed_topic_names or (),
            subscribed_topic_regex=request.subscribed_topic_regex,
            server_assignor=request.server_assignor,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
        )
        if previous is not None:
            # a static member back within its session: it takes over its old self
            group.members.pop(previous.member_id)
            target = group.target.pop(previous.member_id, None)
            if target is not None:
                group.target[member_id] = target
            member.epoch, member.previous_epoch = previous.previous_epoch, previous.previous_epoch
            member.state, member.assigned = previous.state, previous.assigned
            member.revoking, member.partition_epochs = previous.revoking, previous.partition_epochs
            group.members[member_id] = member
            if _subscription(previous) != _subscription(member):
                group.epoch += 1
            log.info("group %s: static member %s is back as %s", group.group_id,
                     request.instance_id, member_id)  # fmt: skip
        else:
            group.members[member_id] = member
            group.epoch += 1
            log.info("group %s: member %s joined (epoch %d)", group.group_id, member_id,
                     group.epoch)  # fmt: skip
        member.session_deadline = now + self.settings.session_timeout_ms / 1000
        return group, member

    def _leave(self, group: ConsumerGroup | None, request: Heartbeat) -> ConsumerGroup:
        member = group.members.get(request.member_id) if group is not None else None
        if group is None or member is None:
            raise HeartbeatError(
                ErrorCode.unknown_member_id,
                f"Member {request.member_id} is not a member of group {request.group_id}.",
            )
        if request.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # a static member going away for a while keeps its partitions for its session
            if member.epoch != STATIC_LEAVE_EPOCH:
                member.previous_epoch = member.epoch
            member.epoch = STATIC_LEAVE_EPOCH
            log.info("group %s: static member %s left for now", group.group_id, member.member_id)
            return group
        group.remove(member.member_id)
        log.info("group %s: member %s left (epoch %d)", group.group_id, member.member_id,
                 group.epoch)  # fmt: skip
        return group

    def _topics_seen(self, group: ConsumerGroup, topics: Topics) -> tuple[tuple[str, int], ...]:
        names = {n for m in group.members.values() for n in m.subscribed_topic_names}
        found = (topics.get(n) for n in names)
        return tuple(sorted((t.topic_id, t.partitions) for t in found if t is not None))

    def _assign(
        self,
        group: ConsumerGroup,
        topics: Topics,
        seen: tuple[tuple[str, int], ...],
    ) -> None:
        votes = Counter(m.server_assignor for m in group.members.values() if m.server_assignor)
        name = votes.most_common(1)[0][0] if votes else self._default_assignor
        ids: dict[str, str] = {}  # subscribed name -> topic id, each name looked up once
        for n in {n for m in group.members.values() for n in m.subscribed_topic_names}:
            topic = topics.get(n)
            if topic is not None:
                ids[n] = topic.topic_id
        specs = {
            m.member_id: MemberSpec(
                subscribed=frozenset(ids[n] for n in m.subscribed_topic_names if n in ids),
                current=group.target.get(m.member_id, {}),
                instance_id=m.instance_id,
            )
            for m in group.members.values()
        }
        group.target = self._assignors[name].assign(specs, dict(seen))
        group.assignor = name
        group.assignment_epoch = group.epoch
        group.topics_seen = seen
        log.info("group %s: target assignment of epoch %d by %s over %d members",
                 group.group_id, group.epoch, name, len(specs))  # fmt: skip

    # ------------------------------------------------------------------ timers
    def expire(self, now: float) -> list[ConsumerGroup]:
        """Members whose session ran out, or who did not give up partitions within their
        rebalance timeout, leave. Returns the groups that changed (to store)."""
        return [group for group in self.groups.values() if self.expire_group(group, now)]

    @staticmethod
    def expire_group(group: ConsumerGroup, now: float) -> bool:
        """expire() for one group: whether a member left (the group is to be stored)."""
        gone = [
            m
            for m in group.members.values()
            if now >= m.session_deadline or (m.revocation_deadline and now >= m.revocation_deadline)
        ]
        for member in gone:
            why = "session timed out" if now >= member.session_deadline else "revoking"
            log.info("group %s: member %s removed (%s)", group.group_id, member.member_id, why)
            group.remove(member.member_id)
        return bool(gone)

    @staticmethod
    def next_deadline(group: ConsumerGroup) -> float | None:
        """When a member's session or revocation may run out next (None: no member)."""
        times = [m.session_deadline for m in group.members.values()]
        times += [m.revocation_deadline for m in group.members.values() if m.revocation_deadline]
        return min(times, default=None)

    # ------------------------------------------------------------------ storage
    async def store_if_changed(self, group: ConsumerGroup) -> None:
        document = group_document(group)
        if self._stored.get(group.group_id) == document:
            return
        await self.store(group)
        self._stored[group.group_id] = document

    def load(self, group_id: str, document: dict[str, Any], now: float) -> None:
        group = group_from_document(group_id, document)
        for member in group.members.values():
            member.session_deadline = now + self.settings.session_timeout_ms / 1000
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                member.revocation_deadline = now + member.rebalance_timeout_ms / 1000
        self.groups[group_id] = group
        self._stored[group_id] = document

    def forget(self, group_id: str) -> None:
        self.groups.pop(group_id, None)
        self._stored.pop(group_id, None)

    def validate_offsets(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        partitions: set[tuple[str, int]] | None = None,
    ) -> int:
        """OffsetCommit/OffsetFetch/TxnOffsetCommit by a member: it must be one, at its
        current epoch. A commit with no member (epoch < 0) is allowed only in an empty group.
        A commit of `partitions` (topic id, partition) at an older epoch is accepted when the
        member has held each of them since that epoch (KIP-1251, Kafka 4.3): its heartbeat moved
        it on while the commit was on its way."""
        group = self.groups[group_id]
        if epoch < 0 and not member_id and not group.members:
            return ErrorCode.none
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if epoch == member.epoch:
            return ErrorCode.none
        if 0 <= epoch < member.epoch and partitions and member.held_since(epoch, partitions):
            return ErrorCode.none
        return ErrorCode.stale_member_epoch


def _validate(request: Heartbeat, assignors: Mapping[str, object]) -> None:
    def invalid(message: str) -> HeartbeatError:
        return HeartbeatError(ErrorCode.invalid_request, message)

    if request.instance_id is not None and not request.instance_id:
        raise invalid("InstanceId can't be empty.")
    if request.rack_id is not None and not request.rack_id:
        raise invalid("RackId can't be empty.")
    if request.member_epoch == 0:
        if request.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if request.owned is None or request.owned:
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise invalid(
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif request.member_epoch == STATIC_LEAVE_EPOCH and request.instance_id is None:
        raise invalid("InstanceId can't be null when MemberEpoch is -2.")
    elif request.member_epoch < STATIC_LEAVE_EPOCH:
        raise invalid(f"MemberEpoch {request.member_epoch} is invalid.")
    if request.member_epoch != 0 and not request.member_id:
        raise invalid("MemberId can't be empty.")
    if request.subscribed_topic_regex is not None:
        # Kafka evaluates these with RE2J (linear time); Python's backtracking engine could be
        # made to run for ever by one client, so TidalMQ does not take regex subscriptions yet
        raise HeartbeatError(
            ErrorCode.invalid_regular_expression,
            "TidalMQ does not support SubscribedTopicRegex yet; subscribe by topic names.",
        )
    if request.subscribed_topic_names is not None and (
        len(request.subscribed_topic_names) > MAX_SUBSCRIBED_TOPICS
    ):
        raise invalid(f"at most {MAX_SUBSCRIBED_TOPICS} subscribed topics")
    if request.server_assignor is not None and request.server_assignor not in assignors:
        raise HeartbeatError(
            ErrorCode.unsupported_assignor,
            f"ServerAssignor {request.server_assignor} is not supported. "
            f"Supported assignors: {', '.join(assignors)}.",
        )


def _check_epoch(member: ConsumerMember, request: Heartbeat) -> None:
    """The member's epoch, or its previous one if it owns nothing it should not (the answer
    that gave it the new epoch was lost)."""
    if request.member_epoch == member.epoch:
        return
    if (
        request.member_epoch == member.previous_epoch
        and request.owned is not None
        and all(set(ps) <= member.assigned.get(t, frozenset()) for t, ps in request.owned.items())
    ):
        return
    raise HeartbeatError(
        ErrorCode.fenced_member_epoch,
        f"The consumer group member has a smaller member epoch ({request.member_epoch}) than "
        f"the one known by the group coordinator ({member.epoch}). The member must abandon "
        "all its partitions and rejoin.",
    )


def _subscription(member: ConsumerMember) -> tuple[Any, ...]:
    return (
        tuple(sorted(member.subscribed_topic_names)),
        member.subscribed_topic_regex,
        member.server_assignor,
    )


def _update_subscription(group: ConsumerGroup, member: ConsumerMember, request: Heartbeat) -> None:
    before = _subscription(member)
    if request.subscribed_topic_names is not None:
        member.subscribed_topic_names = request.subscribed_topic_names
    if request.server_assignor is not None:
        member.server_assignor = request.server_assignor
    if request.rebalance_timeout_ms != -1:
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
    if request.rack_id is not None:
        member.rack_id = request.rack_id
    if _subscription(member) != before:
        group.epoch += 1


# -------------------------------------------------------------------------- stored form
def _assignment_doc(assignment: Assignment) -> dict[str, list[int]]:
    return {t: sorted(ps) for t, ps in sorted(assignment.items())}


def _assignment_of(doc: dict[str, list[int]]) -> Assignment:
    return {t: frozenset(int(p) for p in ps) for t, ps in doc.items()}


def group_document(group: ConsumerGroup) -> dict[str, Any]:
    return {
        "epoch": group.epoch,
        "assignment_epoch": group.assignment_epoch,
        "assignor": group.assignor,
        "topics_seen": [list(t) for t in group.topics_seen],
        "target": {m: _assignment_doc(a) for m, a in sorted(group.target.items())},
        "members": [
            {
                "id": m.member_id,
                "iid": m.instance_id,
                "rack": m.rack_id,
                "cid": m.client_id,
                "host": m.client_host,
                "topics": list(m.subscribed_topic_names),
                "regex": m.subscribed_topic_regex,
                "assignor": m.server_assignor,
                "rt": m.rebalance_timeout_ms,
                "epoch": m.epoch,
                "prev": m.previous_epoch,
                "state": m.state.value,
                "assigned": _assignment_doc(m.assigned),
                "revoking": _assignment_doc(m.revoking),
                "since": [[t, p, e] for (t, p), e in sorted(m.partition_epochs.items())],
            }
            for m in group.members.values()
        ],
    }


def group_from_document(group_id: str, doc: dict[str, Any]) -> ConsumerGroup:
    group = ConsumerGroup(
        group_id,
        epoch=int(doc["epoch"]),
        assignment_epoch=int(doc["assignment_epoch"]),
        assignor=str(doc["assignor"]),
        topics_seen=tuple((str(t), int(n)) for t, n in doc["topics_seen"]),
        target={m: _assignment_of(a) for m, a in doc["target"].items()},
    )
    for m in doc["members"]:
        group.members[m["id"]] = ConsumerMember(
            member_id=m["id"],
            instance_id=m["iid"],
            rack_id=m["rack"],
            client_id=m["cid"],
            client_host=m["host"],
            subscribed_topic_names=tuple(m["topics"]),
            subscribed_topic_regex=m["regex"],
            server_assignor=m["assignor"],
            rebalance_timeout_ms=int(m["rt"]),
            epoch=int(m["epoch"]),
            previous_epoch=int(m["prev"]),
            state=MemberState(m["state"]),
            assigned=_assignment_of(m["assigned"]),
            revoking=_assignment_of(m["revoking"]),
            partition_epochs={(str(t), int(p)): int(e) for t, p, e in m["since"]},
        )
    return group
