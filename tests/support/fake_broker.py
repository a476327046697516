"""A broker played by a test against the controller's own RPC surface: it registers, applies
the metadata updates the controller pushes (batches of records, or a snapshot), heartbeats what
it has open, and optionally opens exactly what the metadata says it leads."""

from __future__ import annotations

import asyncio

from tidalmq_controller import Batch, Controller, ControllerFenced
from tidalmq_core import snapshots
from tidalmq_core.metadata import BrokerInfo, ClusterMetadata
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import apply_batch


def updated(
    image: ClusterMetadata, base: int, snapshot: bytes | None, batches: list[Batch]
) -> ClusterMetadata:
    """`image` after a metadata update, as a broker applies it (refused: unchanged)."""
    if snapshot is not None:
        image = snapshots.decode(snapshot)
    elif base != image.version:
        return image
    for batch in batches:
        if batch.version == image.version + 1:
            apply_batch(image, batch.records, batch.version)
    return image


class FakeBroker:
    def __init__(
        self,
        controller: Controller,
        broker_id: int,
        incarnation: str = "a",
        *,
        reconcile: bool = False,
        interval_s: float = 0.05,
    ) -> None:
        self.controller = controller
        self.broker_id = broker_id
        self.incarnation = incarnation
        self.image = ClusterMetadata(cluster_id="", version=-1)
        self.updates = 0
        self.snapshots_received = 0
        self.open: dict[TopicPartition, int] = {}
        self.fenced = False
        self.reconcile = reconcile  # open exactly what the metadata says it leads
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    @property
    def version(self) -> int:
        return self.image.version

    async def push_update(self, base: int, snapshot: bytes | None, batches: list[Batch]) -> int:
        self.updates += 1
        self.snapshots_received += snapshot is not None
        self.image = updated(self.image, base, snapshot, batches)
        if self.reconcile:
            self.open = {
                TopicPartition(name, i): p.leader_epoch
                for name, topic in self.image.topics.items()
                for i, p in enumerate(topic.partitions)
                if p.leader == self.broker_id and topic.kind != "static"
            }
        return self.image.version

    async def catch_up(self) -> None:
        base, snapshot, batches = self.controller.update_for(self.image.version)
        await self.push_update(base, snapshot, batches)

    async def register(self, *, heartbeat: bool = True) -> None:
        """Register and catch up, then heartbeat (unless `heartbeat` is False: a broker still
        catching up, whose first heartbeat the test sends with `start_heartbeats`)."""
        info = BrokerInfo(
            self.broker_id, "127.0.0.1", 9000 + self.broker_id, incarnation=self.incarnation
        )
        await self.controller.register_broker(info, self)
        await self.catch_up()
        if heartbeat:
            self.start_heartbeats()

    def start_heartbeats(self) -> None:
        self._task = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            try:
                reply = await self.controller.heartbeat(
                    self.broker_id, self.incarnation, self.image.version, dict(self.open)
                )
                self.fenced = self.fenced or reply.fenced
            except ControllerFenced:
                pass  # a stopped controller: the test points us at its successor
            await asyncio.sleep(self.interval_s)

    def silence(self) -> None:
        if self._task is not None:
            self._task.cancel()
