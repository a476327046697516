"""The controller's settings (timeouts, leases, wave sizes): one frozen value the controller and
its managers (leadership, topics, static topics) read; it imports nothing of the controller."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    heartbeat_interval_s: float = 1.0
    lease_s: float = 4.0  # a broker acknowledges writes only this long after a heartbeat it sent
    session_timeout_s: float = 6.0  # silent this long: dead (must exceed lease + clock margin)
    clock_margin_s: float = 0.5
    election_timeout_s: float = 10.0  # a source that has not closed by then is fenced
    # an elected broker that has not opened its partition by then hands it on (back to the
    # move's source if it is live, else to the least loaded live broker); generous, because
    # opening after a broker died replays that broker's WAL objects
    open_timeout_s: float = 30.0
    auto_rebalance: bool = True  # fair share to joining brokers
    # the controller shares its process with its only broker: a broker's new incarnation means
    # the old one is gone with the old process, so its partitions need not wait for a lease
    embedded: bool = False
    offsets_topic_partitions: int = 16
    # transaction.state.log.num.partitions (Kafka's default): __transaction_state is created on
    # the first transactional request (ensure_transaction_state_topic), not with the cluster
    transaction_state_partitions: int = 50
    # the cluster's finalized `transaction.version` feature (KIP-890 part 2: 2 lets clients
    # run transactions with an epoch bump per transaction, docs/transactions-v2.md); when set,
    # written into the cluster metadata when the controller starts, so every broker answers the
    # same. None: the metadata's level stays as it is (1 for a new cluster), changed only by
    # UpdateFeatures (`kafka-features upgrade|downgrade`)
    transaction_version: int | None = None
    # this controller's name in the metadata: it registers the feature levels it supports under
    # it when it claims the log, and UpdateFeatures names it when it refuses a level for it
    # (docs/transactions-v2.md, "Which levels the controllers support"). Stable across restarts
    # of the same controller: "local" (`tidalmq local up`), "broker-N" (embedded), "operator"
    controller_id: str = "controller"
    tick_s: float = 0.05
    # how often the object store's identity marker is read (a wiped or foreign store is noticed)
    identity_check_interval_s: float = 5.0
    # the brokers' acknowledged high watermarks are committed as end-offset floors this often
    # (and with every other commit, and at a clean stop)
    floor_commit_interval_s: float = 10.0
    # moves in flight (closing or opening) per broker, as source or target: a rebalance of
    # thousands of partitions runs in waves of at most this many per broker
    max_moves_per_broker: int = 4000
    # moves one step of the controller starts, and elects, at most, and moves a rebalance
    # queues per slice of the event loop: bounded work per slice (about 15-20 us of CPU per
    # move, so 500 keep a step near 10-25 ms; 2,000 made steps of 60-100 ms at 50,000
    # partitions, docs/control-plane.md "Liveness never waits")
    max_moves_per_step: int = 500
    # a snapshot is written once the records since the last one reach its size (at least this)
    snapshot_min_bytes: int = 8 * 1024 * 1024

    @property
    def role_window_s(self) -> float:
        """A lease is granted only while the controller confirmed its role in the metadata log
        (its next version still free, or a commit) within this window. A deposed controller
        that has not noticed yet therefore grants nothing later than this after its successor's
        first commit, which bounds every lease it handed out (see `start`). Several heartbeats
        long (the log is checked every heartbeat interval), and no shorter than a lease."""
        return max(3 * self.heartbeat_interval_s, self.lease_s)

    def __post_init__(self) -> None:
        if self.transaction_version is not None and not 0 <= self.transaction_version <= 2:
            raise ValueError(f"transaction.version {self.transaction_version} is not in 0..2")
        if self.session_timeout_s <= self.lease_s + self.clock_margin_s:
            raise ValueError(
                f"session timeout {self.session_timeout_s}s must exceed the lease "
                f"{self.lease_s}s plus the clock margin {self.clock_margin_s}s, or a broker "
                "declared dead could still acknowledge writes"
            )
