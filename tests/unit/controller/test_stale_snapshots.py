"""A broker adopts a pushed metadata snapshot only if it is newer than its own, by (controller
epoch, version): a deposed controller's push (older epoch, whatever its version) and a push that
arrives after a newer one are ignored, so they cannot take partitions back from the broker or
give it partitions it no longer leads."""

from __future__ import annotations

from tidalmq_broker.broker import Broker
from tidalmq_broker.settings import BrokerSettings
from tidalmq_core.metadata import ClusterMetadata


class Applied:
    """Stands in for the broker's PartitionManager: records the snapshots it reconciles."""

    def __init__(self) -> None:
        self.versions: list[tuple[int, int]] = []

    def apply(self, meta: ClusterMetadata) -> None:
        self.versions.append((meta.controller_epoch, meta.version))


def snapshot(controller_epoch: int, version: int) -> ClusterMetadata:
    return ClusterMetadata(cluster_id="c", controller_epoch=controller_epoch, version=version)


def test_older_snapshots_are_ignored() -> None:
    broker = Broker(BrokerSettings(broker_id=0))
    applied = Applied()
    broker.partitions = applied  # type: ignore[assignment]
    broker.apply_metadata(snapshot(2, 10))
    broker.apply_metadata(snapshot(2, 9))  # reordered push of the same controller
    broker.apply_metadata(snapshot(2, 10))  # the same one again
    broker.apply_metadata(snapshot(1, 50))  # a deposed controller, however far it counted
    assert (broker.metadata.controller_epoch, broker.metadata.version) == (2, 10)
    broker.apply_metadata(snapshot(3, 11))  # the successor
    broker.apply_metadata(snapshot(2, 12))  # the predecessor again, newer version: still older
    assert applied.versions == [(2, 10), (3, 11)]
    assert (broker.metadata.controller_epoch, broker.metadata.version) == (3, 11)
