"""The controller's static-topic decisions with fast clocks: creation, both remap orders, a dead
broker's queues sealed from object storage, brokers joining and draining, the epoch check after
an interrupted remap, repair, and a refused totalQueues change. Brokers are played by the test
(they write the clean checkpoint a real broker writes when it closes a physical queue); the
metadata and checkpoints live in a real local-directory object store."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from tidalmq_broker.storage import keys
from tidalmq_broker.storage.checkpoint import Checkpoint, CheckpointStore
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_broker.storage.sealed import is_sealed
from tidalmq_controller import (
    Batch,
    Controller,
    ControllerSettings,
    NewTopic,
    ObjectStoreMetadataLog,
    StaticTopicError,
)
from tidalmq_core import static_mapping
from tidalmq_core.metadata import NO_LEADER, BrokerInfo, ClusterMetadata
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import PlanEntry
from tidalmq_core.static_mapping import TotalQueuesFixed
from tidalmq_operator.static_topics import StaticTopicWish, static_topic_status_of

from tests.support.fake_broker import updated
from tests.support.leaders import walked_leaders
from tests.support.waiting import eventually

FAST = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    session_timeout_s=0.6,
    clock_margin_s=0.05,
    election_timeout_s=0.4,
    auto_rebalance=False,
    offsets_topic_partitions=1,
    tick_s=0.01,
)
# What the tests run on unless a timeout is what they test: FAST's 0.6 s sessions and 0.4 s
# election timeout let a late heartbeat on a loaded machine declare a fake broker dead, or a
# stalled event loop fence a source, in the middle of a remap that should finish by its
# sources closing. Leases stay short (a fenced queue is sealed after its lease).
PATIENT = dataclasses.replace(FAST, election_timeout_s=3.0, session_timeout_s=5.0)
# the session timeout under test (a dead broker's queues): only it is short
SHORT_SESSIONS = dataclasses.replace(PATIENT, session_timeout_s=FAST.session_timeout_s)
# the election timeout under test (a hung broker fenced): only it is short
SHORT_ELECTION = dataclasses.replace(PATIENT, election_timeout_s=FAST.election_timeout_s)
PHYS = "__sq.orders"
FAKES: list[FakeBroker] = []  # this test's brokers, silenced before the controller stops


class FakeBroker:
    """A broker as the controller sees it: it opens what the pushes say it leads, and closes
    physical queues it no longer leads by writing a clean checkpoint with `ends[pid]` records."""

    def __init__(self, c: Controller, store: LocalDirObjectStore, broker_id: int) -> None:
        self.c = c
        self.store = store
        self.broker_id = broker_id
        self.open: dict[TopicPartition, int] = {}
        self.image = ClusterMetadata(cluster_id="", version=-1)
        self.ends: dict[int, int] = {}
        self.stuck = False  # never closes anything (a hung broker)
        self._beat: asyncio.Task[None] | None = None
        self._work: set[asyncio.Task[None]] = set()
        FAKES.append(self)

    @property
    def version(self) -> int:
        return self.image.version

    async def push_update(self, base: int, snapshot: bytes | None, batches: list[Batch]) -> int:
        self.image = updated(self.image, base, snapshot, batches)
        task = asyncio.create_task(self._reconcile(self.image))
        self._work.add(task)
        task.add_done_callback(self._work.discard)
        return self.image.version

    async def _reconcile(self, meta: ClusterMetadata) -> None:
        phys = meta.topics.get(PHYS)
        if phys is None or self.stuck:
            return
        for pid, part in enumerate(phys.partitions):
            tp = TopicPartition(PHYS, pid)
            if part.leader == self.broker_id and tp not in self.open:
                self.open[tp] = part.leader_epoch
                self.c.partition_opened(self.broker_id, tp, part.leader_epoch)
            elif part.leader != self.broker_id and tp in self.open:
                epoch = self.open.pop(tp)
                await write_checkpoint(
                    self.store,
                    phys.topic_id,
                    pid,
                    epoch,
                    self.ends.get(pid, 0),
                    owner=str(self.broker_id),
                    clean=True,
                )
                self.c.partition_closed(self.broker_id, tp, epoch)

    async def register(self) -> None:
        info = BrokerInfo(self.broker_id, "127.0.0.1", 9000 + self.broker_id, incarnation="a")
        await self.c.register_broker(info, self)
        await self.push_update(*self.c.update_for(self.version))
        self._beat = asyncio.create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        while True:
            await self.c.heartbeat(
                self.broker_id,
                "a",
                self.version,
                dict(self.open),
                {tp: self.ends.get(tp.partition, 0) for tp in self.open},
            )
            await asyncio.sleep(FAST.heartbeat_interval_s)

    def die(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
        self.stuck = True


async def write_checkpoint(
    store: LocalDirObjectStore,
    topic_id: str,
    pid: int,
    epoch: int,
    end: int,
    *,
    owner: str,
    clean: bool,
) -> None:
    tp = TopicPartition(PHYS, pid)
    key = keys.checkpoint_key(tp, topic_id)
    cps = CheckpointStore(store)
    loaded = await cps.load(key)
    index = (
        [IndexEntry(0, end - 1, f"wal/x/y/{pid:012d}", 0, 10 * end, int(time.time() * 1000))]
        if end
        else []
    )
    cp = Checkpoint(
        PHYS,
        topic_id,
        pid,
        epoch,
        owner,
        "a",
        5,
        next_offset=end,
        clean_shutdown=clean,
        index=index,
    )
    await cps.commit(key, cp, loaded[1] if loaded else None)


@pytest.fixture
async def env(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Controller, LocalDirObjectStore]]:
    """A started controller on PATIENT settings, or on the settings a test gives
    (`@pytest.mark.parametrize("env", [SETTINGS], indirect=True)`)."""
    settings: ControllerSettings = getattr(request, "param", PATIENT)
    store = LocalDirObjectStore(tmp_path / "objects")
    c = Controller(ObjectStoreMetadataLog(store), settings, object_store=store)
    c.static.cleanup_interval_s = 3600
    await c.start()
    yield c, store
    for fake in FAKES:
        fake.die()
        for task in fake._work:
            task.cancel()
    FAKES.clear()
    await c.stop()


async def brokers(c: Controller, store: LocalDirObjectStore, n: int) -> list[FakeBroker]:
    out = [FakeBroker(c, store, i) for i in range(n)]
    for b in out:
        await b.register()
    return out


wait_for = partial(eventually, timeout_s=10.0)  # this module's default wait


def view(c: Controller) -> static_mapping.MappingView:
    return c.metadata.static_topics["orders"].view()


def kafka_leaders(c: Controller) -> list[int]:
    return [p.leader for p in c.metadata.topics["orders"].partitions]


def settled(c: Controller) -> bool:
    return not c.static.describe("orders")["busy"] and view(c).consistent


async def test_create_places_queues_and_exposes_a_fixed_partition_count(env) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    await brokers(c, store, 3)
    await c.static.create("orders", 8)
    meta = c.metadata
    assert meta.topics["orders"].kind == "static" and meta.topics[PHYS].internal
    assert kafka_leaders(c) == [0, 1, 2, 0, 1, 2, 0, 1]
    assert view(c).consistent and sorted(meta.static_topics["orders"].copies) == [0, 1, 2]
    (again,) = await c.create_topics([NewTopic("orders", 3)])
    assert again.error is not None
    (internal,) = await c.create_topics([NewTopic(PHYS, 1)])
    assert internal.error is not None
    grow = await c.create_partitions("orders", 12)
    assert grow.error is not None and "fixed" in str(grow.error)
    with pytest.raises(TotalQueuesFixed, match="can never change"):
        await c.static.update("orders", total_queues=12)
    # the controller's own balancing and reassignment leave static topics alone
    plan = await c.rebalance(dry_run=True)
    assert all(m.partition.topic not in ("orders", PHYS) for m in plan.moves)  # type: ignore[attr-defined]
    errors = await c.alter_reassignments([PlanEntry(TopicPartition(PHYS, 0), 1)])
    assert "remapping" in str(errors[TopicPartition(PHYS, 0)])


async def test_strict_remap_continues_at_the_exact_end(env) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    bs = await brokers(c, store, 3)
    await c.static.create("orders", 3)
    bs[0].ends[0] = 120  # broker 0 wrote 120 records to physical queue 0
    (rec,) = await c.static.remap("orders", {0: (1, "strict")})
    items = view(c).items(0)
    assert [(i.broker, i.logic_offset, i.end_offset) for i in items] == [(0, 0, 120), (1, 120, -1)]
    assert kafka_leaders(c)[0] == 1 and rec.opened_ms is not None and not rec.recovered
    assert rec.sealed_ms <= rec.switched_ms <= rec.opened_ms  # type: ignore[operator]
    assert c.metadata.topics[PHYS].partitions[0].leader == NO_LEADER
    # the local status's counts from the indexes: sealed queues and the Kafka view not counted
    assert c.leaders_per_broker() == walked_leaders(c.metadata)
    assert {cp.epoch for cp in c.metadata.static_topics["orders"].copies.values()} == {1}
    loaded = await CheckpointStore(store).load(
        keys.checkpoint_key(TopicPartition(PHYS, 0), c.metadata.topics[PHYS].topic_id)
    )
    assert loaded is not None and is_sealed(loaded[0]) and loaded[0].next_offset == 120
    labels = {"topic": "orders", "mode": "strict", "outcome": "ok"}
    assert (REGISTRY.get_sample_value("tidalmq_static_remaps_total", labels) or 0) >= 1
    assert REGISTRY.get_sample_value("tidalmq_static_topic_epoch", {"topic": "orders"}) in (0, 1)


async def test_available_remap_is_writable_first_and_jumps_a_bounded_step(env) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    bs = await brokers(c, store, 2)
    await c.static.create("orders", 2, jump=50)
    bs[1].ends[1] = 30
    await wait_for(lambda: c.known_high_watermarks().get(TopicPartition(PHYS, 1)) == 30)
    bs[1].ends[1] = 40  # ten more records land before broker 1 closes it
    (rec,) = await c.static.remap("orders", {1: (0, "available")})
    items = view(c).items(1)
    assert [(i.broker, i.logic_offset) for i in items] == [(1, 0), (0, 80)]
    assert items[0].end_offset == 40 and rec.jump == 40 <= 50
    assert rec.switched_ms < rec.sealed_ms  # type: ignore[operator]  # writable before blocked


# the session timeout is what is tested (broker 2 is declared dead by it)
@pytest.mark.parametrize("env", [SHORT_SESSIONS], indirect=True, ids=["short-sessions"])
async def test_a_dead_brokers_queues_are_sealed_from_storage_and_remapped(env) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    bs = await brokers(c, store, 3)
    await c.static.create("orders", 6)
    topic_id = c.metadata.topics[PHYS].topic_id
    # broker 2 crashes: its last checkpoints of physical queues 2 and 5 are not clean
    for pid in (2, 5):
        await write_checkpoint(store, topic_id, pid, 0, 7, owner="2", clean=False)
    bs[2].die()
    await wait_for(
        lambda: 2 not in kafka_leaders(c) and settled(c) and NO_LEADER not in kafka_leaders(c)
    )
    for q in (2, 5):
        items = view(c).items(q)
        assert items[0].broker == 2 and items[0].end_offset == 7 and items[1].logic_offset == 7
    assert sorted(kafka_leaders(c).count(b) for b in (0, 1)) == [3, 3]
    recs = c.static.remaps("orders")
    assert all(r.mode == "strict" and r.source == 2 for r in recs) and len(recs) == 2


async def test_joining_and_draining_brokers_move_the_fewest_queues(env) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    bs = await brokers(c, store, 2)
    await c.static.create("orders", 8)
    await wait_for(lambda: settled(c))
    (new,) = [FakeBroker(c, store, 2)]
    await new.register()
    await wait_for(lambda: kafka_leaders(c).count(2) >= 2 and settled(c))
    assert sorted(kafka_leaders(c).count(b) for b in (0, 1, 2)) == [2, 3, 3]
    assert len(c.static.remaps("orders")) == 2
    drained = asyncio.create_task(c.drain_broker(0, timeout_s=10))
    await wait_for(lambda: 0 not in kafka_leaders(c) and settled(c))
    assert await drained
    assert sorted(kafka_leaders(c).count(b) for b in (1, 2)) == [4, 4]
    assert c.leaders_per_broker() == walked_leaders(c.metadata)
    del bs


async def test_an_interrupted_remap_blocks_updates_until_repair(env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    bs = await brokers(c, store, 3)
    await c.static.create("orders", 3)
    c.static.auto_repair = False
    bs[0].ends[0] = 55

    import tidalmq_controller._static_topics as manager

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("controller died between block old and switch new")

    monkeypatch.setattr(manager, "complete", crash)
    with pytest.raises(RuntimeError):
        await c.static.remap("orders", {0: (1, "strict")})
    monkeypatch.undo()
    described = c.static.describe("orders")
    assert not described["consistent"]
    assert any("different epochs" in p for p in described["problems"])
    # the operator's StaticTopic status says so (it raised here while the copies disagreed)
    status = static_topic_status_of(c, StaticTopicWish("orders", "orders", 3, 1))
    reasons = {cond["type"]: cond["reason"] for cond in status["conditions"]}
    assert reasons["Reconciling"] == reasons["Ready"] == "CopiesDisagree"
    assert kafka_leaders(c)[0] == NO_LEADER  # queue 0 is blocked: nobody writes it
    with pytest.raises(StaticTopicError, match=r"copies disagree.*repair"):
        await c.static.remap("orders", {1: (2, "strict")})
    repaired = await c.static.repair("orders")
    assert repaired["consistent"] and repaired["epoch"] == 2
    items = view(c).items(0)
    assert [(i.broker, i.logic_offset) for i in items] == [(0, 0), (0, 55)]
    await wait_for(lambda: kafka_leaders(c)[0] == 0)
    await c.static.remap("orders", {1: (2, "strict")})  # updates work again


async def test_a_restarted_controller_repairs_on_its_own(env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    bs = await brokers(c, store, 2)
    await c.static.create("orders", 2, jump=10)
    import tidalmq_controller._static_topics as manager

    async def never(*args: object, **kwargs: object) -> None:
        raise RuntimeError("controller died after switch new")

    monkeypatch.setattr(c.static._sealer, "seal_all", never)
    with pytest.raises(RuntimeError):
        await c.static.remap("orders", {0: (1, "available")})
    monkeypatch.undo()
    assert not view(c).consistent and kafka_leaders(c)[0] == 1  # writable on the new broker
    assert c.static.auto_repair
    await wait_for(lambda: settled(c) and view(c).items(0)[-1].decided)
    items = view(c).items(0)
    assert [i.broker for i in items] == [0, 1] and items[0].sealed
    assert items[1].logic_offset >= items[0].logic_end()
    del bs, manager


# the election timeout is what is tested (the hung broker is fenced by it)
@pytest.mark.parametrize("env", [SHORT_ELECTION], indirect=True, ids=["short-election"])
async def test_a_hung_broker_is_fenced_and_its_queue_sealed_after_its_lease(env) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    bs = await brokers(c, store, 2)
    await c.static.create("orders", 2)
    await wait_for(lambda: TopicPartition(PHYS, 0) in bs[0].open)
    bs[0].stuck = True  # never closes physical queue 0
    started = time.monotonic()
    (rec,) = await c.static.remap("orders", {0: (1, "strict")})
    assert time.monotonic() - started >= SHORT_ELECTION.election_timeout_s
    assert c.broker_liveness()[0].fenced_at is not None
    assert view(c).items(0)[-1].broker == 1 and rec.opened_ms is not None


class RacingStore(LocalDirObjectStore):
    """Commits a broker's checkpoint just before the first conditional replace of `key`, as a
    broker still opening the physical queue would."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.race_key: str | None = None
        self.raced = 0

    async def put(self, key, data, *, if_none_match=False, if_match=None):  # type: ignore[no-untyped-def]
        if key == self.race_key and if_match is not None and not self.raced:
            self.raced += 1
            current, etag = await self.get_with_etag(key)
            await super().put(key, current + b" ", if_match=etag)  # someone else's commit
        return await super().put(key, data, if_none_match=if_none_match, if_match=if_match)


async def test_a_checkpoint_that_changes_while_it_is_sealed_is_sealed_again(tmp_path: Path) -> None:
    store = RacingStore(tmp_path / "objects")
    c = Controller(ObjectStoreMetadataLog(store), PATIENT, object_store=store)
    await c.start()
    try:
        bs = await brokers(c, store, 2)
        await c.static.create("orders", 2)
        await wait_for(lambda: TopicPartition(PHYS, 0) in bs[0].open)
        bs[0].ends[0] = 9
        topic_id = c.metadata.topics[PHYS].topic_id
        store.race_key = keys.checkpoint_key(TopicPartition(PHYS, 0), topic_id)
        (rec,) = await c.static.remap("orders", {0: (1, "strict")})
        assert store.raced == 1 and rec.opened_ms is not None
        assert [i.logic_offset for i in view(c).items(0)] == [0, 9]
    finally:
        for fake in FAKES:
            fake.die()
        FAKES.clear()
        await c.stop()


async def test_cleanup_drops_expired_and_empty_items_and_their_data(env) -> None:  # type: ignore[no-untyped-def]
    c, store = env
    bs = await brokers(c, store, 3)
    await c.static.create("orders", 1)
    bs[0].ends[0] = 5  # gen 0 on broker 0 holds 5 records
    await c.static.remap("orders", {0: (1, "strict")})
    await c.static.remap("orders", {0: (2, "strict")})  # gen 1 on broker 1 stays empty
    assert [i.gen for i in view(c).items(0)] == [0, 1, 2]
    epoch = view(c).epoch
    result = await c.alter_topic_configs(
        "orders", {"retention.ms": "500"}, incremental=True, validate_only=False
    )
    assert result.error is None
    assert c.metadata.topics[PHYS].configs["retention.ms"] == "500"  # physical queues follow
    await asyncio.sleep(0.6)
    c.static.empty_item_grace_ms = 0
    c.static.cleanup_interval_s = 0.05
    await wait_for(lambda: len(view(c).items(0)) == 1 and settled(c))
    items = view(c).items(0)
    assert items[0].gen == 2 and items[0].logic_offset == 5
    assert sorted(c.metadata.static_topics["orders"].retired) == [0, 1]
    assert view(c).epoch == epoch + 1 and view(c).consistent
    topic_id = c.metadata.topics[PHYS].topic_id
    for pid in (0, 1):
        prefix = keys.partition_prefix(TopicPartition(PHYS, pid), topic_id)
        assert await store.list(prefix) == []
