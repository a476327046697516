"""The controller's side of data-loss detection ([O2]) with fast clocks: partitions become
`created` on their first open, end-offset floors rise from the brokers' acknowledged high
watermarks (never fall, never from a deleted topic's late report), a lost report is recorded
until an explicit accept, which continues the partition at its floor; and the object store's
identity marker. Metadata and the marker live in a real local-directory object store."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from tidalmq_broker.storage.identity import IDENTITY_KEY, MISSING
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import ObjectStoreMetadataLog
from tidalmq_controller._controller import (
    Controller,
    ControllerSettings,
    ForeignStore,
    NewTopic,
)
from tidalmq_core.metadata import DataLoss
from tidalmq_core.model import TopicPartition

from tests.unit.controller.test_controller import PATIENT, cluster_of, part, wait_for

DL = dataclasses.replace(PATIENT, floor_commit_interval_s=0.2, identity_check_interval_s=0.05)
TP = TopicPartition("t", 0)


class Events(list[tuple[str, str]]):
    def reasons(self) -> list[str]:
        return [r for r, _ in self]


def events(c: Controller) -> Events:
    seen = Events()
    c.add_event_sink(lambda reason, message, _: seen.append((reason, message)))
    return seen


def make(
    tmp_path: Path, settings: ControllerSettings = DL
) -> tuple[Controller, LocalDirObjectStore]:
    store = LocalDirObjectStore(tmp_path / "objects")
    return Controller(ObjectStoreMetadataLog(store), settings, object_store=store), store


@pytest.fixture
async def env(tmp_path: Path):  # type: ignore[no-untyped-def]
    c, store = make(tmp_path)
    await c.start()
    yield c, store
    await c.stop()


async def stored(store: LocalDirObjectStore):  # type: ignore[no-untyped-def]
    """The metadata as committed (not the controller's memory)."""
    meta = (await ObjectStoreMetadataLog(store).load()).image()
    assert meta is not None
    return meta


async def test_first_open_marks_the_partition_created_and_floors_rise_only(env) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    (a,) = await cluster_of(c, 1)
    await c.create_topics([NewTopic("t", 1)])
    topic_id = c.metadata.topics["t"].topic_id
    assert part(c, "t", 0).created is False
    c.partition_opened(0, TP, part(c, "t", 0).leader_epoch, topic_id=topic_id, high_watermark=0)
    await wait_for(lambda: part(c, "t", 0).created)
    # committed, not just noted (the journal's write may finish a moment after the image has it:
    # a loaded machine saw it read before)
    deadline = asyncio.get_running_loop().time() + 5
    while not (await stored(store)).topics["t"].partitions[0].created:
        assert asyncio.get_running_loop().time() < deadline, "the creation was never committed"
        await asyncio.sleep(0.02)

    epoch = part(c, "t", 0).leader_epoch
    await c.heartbeat(0, a.incarnation, -1, {TP: epoch}, floors={TP: (topic_id, 3000)})
    await wait_for(lambda: part(c, "t", 0).end_offset_floor == 3000, timeout_s=2)
    # a lower report never lowers it; a deleted topic's late report (other id) is ignored
    await c.heartbeat(0, a.incarnation, -1, {TP: epoch}, floors={TP: (topic_id, 10)})
    await c.heartbeat(0, a.incarnation, -1, {TP: epoch}, floors={TP: ("old-topic-id", 9999)})
    c.partition_closed(0, TP, epoch, topic_id=topic_id, high_watermark=3100)
    await wait_for(lambda: part(c, "t", 0).end_offset_floor == 3100, timeout_s=2)
    await c.heartbeat(0, a.incarnation, -1, {TP: epoch}, floors={TP: (topic_id, 3050)})
    await asyncio.sleep(0.5)
    assert part(c, "t", 0).end_offset_floor == 3100
    assert (await stored(store)).topics["t"].partitions[0].end_offset_floor == 3100


async def test_floors_are_committed_at_a_clean_stop(tmp_path: Path) -> None:
    slow = dataclasses.replace(DL, floor_commit_interval_s=3600)
    c, store = make(tmp_path, slow)
    await c.start()
    (a,) = await cluster_of(c, 1)
    await c.create_topics([NewTopic("t", 1)])
    topic_id = c.metadata.topics["t"].topic_id
    epoch = part(c, "t", 0).leader_epoch
    await c.heartbeat(0, a.incarnation, -1, {TP: epoch}, floors={TP: (topic_id, 700)})
    assert (await stored(store)).topics["t"].partitions[0].end_offset_floor == 0
    a.silence()
    await c.stop()
    assert (await stored(store)).topics["t"].partitions[0].end_offset_floor == 700


async def test_a_lost_report_is_kept_until_accepted_and_the_partition_continues_at_its_floor(
    env,  # type: ignore[no-untyped-def]
) -> None:
    c, store = env
    seen = events(c)
    (a,) = await cluster_of(c, 1)
    await c.create_topics([NewTopic("t", 2)])
    topic_id = c.metadata.topics["t"].topic_id
    epoch = part(c, "t", 0).leader_epoch
    c.partition_opened(0, TP, epoch, topic_id=topic_id, high_watermark=0)
    await c.heartbeat(0, a.incarnation, -1, {TP: epoch}, floors={TP: (topic_id, 3000)})
    await wait_for(lambda: part(c, "t", 0).end_offset_floor == 3000, timeout_s=2)

    loss = DataLoss(3000, 0, 1, 0, "checkpoint missing")
    await c.partition_lost_data(0, TP, epoch - 1, loss)  # a stale epoch: ignored
    assert c.lost_partitions() == {}
    await c.partition_lost_data(0, TP, epoch, loss)
    await c.partition_lost_data(0, TP, epoch, loss)  # reported again: one event
    assert c.lost_partitions() == {TP: loss} and c.lost_partitions("t") == {TP: loss}
    assert (await stored(store)).topics["t"].partitions[0].lost == loss
    assert seen.reasons().count("DataLost") == 1
    assert "3000 missing" in next(m for r, m in seen if r == "DataLost")
    assert part(c, "t", 0).leader == 0  # stays where it is

    assert await c.accept_data_loss("t", [1]) == []  # partition 1 is not lost
    assert await c.accept_data_loss("t") == [0]
    p = part(c, "t", 0)
    assert p.lost is None and p.accepted_from == 3000 and p.leader_epoch == epoch + 1
    assert "DataLossAccepted" in seen.reasons()
    assert c.lost_partitions() == {}
    # the broker opened it at the new epoch: the accept is done (a later wipe is a new loss)
    c.partition_opened(0, TP, epoch + 1, topic_id=topic_id, high_watermark=3000)
    await wait_for(lambda: part(c, "t", 0).accepted_from is None)
    assert part(c, "t", 0).created and part(c, "t", 0).end_offset_floor == 3000


async def test_the_identity_marker_is_written_for_a_new_cluster_and_checked(env) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    seen = events(c)
    doc = json.loads(await store.get(IDENTITY_KEY))
    assert doc["cluster_id"] == c.metadata.cluster_id
    assert c.metadata.store_marker and (await stored(store)).store_marker
    assert c.store_problem is None

    await cluster_of(c, 1)
    await c.create_topics([NewTopic("t", 1)])
    c.partition_opened(0, TP, part(c, "t", 0).leader_epoch)
    await wait_for(lambda: part(c, "t", 0).created)

    await store.delete([IDENTITY_KEY])  # the store was emptied
    await wait_for(lambda: c.store_problem == MISSING, timeout_s=2)
    await asyncio.sleep(0.2)
    assert seen.reasons().count("StoreLost") == 1  # once per transition
    # accepting rewrites the marker (same cluster id) and continues every created partition
    assert await c.accept_data_loss("t") == [0]
    assert c.store_problem is None
    assert json.loads(await store.get(IDENTITY_KEY))["cluster_id"] == c.metadata.cluster_id
    assert part(c, "t", 0).accepted_from == 0

    await store.put(IDENTITY_KEY, json.dumps({"cluster_id": "someone-else"}).encode())
    await wait_for(lambda: c.store_problem is not None, timeout_s=2)
    assert "belongs to cluster someone-else" in c.store_problem
    with pytest.raises(ForeignStore):
        await c.accept_data_loss("t")
    assert seen.reasons().count("StoreLost") == 2


async def test_metadata_older_than_the_marker_gets_one_on_load(tmp_path: Path) -> None:
    c, store = make(tmp_path)
    await c.start()
    cluster_id = c.metadata.cluster_id
    await c.stop()
    # as an older controller left it: no marker, store_marker false, and the metadata as the
    # single document of that version (read as a snapshot by this one)
    await store.delete([IDENTITY_KEY])
    meta = await stored(store)
    meta.store_marker = False
    log_objects = [
        o.key for o in await store.list("cluster/") if "/log/" in o.key or "/snapshots/" in o.key
    ]
    await store.delete(log_objects)
    await store.put("cluster/metadata.json", json.dumps(meta.to_json()).encode())

    again, _ = make(tmp_path)
    await again.start()
    try:
        assert again.store_problem is None  # an upgrade, not a lost store
        assert again.metadata.store_marker
        assert json.loads(await store.get(IDENTITY_KEY))["cluster_id"] == cluster_id
    finally:
        await again.stop()


async def test_a_new_cluster_on_a_store_of_another_cluster_writes_nothing_there(
    tmp_path: Path,
) -> None:
    store = LocalDirObjectStore(tmp_path / "objects")
    await store.put(IDENTITY_KEY, json.dumps({"cluster_id": "other", "created_ms": 1}).encode())
    c = Controller(
        ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "metadata")), DL, object_store=store
    )
    await c.start()
    try:
        assert c.store_problem is not None and "belongs to cluster other" in c.store_problem
        assert not c.metadata.store_marker
        assert json.loads(await store.get(IDENTITY_KEY))["cluster_id"] == "other"
    finally:
        await c.stop()


async def test_a_store_wiped_under_the_controller_gets_its_metadata_back(tmp_path: Path) -> None:
    """The metadata log shares the store (a standalone broker; Kubernetes with one bucket): a
    store emptied under a running controller loses the log with the data. The controller still
    has everything committed in memory and stores a snapshot of it again as soon as it sees the
    store's marker gone, so a restarted controller still knows the topics and what was lost,
    instead of starting a new, empty cluster on the wiped store."""
    c, store = make(tmp_path)
    await c.start()
    (a,) = await cluster_of(c, 1)
    await c.create_topics([NewTopic("t", 3)])
    topic_id = c.metadata.topics["t"].topic_id
    try:
        await store.delete([o.key for o in await store.list("")])  # the bucket emptied
        assert await c.check_identity() == MISSING

        async def snapshot_back() -> bool:
            return bool(await store.list("cluster/snapshots/"))

        for _ in range(200):
            if await snapshot_back():
                break
            await asyncio.sleep(0.01)
        assert await snapshot_back(), "no snapshot stored again after the wipe"
        await c.create_topics([NewTopic("u", 1)])  # committed after the wipe: in the log too
    finally:
        a.silence()
        await c.stop()
    again, _ = make(tmp_path)
    await again.start()
    try:
        assert again.metadata.topics["t"].topic_id == topic_id
        assert "u" in again.metadata.topics
        assert again.store_problem == MISSING  # and it says the store was lost
    finally:
        await again.stop()
