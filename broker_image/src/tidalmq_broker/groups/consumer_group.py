"""One group of the consumer group protocol (KIP-848): members, epochs, target assignment and
each member's reconciliation towards it. Pure data and decisions; groups/consumer_groups.py
drives them from heartbeats, timers and the log.

- The *group epoch* goes up when the group's membership or subscriptions change, or when the
  partitions of the topics it subscribes to change.
- The *target assignment* is computed by a server-side assignor for one group epoch (its
  assignment epoch); it says which partitions every member should end up with.
- Each member walks to its target in steps (`reconcile`), so that no partition ever has two
  owners: first it gives up what it must lose (UNREVOKED_PARTITIONS, its epoch unchanged, until
  a heartbeat shows it no longer owns them), then it takes the target epoch and the partitions
  no other member still owns; partitions still owned elsewhere follow on a later heartbeat
  (UNRELEASED_PARTITIONS).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tidalmq_broker.groups.assignors import Assignment

LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
CONSUMER_PROTOCOL = "consumer"


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    rebalance_timeout_ms: int = 300_000
    epoch: int = 0
    previous_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)  # what it owns (or may own now)
    revoking: Assignment = field(default_factory=dict)  # what it must give up, not yet confirmed
    # the member epoch at which it got each partition it holds (KIP-1251: a commit at an older
    # epoch is still its own for partitions it held since then)
    partition_epochs: dict[tuple[str, int], int] = field(default_factory=dict)
    # not stored: a loaded member gets a full session
    session_deadline: float = 0.0
    revocation_deadline: float = 0.0  # 0: nothing being revoked

    def owns(self) -> set[tuple[str, int]]:
        return _pairs(self.assigned) | _pairs(self.revoking)

    def held_since(self, epoch: int, partitions: set[tuple[str, int]]) -> bool:
        """It has held every one of `partitions` since member epoch `epoch` or before."""
        return all(self.partition_epochs.get(tp, epoch + 1) <= epoch for tp in partitions)

    def stamp(self) -> None:
        """Record the epoch of partitions just given (kept ones keep theirs)."""
        self.partition_epochs = {
            tp: self.partition_epochs.get(tp, self.epoch) for tp in sorted(_pairs(self.assigned))
        }


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ""
    target: dict[str, Assignment] = field(default_factory=dict)  # member id -> its target
    topics_seen: tuple[tuple[str, int], ...] = ()  # (topic id, partitions) the target used
    members: dict[str, ConsumerMember] = field(default_factory=dict)

    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.assignment_epoch < self.epoch:
            return ConsumerGroupState.ASSIGNING
        if any(
            m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE
            for m in self.members.values()
        ):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def member_by_instance(self, instance_id: str) -> ConsumerMember | None:
        for member in self.members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def owned_by_others(self, member_id: str) -> set[tuple[str, int]]:
        owned: set[tuple[str, int]] = set()
        for other in self.members.values():
            if other.member_id != member_id:
                owned |= other.owns()
        return owned

    def remove(self, member_id: str) -> ConsumerMember | None:
        """Drop a member; its partitions are free at once. Bumps the group epoch."""
        member = self.members.pop(member_id, None)
        self.target.pop(member_id, None)
        if member is not None:
            self.epoch += 1
        return member


def confirm_revocation(member: ConsumerMember, owned: Assignment | None) -> bool:
    """A heartbeat reported the partitions the member owns (`owned`, None when unchanged): if
    none of those being revoked is among them, the revocation is done. True if it changed."""
    if member.state is not MemberState.UNREVOKED_PARTITIONS or owned is None:
        return False
    if _pairs(owned) & _pairs(member.revoking):
        return False
    member.revoking = {}
    member.revocation_deadline = 0.0
    member.state = MemberState.STABLE
    return True


def reconcile(group: ConsumerGroup, member: ConsumerMember) -> bool:
    """Move `member` one step towards its target; True if its epoch, state or partitions
    changed. Never gives a partition that another member still owns or is revoking."""
    target = group.target.get(member.member_id, {})
    before = (member.epoch, member.state, member.assigned, member.revoking)
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        # still revoking: it may only lose more (a newer target), never gain
        lost = _pairs(member.assigned) - _pairs(target)
        if lost:
            member.assigned = _assignment(_pairs(member.assigned) - lost)
            member.revoking = _assignment(_pairs(member.revoking) | lost)
            member.stamp()
        return before != (member.epoch, member.state, member.assigned, member.revoking)
    if member.epoch == group.assignment_epoch and member.state is MemberState.STABLE:
        return False
    current, wanted = _pairs(member.assigned), _pairs(target)
    lost = current - wanted
    if lost:
        member.assigned = _assignment(current & wanted)
        member.revoking = _assignment(lost)
        member.state = MemberState.UNREVOKED_PARTITIONS
        member.stamp()
        return True
    busy = group.owned_by_others(member.member_id)
    gained = wanted - current
    if member.epoch != group.assignment_epoch:
        member.previous_epoch = member.epoch
        member.epoch = group.assignment_epoch
    member.assigned = _assignment(current | (gained - busy))
    member.state = MemberState.UNRELEASED_PARTITIONS if gained & busy else MemberState.STABLE
    member.stamp()
    return before != (member.epoch, member.state, member.assigned, member.revoking)


def _pairs(assignment: Assignment) -> set[tuple[str, int]]:
    return {(t, p) for t, ps in assignment.items() for p in ps}


def _assignment(pairs: set[tuple[str, int]]) -> Assignment:
    out: dict[str, set[int]] = {}
    for topic, p in pairs:
        out.setdefault(topic, set()).add(p)
    return {t: frozenset(ps) for t, ps in sorted(out.items())}
