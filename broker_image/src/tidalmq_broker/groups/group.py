"""One consumer group's membership state (Kafka's classic rebalance protocol).

States, as Kafka names them: Empty → PreparingRebalance (members rejoin) → CompletingRebalance
(the leader computes assignments) → Stable; any membership change goes back to
PreparingRebalance. This module holds the data and the decisions that need no I/O; the shard in
groups/coordinator/ drives it from requests, timers and the log.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class JoinResult:
    error: int = 0
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    heartbeat_deadline: float = 0.0
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[tuple[int, bytes]] | None = None
    is_new: bool = True

    def protocol_names(self) -> set[str]:
        return {name for name, _ in self.protocols}

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def same_protocols(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def touch(self, now: float) -> None:
        self.heartbeat_deadline = now + self.session_timeout_ms / 1000


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation: int = 0
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending_members: dict[str, float] = field(default_factory=dict)  # id -> deadline
    rebalance_deadline: float = 0.0
    initial_delay_deadline: float = 0.0
    state_timestamp_ms: int = 0

    # ------------------------------------------------------------------ queries
    def is_empty(self) -> bool:
        return not self.members

    def member_by_instance(self, instance_id: str) -> Member | None:
        for member in self.members.values():
            if member.group_instance_id == instance_id:
                return member
        return None

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """A joining member fits if its protocol type matches and it shares a protocol with
        every current member."""
        if not protocols:
            return False
        if self.is_empty():
            return bool(protocol_type)
        if protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in protocols}
        return all(names & m.protocol_names() for m in self.members.values())

    def candidate_protocols(self) -> set[str]:
        sets = [m.protocol_names() for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """The protocol most members prefer among those all support (Kafka's vote)."""
        candidates = self.candidate_protocols()
        if not candidates:
            raise ValueError(f"group {self.group_id}: members share no protocol")
        votes: Counter[str] = Counter()
        for member in self.members.values():
            for name, _ in member.protocols:
                if name in candidates:
                    votes[name] += 1
                    break
        best = max(votes.values())
        for member in self.members.values():  # deterministic tie-break: first member's order
            for name, _ in member.protocols:
                if votes.get(name) == best:
                    return name
        raise AssertionError("unreachable")

    def all_members_joined(self) -> bool:
        return not self.pending_members and all(
            m.join_future is not None for m in self.members.values()
        )

    def max_rebalance_timeout_s(self) -> float:
        if not self.members:
            return 0.0
        return max(m.rebalance_timeout_ms for m in self.members.values()) / 1000

    def next_deadline(self, now: float) -> float | None:
        """When a timeout of the group may pass next (None: it has none): a pending member's
        (KIP-394), a member's session (but for members waiting in a join while a rebalance is
        prepared), the rebalance's, and the initial rebalance delay while it is ahead."""
        preparing = self.state is GroupState.PREPARING_REBALANCE
        times = list(self.pending_members.values())
        times += [
            m.heartbeat_deadline
            for m in self.members.values()
            if not (preparing and m.join_future is not None)
        ]
        if preparing:
            times.append(self.rebalance_deadline)
            if self.initial_delay_deadline > now:
                times.append(self.initial_delay_deadline)
        return min(times, default=None)

    def described_members(self) -> list[dict[str, Any]]:
        return [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": m.metadata_for(self.protocol_name)
                if self.state is not GroupState.PREPARING_REBALANCE
                else b"",
                "member_assignment": m.assignment if self.state is GroupState.STABLE else b"",
            }
            for m in self.members.values()
        ]
