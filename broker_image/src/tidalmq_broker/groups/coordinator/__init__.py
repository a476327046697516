"""The group coordinator: consumer groups and committed offsets, durable in `__consumer_offsets`.

As in Kafka, group G is coordinated by the broker leading partition
`abs(hash(G)) % partitions` of `__consumer_offsets`. When that partition opens on this broker
its log is replayed into a GroupShard (groups, members, generations, assignments, offsets); when
it closes (a move, a drain) the shard is dropped and waiting members are told NOT_COORDINATOR so
they find the new coordinator, which replays the same log. Every state change that must survive a
restart (a completed rebalance, an emptied group, an offset commit, a deletion) is appended and
acknowledged by the storage engine before it is answered.

The shard is composed of one part a concern, each a module of this package:

- state.py: the fields every part shares, the settings, the errors, the primitives (the clock,
  background tasks, the futures of waiting members).
- persistence.py: the shard's writes to its log (appends held while a snapshot or the outcome
  of settled transactional offsets is written), snapshots and the log's trim.
- membership.py: the classic rebalance protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup)
  and what DescribeGroups and ListGroups read.
- offsets.py: offset commits, plain and transactional (KIP-447, KIP-890), their settlement by
  markers, OffsetFetch, OffsetDelete and DeleteGroups.
- consumer_requests.py: ConsumerGroupHeartbeat (KIP-848) beside the classic groups, and the
  checks of a consumer-group member's offset requests.
- deadlines.py: the broker's one timer for the timeouts of every shard's groups.
- timers.py: session, join and rebalance timeouts, checked when a group's deadline passes.
- loading.py: the replay when the partition opens, NOT_COORDINATOR to the waiting when it closes.
- shard.py: GroupShard, the parts composed.
- routing.py: GroupCoordinator, which routes a group's requests to its shard and opens and drops
  shards as `__consumer_offsets` partitions come and go.

The parts stand in layers (checked by import-linter, .importlinter, contract
`group-coordinator-parts-layers`). Callers import from this package only."""

from __future__ import annotations

from tidalmq_broker.groups.coordinator.routing import GroupCoordinator
from tidalmq_broker.groups.coordinator.shard import GroupShard
from tidalmq_broker.groups.coordinator.state import (
    CommittedOffset,
    CoordinatorError,
    GroupSettings,
    OffsetKeys,
    Verify,
)

__all__ = [
    "CommittedOffset",
    "CoordinatorError",
    "GroupCoordinator",
    "GroupSettings",
    "GroupShard",
    "OffsetKeys",
    "Verify",
]
