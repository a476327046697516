"""A broker applies metadata batches in order, each exactly once: an update that does not follow
the version it holds (a push that arrives after a newer one, a gap) is refused with the version
it has, so the controller sends from there; a snapshot older than what it holds is ignored. A
batch version is committed once in the whole cluster (the metadata log's conditional append),
so a deposed controller can only push history the broker already has."""

from __future__ import annotations

from tidalmq_broker.apis import KAFKA_APIS
from tidalmq_broker.broker import Broker
from tidalmq_broker.settings import BrokerSettings
from tidalmq_core import snapshots
from tidalmq_core.metadata import BrokerInfo, ClusterMetadata
from tidalmq_core.records import MetadataDelta, broker_record, epoch_record
from tidalmq_core.updates import MetadataUpdate


class Applied:
    """Stands in for the broker's PartitionManager: records what it reconciles."""

    def __init__(self) -> None:
        self.full: list[int] = []
        self.deltas: list[MetadataDelta] = []

    def apply(self, meta: ClusterMetadata) -> None:
        self.full.append(meta.version)

    def apply_delta(self, meta: ClusterMetadata, delta: MetadataDelta) -> None:
        self.deltas.append(delta)


def broker_at(version: int) -> tuple[Broker, Applied]:
    broker = Broker(BrokerSettings(broker_id=0), apis=KAFKA_APIS)
    applied = Applied()
    broker.partitions = applied  # type: ignore[assignment]
    image = ClusterMetadata(cluster_id="c", controller_epoch=1, version=version)
    broker.apply_update(MetadataUpdate(version, snapshots.encode_bytes(image)))
    return broker, applied


def test_batches_apply_in_order_and_once() -> None:
    broker, applied = broker_at(10)
    assert applied.full == [10]
    b1 = [broker_record(BrokerInfo(1, "h", 9001))]
    b2 = [epoch_record(2)]
    assert broker.apply_update(MetadataUpdate(10, None, [(11, b1), (12, b2)])) == 12
    assert 1 in broker.metadata.brokers and broker.metadata.controller_epoch == 2
    assert applied.deltas and 1 in applied.deltas[-1].brokers
    # the same push again (a retry whose answer was lost): refused, nothing applied twice
    assert broker.apply_update(MetadataUpdate(10, None, [(11, b1), (12, b2)])) == 12
    assert len(applied.deltas) == 1
    # a gap: the batches after it wait until the controller sends from our version
    assert broker.apply_update(MetadataUpdate(12, None, [(14, b1)])) == 12


def test_an_older_snapshot_is_ignored() -> None:
    broker, applied = broker_at(20)
    older = ClusterMetadata(cluster_id="c", controller_epoch=1, version=15)
    assert broker.apply_update(MetadataUpdate(15, snapshots.encode_bytes(older))) == 20
    assert applied.full == [20]
    newer = ClusterMetadata(cluster_id="c", controller_epoch=3, version=30)
    assert broker.apply_update(MetadataUpdate(30, snapshots.encode_bytes(newer))) == 30
    assert applied.full == [20, 30] and broker.metadata.controller_epoch == 3
