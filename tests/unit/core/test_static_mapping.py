"""The static-topic mapping algebra: offset translation across items, time search,
the global epoch check, cleanup, and both switch orders including a crash between steps."""

from __future__ import annotations

import itertools

import pytest
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.static_mapping import (
    MappingConflict,
    MappingCopy,
    MappingError,
    MappingItem,
    StaticTopicState,
    block_old,
    complete,
    distribute,
    drop_items,
    earliest,
    expired_items,
    finish,
    fix_new,
    initial_mapping,
    locate,
    logic_high_watermark,
    pending_work,
    plan_placement,
    require_consistent,
    switch_new,
    switch_strict,
    time_candidates,
)

NOW = 1_700_000_000_000


def three_items() -> list[MappingItem]:
    """Logic queue 0: broker 1 wrote 0-999, broker 2 wrote 1000-1499, broker 3 leads from 1500."""
    return [
        MappingItem(0, 1, 0, 0, 0, 1000, NOW - 3000, NOW - 2000),
        MappingItem(5, 2, 1, 1000, 0, 500, NOW - 2000, NOW - 1000),
        MappingItem(9, 3, 2, 1500, 0, -1, NOW - 1000),
    ]


def new_topic(total: int = 4, brokers: tuple[int, ...] = (0, 1, 2)) -> StaticTopicState:
    placement = [brokers[q % len(brokers)] for q in range(total)]
    return initial_mapping("t", total, placement, brokers=None, now_ms=NOW, copy_brokers=brokers)


def ids() -> itertools.count[int]:
    return itertools.count(100)


# ------------------------------------------------------------------------------ translation
def test_offsets_translate_across_items() -> None:
    items = three_items()
    assert [locate(items, x) for x in (0, 999, 1000, 1499, 1500, 10**9)] == [0, 0, 1, 1, 2, 2]
    assert items[1].to_physical(1200) == 200 and items[1].to_logic(200) == 1200
    assert items[2].to_physical(1500) == 0 and items[2].to_logic(42) == 1542
    assert items[0].logic_end() == 1000 and items[1].logic_end() == 1500
    assert items[2].logic_end(physical_end=10) == 1510
    with pytest.raises(MappingError):
        items[2].logic_end()  # the leader's end is only known with its high watermark


def test_the_logic_end_is_the_leaders_physical_end_in_logic_offsets() -> None:
    items = three_items()
    assert logic_high_watermark(items, 10) == 1510
    assert logic_high_watermark(items, 0) == 1500  # an empty leader: the previous item's end
    items[2].start_offset = 40  # a physical end below the item's start reads as an empty item
    assert logic_high_watermark(items, 0) == 1500 and logic_high_watermark(items, 45) == 1505
    assert logic_high_watermark([], 7) == 0


def test_the_logic_end_never_goes_back_through_a_strict_remap() -> None:
    st = new_topic()
    assert logic_high_watermark(require_consistent(st).items(0), 700) == 700
    strict_switch(st, 0, 1, end=700, new_id=10)
    items = require_consistent(st).items(0)
    # the new physical queue is empty (its end, or a floor not raised yet, is 0): still 700
    assert [logic_high_watermark(items, end) for end in (0, 5)] == [700, 705]


def test_the_logic_end_through_an_available_remap_hides_the_undecided_item() -> None:
    st = new_topic()
    st.jump = 100
    switch_new(st, 1, 2, 10, known_end=500, now_ms=NOW, target_epoch=1)
    # the old physical queue still closing: the end Fetch answers stays at the old item's start
    assert logic_high_watermark(st.view().items(1), 20) == 0
    block_old(st, 1, 0, end_offset=530, time_of_end=NOW, now_ms=NOW, target_epoch=1)
    # blocked: its end, whatever the undecided new item took
    assert logic_high_watermark(st.view().items(1), 20) == 530
    fix_new(st, 1, now_ms=NOW, target_epoch=1)
    finish(st, target_epoch=1)
    items = require_consistent(st).items(1)
    assert logic_high_watermark(items, 20) == 620  # decided at 600: its records show


def test_a_hole_left_by_a_jump_reads_from_the_next_item() -> None:
    items = three_items()
    items[2].logic_offset = 1600  # an availability switch jumped 100 offsets
    assert locate(items, 1550) == 2  # the client gets the batches from 1600 on
    assert items[2].to_logic(0) == 1600


def test_earliest_skips_items_whose_data_is_gone() -> None:
    items = three_items()
    assert earliest(items) == 0
    assert earliest(items, {0: 1000}) == 1000  # physical queue 0 fully deleted
    assert earliest(items[2:], {9: 7}) == 1507


def test_time_search_skips_items_that_end_before_the_timestamp() -> None:
    items = three_items()
    assert [i.gen for i in time_candidates(items, NOW - 2500)] == [0, 1, 2]
    assert [i.gen for i in time_candidates(items, NOW - 1500)] == [1, 2]
    assert [i.gen for i in time_candidates(items, NOW)] == [2]  # only the leader remains


# ----------------------------------------------------------------------- copies and epochs
def test_new_topic_is_consistent_and_every_broker_has_a_copy() -> None:
    st = new_topic(5, (0, 1))
    view = require_consistent(st)
    assert sorted(st.copies) == [0, 1]
    assert sorted(st.copies[0].hosted) == [0, 2, 4] and sorted(st.copies[1].hosted) == [1, 3]
    assert view.leader(3).broker == 1 and view.epoch == 0


def test_epoch_check_refuses_copies_at_different_epochs() -> None:
    st = new_topic()
    st.copies[1].epoch = 1
    view = st.view()
    assert not view.consistent
    assert "broker 0 at 0, broker 1 at 1, broker 2 at 0" in view.problems[0]
    with pytest.raises(MappingConflict, match="different epochs"):
        require_consistent(st)


def test_a_misplaced_copy_is_detected_and_ignored() -> None:
    st = new_topic(3)
    stray = MappingCopy.from_json(st.copies[2].to_json())  # broker 2's copy, stored for broker 1
    st.copies[1] = stray
    view = st.view()
    assert view.ignored and "names broker 2" in view.ignored[0]
    # broker 1's own queue is now in no copy: the check says so instead of trusting the stray
    assert any("queue 1" in p for p in view.problems)


def test_two_copies_claiming_one_queue_are_a_conflict() -> None:
    st = new_topic(3)
    st.copies[0].hosted[1] = [MappingItem(1, 0, 0, 0)]
    assert any("claimed by the copies of brokers [0, 1]" in p for p in st.view().problems)


def test_the_leader_copy_must_hold_its_leader_item() -> None:
    st = new_topic(3)
    del st.copies[2].hosted[2]
    st.copies[0].hosted[2] = [MappingItem(2, 2, 0, 0)]  # only another broker knows it
    assert any("leader completeness" in p for p in st.view().problems)


def test_copies_round_trip_through_cluster_metadata_json() -> None:
    st = new_topic()
    meta = ClusterMetadata("c", static_topics={"t": st})
    again = ClusterMetadata.from_json(meta.to_json())
    assert again.static_topics["t"].to_json() == st.to_json()


# ---------------------------------------------------------------------------------- strict
def strict_switch(st: StaticTopicState, q: int, target: int, end: int, new_id: int) -> None:
    epoch = st.epoch() + 1
    old = st.view().leader(q)
    assert old is not None
    block_old(st, q, old.gen, end_offset=end, time_of_end=NOW, now_ms=NOW, target_epoch=epoch)
    switch_strict(st, q, target, new_id, now_ms=NOW, target_epoch=epoch)
    finish(st, target_epoch=epoch, copy_brokers=(0, 1, 2))


def test_strict_switch_continues_at_the_exact_logic_offset() -> None:
    st = new_topic()
    strict_switch(st, 0, 1, end=700, new_id=10)
    view = require_consistent(st)
    items = view.items(0)
    assert [(i.queue, i.broker, i.gen, i.logic_offset) for i in items] == [
        (0, 0, 0, 0),
        (10, 1, 1, 700),
    ]
    assert items[0].end_offset == 700 and items[1].end_offset == -1
    assert {c.epoch for c in st.copies.values()} == {1}
    # leader completeness: broker 1 has the full list, broker 0 (second leader) its own part
    assert len(st.copies[1].hosted[0]) == 2 and len(st.copies[0].hosted[0]) == 1
    assert st.copies[0].hosted[0][0].sealed


def test_cleanup_keeps_only_two_generations_on_old_brokers() -> None:
    st = new_topic(1, (0, 1, 2))
    strict_switch(st, 0, 1, end=10, new_id=10)
    strict_switch(st, 0, 2, end=20, new_id=11)
    assert [len(st.copies[b].hosted.get(0, [])) for b in (0, 1, 2)] == [0, 2, 3]
    assert [i.logic_offset for i in st.view().items(0)] == [0, 10, 30]
    # the two newest generations are in two copies each; nothing is lost from the leader's
    strict_switch(st, 0, 0, end=5, new_id=12)
    assert [len(st.copies[b].hosted.get(0, [])) for b in (0, 1, 2)] == [4, 0, 3]
    assert {c.epoch for c in st.copies.values()} == {3}  # every broker's copy, even empty


def test_strict_crash_between_block_and_switch_is_refused_then_repaired() -> None:
    st = new_topic()
    old = st.view().leader(2)
    assert old is not None
    block_old(st, 2, old.gen, end_offset=300, time_of_end=NOW, now_ms=NOW, target_epoch=1)
    # the controller dies here: broker 2's copy is at epoch 1, the others at 0
    view = st.view()
    assert not view.consistent
    assert any("sealed (a switch was interrupted)" in p for p in view.problems)
    with pytest.raises(MappingConflict, match="repair"):
        require_consistent(st)
    # nothing was lost: the sealed item with its end is in the merged view
    assert view.items(2)[0].end_offset == 300
    work = pending_work(view)
    assert [(q, i.gen) for q, i in work["reopen"]] == [(2, 0)] and not work["seal"]
    next_id = ids()
    repaired = complete(
        st, ends={}, targets={2: 0}, allocate=lambda q, b: next(next_id), now_ms=NOW, target_epoch=2
    )
    assert repaired.consistent and {c.epoch for c in st.copies.values()} == {2}
    assert [(i.broker, i.logic_offset) for i in repaired.items(2)] == [(2, 0), (0, 300)]


# ----------------------------------------------------------------------------- available
def test_available_switch_jumps_a_bounded_step_and_never_goes_back() -> None:
    st = new_topic()
    st.jump = 100
    new = switch_new(st, 1, 2, 10, known_end=500, now_ms=NOW, target_epoch=1)
    assert not new.decided and new.tentative_offset == 600 and new.base == 600
    view = st.view()
    assert view.leader(1).broker == 2  # writable at once, before the old one is blocked
    assert not view.consistent  # mid-update: copies at epochs 0 and 1
    # the old broker took 30 more records before it closed
    block_old(st, 1, 0, end_offset=530, time_of_end=NOW, now_ms=NOW, target_epoch=1)
    hole = fix_new(st, 1, now_ms=NOW, target_epoch=1)
    finish(st, target_epoch=1)
    items = require_consistent(st).items(1)
    assert items[1].logic_offset == 600 and hole == 70
    assert items[1].logic_offset >= items[0].logic_end()


def test_available_switch_whose_old_queue_outran_the_jump_still_never_goes_back() -> None:
    st = new_topic()
    st.jump = 10
    switch_new(st, 1, 2, 10, known_end=500, now_ms=NOW, target_epoch=1)
    block_old(st, 1, 0, end_offset=900, time_of_end=NOW, now_ms=NOW, target_epoch=1)
    assert fix_new(st, 1, now_ms=NOW, target_epoch=1) == 0
    finish(st, target_epoch=1)
    items = require_consistent(st).items(1)
    assert items[1].logic_offset == 900 == items[0].logic_end()


@pytest.mark.parametrize("crash_after", ["switch_new", "block_old", "fix_new"])
def test_available_crash_between_steps_keeps_every_item_and_repairs(crash_after: str) -> None:
    st = new_topic()
    st.jump = 50
    switch_new(st, 0, 1, 10, known_end=200, now_ms=NOW, target_epoch=1)
    if crash_after in ("block_old", "fix_new"):
        block_old(st, 0, 0, end_offset=220, time_of_end=NOW, now_ms=NOW, target_epoch=1)
    if crash_after == "fix_new":
        fix_new(st, 0, now_ms=NOW, target_epoch=1)
    view = st.view()
    assert not view.consistent
    with pytest.raises(MappingConflict):
        require_consistent(st)
    # both generations are still known, and the old one is in two copies from now on
    assert [i.gen for i in view.items(0)] == [0, 1]
    holders = [b for b, c in st.copies.items() if any(i.gen == 0 for i in c.hosted.get(0, []))]
    assert holders == [0, 1]
    work = pending_work(view)
    ends = {}
    if crash_after == "switch_new":
        assert [(q, i.gen) for q, i in work["seal"]] == [(0, 0)]
        with pytest.raises(MappingError, match="not sealed yet"):
            complete(st, ends={}, targets={}, allocate=lambda q, b: 99, now_ms=NOW, target_epoch=2)
        ends = {0: (220, NOW)}  # the repair closed (or sealed) physical queue 0 meanwhile
    repaired = complete(
        st, ends=ends, targets={}, allocate=lambda q, b: 99, now_ms=NOW, target_epoch=2
    )
    items = repaired.items(0)
    assert repaired.consistent and [i.logic_offset for i in items] == [0, 250]
    assert {c.epoch for c in st.copies.values()} == {2}


def test_a_queue_cannot_switch_twice_at_once() -> None:
    st = new_topic()
    switch_new(st, 0, 1, 10, known_end=0, now_ms=NOW, target_epoch=1)
    with pytest.raises(MappingError, match="already switching"):
        switch_new(st, 0, 2, 11, known_end=0, now_ms=NOW, target_epoch=1)
    with pytest.raises(MappingConflict):
        finish(st, target_epoch=1)  # the new item is still undecided


# -------------------------------------------------------------------------------- cleanup
def test_expired_and_empty_items_are_cleaned_up() -> None:
    st = StaticTopicState("t", 1, None)
    items = three_items()
    items.insert(2, MappingItem(7, 1, 2, 1500, 0, 0, update_time=NOW - 120_000))  # empty
    items[3].gen = 3
    st.copies = distribute({0: items}, 1, 4, (1, 2, 3))
    view = require_consistent(st)
    doomed = expired_items(view, now_ms=NOW, retention_ms=1500)
    assert [(i.gen, i.queue) for _, i in doomed] == [(0, 0), (2, 7)]
    assert expired_items(view, now_ms=NOW, retention_ms=-1) == [(0, items[2])]
    drop_items(st, doomed)
    after = require_consistent(st)
    assert [i.gen for i in after.items(0)] == [1, 3] and st.retired == [0, 7]
    assert earliest(after.items(0)) == 1000


# ------------------------------------------------------------------------------- placement
def test_placement_moves_the_fewest_queues_and_honours_pins() -> None:
    leaders = {q: q % 3 for q in range(8)}  # 3, 3, 2 on brokers 0, 1, 2
    assert plan_placement(leaders, [0, 1, 2]) == {}
    moves = plan_placement(leaders, [0, 1, 2, 3])  # a broker joins
    assert len(moves) == 2 and set(moves.values()) == {3}
    after = {**leaders, **moves}
    moves = plan_placement(after, [0, 2, 3])  # broker 1 leaves
    assert set(moves) == {q for q, b in after.items() if b == 1}
    counts = [list({**after, **moves}.values()).count(b) for b in (0, 2, 3)]
    assert max(counts) - min(counts) <= 1
    assert plan_placement(leaders, [0, 1, 2], pins={0: 2}) == {0: 2}
    with pytest.raises(MappingError):
        plan_placement(leaders, [])
