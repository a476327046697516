"""Static topics: fixed logic queues made of physical queues by logic-offset range.

Names follow the seed. A *physical queue* is a stream written by one broker: in TidalMQ a
partition of the hidden topic `__sq.<name>`, created on the broker that writes it and never
moved. A *logic queue* is what Kafka clients see as partition q of `<name>`: the sequence of its
physical queues, each covering a range of logic offsets. The *leader* item of a logic queue is its
newest (writable) physical queue, the *second leader* the one before it.

The source of truth is the TopicQueueMapping. It is kept as one copy per broker
(`MappingCopy`, the seed's per-broker mapping file), each naming its broker and carrying the
topic-wide epoch:

- leader completeness: the copy of the broker of a logic queue's leader item holds every item of
  that queue; the second leader's broker keeps its copy through its own (sealed) item;
- global epoch check: every update moves all copies from epoch e to e + 1, one write at a time;
  copies at different epochs mean an update did not finish, and further updates are refused
  until `repair` (or the resumption of the interrupted update) finishes it;
- self-identification: each copy names its broker (`bname`); a copy stored for another broker
  is detected and ignored.

Everything here is pure: the controller calls it between the I/O steps of a switch (closing or
sealing a physical queue, reading its end offset), the brokers call it to translate offsets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PHYSICAL_PREFIX = "__sq."
UNDECIDED = -1  # the logic offset of an item switched in with the availability order
MODES = ("strict", "available")
DEFAULT_JUMP = 1000  # availability switch: logic offsets may jump by at most this step


def physical_topic_name(name: str) -> str:
    """The hidden topic whose partitions are the physical queues of static topic `name`."""
    return PHYSICAL_PREFIX + name


def is_physical_topic(name: str) -> bool:
    return name.startswith(PHYSICAL_PREFIX)


class MappingError(ValueError):
    """A request the mapping cannot satisfy (unknown queue, bad target...)."""


class MappingConflict(MappingError):
    """The copies disagree (the global epoch check): updates are refused until repair."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            "the queue mapping copies disagree, refusing to update it: "
            + "; ".join(self.problems)
            + " (run `tidalmq static-topic repair` to finish the interrupted update)"
        )


class TotalQueuesFixed(MappingError):
    """A static topic's logic queue count never changes."""


# ----------------------------------------------------------------------------------- items
@dataclass(slots=True)
class MappingItem:
    """One physical queue's share of a logic queue (a mapping item of the seed)."""

    queue: int  # physical queue id: the partition of `__sq.<name>`
    broker: int  # the broker that writes it (the seed's bname)
    gen: int  # switch generation within the logic queue
    logic_offset: int  # logic offset of the item's first record; UNDECIDED while switching
    start_offset: int = 0  # physical offset of the item's first record
    end_offset: int = -1  # physical end (exclusive); -1 while the item is the writable leader
    time_of_start: int = -1  # ms; when the physical queue was created
    time_of_end: int = -1  # ms; max timestamp of its last batch, once sealed
    update_time: int = 0  # ms
    # availability order only: the logic offset producers are answered with before the item's
    # logic offset is fixed (the old leader's end as known at the switch plus a bounded jump)
    tentative_offset: int = -1

    @property
    def sealed(self) -> bool:
        return self.end_offset >= 0

    @property
    def decided(self) -> bool:
        return self.logic_offset >= 0

    @property
    def base(self) -> int:
        """The logic offset physical offsets are translated with (tentative while undecided)."""
        return self.logic_offset if self.decided else self.tentative_offset

    def logic_end(self, physical_end: int | None = None) -> int:
        """Logic offset after the item's last record (needs the physical end if not sealed)."""
        end = self.end_offset if self.sealed else physical_end
        if end is None:
            raise MappingError(f"item gen {self.gen} is not sealed: its end is not known")
        return self.base + (end - self.start_offset)

    def to_logic(self, physical: int) -> int:
        return self.base + (physical - self.start_offset)

    def to_physical(self, logic: int) -> int:
        return self.start_offset + (logic - self.base)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "queue": self.queue,
            "broker": self.broker,
            "gen": self.gen,
            "logicOffset": self.logic_offset,
            "startOffset": self.start_offset,
            "endOffset": self.end_offset,
            "timeOfStart": self.time_of_start,
            "timeOfEnd": self.time_of_end,
            "updateTime": self.update_time,
        }
        if self.tentative_offset >= 0:
            doc["tentativeOffset"] = self.tentative_offset
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MappingItem:
        return cls(
            queue=int(doc["queue"]),
            broker=int(doc["broker"]),
            gen=int(doc["gen"]),
            logic_offset=int(doc["logicOffset"]),
            start_offset=int(doc.get("startOffset", 0)),
            end_offset=int(doc.get("endOffset", -1)),
            time_of_start=int(doc.get("timeOfStart", -1)),
            time_of_end=int(doc.get("timeOfEnd", -1)),
            update_time=int(doc.get("updateTime", 0)),
            tentative_offset=int(doc.get("tentativeOffset", -1)),
        )

    def copy(self) -> MappingItem:
        return MappingItem.from_json(self.to_json())


def leader(items: Sequence[MappingItem]) -> MappingItem | None:
    return items[-1] if items else None


def second_leader(items: Sequence[MappingItem]) -> MappingItem | None:
    return items[-2] if len(items) >= 2 else None


# ------------------------------------------------------------------------ offset algebra
def locate(items: Sequence[MappingItem], logic: int) -> int | None:
    """Index of the item that serves logic offset `logic` (reads start there).

    Offsets below the first item map to the first item (the caller decides whether that is out
    of range); offsets in the hole left by an availability switch map to the next item (whose
    first batch then starts above the requested offset, as after compaction in Kafka); offsets
    at or beyond the leader's start map to the leader. None only for an empty mapping.
    """
    if not items:
        return None
    for i, item in enumerate(items):
        if not item.sealed:
            return i  # the leader (or an item still being sealed): it holds the rest
        if not item.decided:
            return i
        if logic < item.logic_end():
            return i
    return len(items) - 1


def logic_high_watermark(items: Sequence[MappingItem], physical_end: int) -> int:
    """The logic end of a logic queue (what Fetch and ListOffsets answer as its high watermark)
    when its leader item's physical queue ends at `physical_end`. While the leader's logic
    offset is undecided (an availability switch), records appended to it are not visible yet:
    the end is the previous item's. Never below the leader's first logic offset (a physical end
    below the item's start, e.g. a floor not raised yet, reads as an empty item).

    The one translation of physical ends to logic ones: `LogicQueueLog` applies it to the live
    high watermark, the group coordinator's consumer lag to that or to the acknowledged end the
    metadata holds for a physical queue led elsewhere."""
    if not items:
        return 0
    leader = items[-1]
    if leader.decided:
        return leader.to_logic(max(physical_end, leader.start_offset))
    prev = items[-2] if len(items) >= 2 else None
    if prev is not None and prev.sealed and prev.decided:
        return prev.logic_end()
    return max(prev.logic_offset if prev is not None else 0, 0)


def earliest(items: Sequence[MappingItem], log_starts: Mapping[int, int] | None = None) -> int:
    """The first logic offset still readable: the oldest item's first record (or the first one
    its physical log start has not deleted). `log_starts` maps physical queue -> log start."""
    for item in items:
        start = max(item.start_offset, (log_starts or {}).get(item.queue, item.start_offset))
        if item.sealed and start >= item.end_offset:
            continue  # nothing of it is left
        if not item.decided:
            continue
        return item.to_logic(start)
    last = items[-1] if items else None
    if last is None:
        return 0
    if last.sealed and last.decided:
        return last.logic_end()
    return max(last.base, 0)


def time_candidates(items: Sequence[MappingItem], timestamp_ms: int) -> list[MappingItem]:
    """Items to search, in order, for the first record with a timestamp >= timestamp_ms: the
    search skips every sealed item whose last timestamp is older (seed: search the items by
    their time range first, then inside the physical queue)."""
    out = []
    for item in items:
        if item.sealed and 0 <= item.time_of_end < timestamp_ms:
            continue
        out.append(item)
    return out


def check_order(items: Sequence[MappingItem], queue: int) -> list[str]:
    """Invariants of one logic queue's items: gens increase, only the last may be unsealed,
    logic ranges never overlap (offsets never go backwards)."""
    problems = []
    prev: MappingItem | None = None
    for i, item in enumerate(items):
        if prev is not None:
            if item.gen <= prev.gen:
                problems.append(f"queue {queue}: gen {item.gen} follows gen {prev.gen}")
            if (
                prev.sealed
                and prev.decided
                and item.decided
                and item.logic_offset < prev.logic_end()
            ):
                problems.append(
                    f"queue {queue}: gen {item.gen} starts at logic offset {item.logic_offset}, "
                    f"before gen {prev.gen} ends at {prev.logic_end()}"
                )
        if item.end_offset >= 0 and item.end_offset < item.start_offset:
            problems.append(f"queue {queue}: gen {item.gen} ends before it starts")
        if i < len(items) - 1 and not item.sealed:
            problems.append(
                f"queue {queue}: gen {item.gen} (physical queue {item.queue} on broker "
                f"{item.broker}) is not sealed but is not the last item"
            )
        prev = item
    return problems


# ---------------------------------------------------------------------------- the copies
@dataclass(slots=True)
class MappingCopy:
    """One broker's copy of the TopicQueueMapping (the seed's TopicQueueMappingDetail)."""

    bname: int  # the broker this copy belongs to (self-identification)
    epoch: int
    total_queues: int
    hosted: dict[int, list[MappingItem]] = field(default_factory=dict)
    version: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "bname": self.bname,
            "epoch": self.epoch,
            "totalQueues": self.total_queues,
            "hostedQueues": {
                str(q): [i.to_json() for i in items] for q, items in sorted(self.hosted.items())
            },
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MappingCopy:
        return cls(
            bname=int(doc["bname"]),
            epoch=int(doc["epoch"]),
            total_queues=int(doc["totalQueues"]),
            hosted={
                int(q): [MappingItem.from_json(i) for i in items]
                for q, items in doc.get("hostedQueues", {}).items()
            },
            version=int(doc.get("version", 1)),
        )

    def leads(self, queue: int) -> bool:
        """This copy claims the leader of `queue`: its last item is unsealed and its own."""
        items = self.hosted.get(queue)
        return (
            items is not None
            and bool(items)
            and not items[-1].sealed
            and items[-1].broker == self.bname
        )


@dataclass(slots=True)
class MappingView:
    """The copies assembled: per logic queue its items (merged across copies), and what is
    wrong with the copies, if anything."""

    epoch: int
    total_queues: int
    queues: dict[int, list[MappingItem]]
    problems: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # misplaced copies

    @property
    def consistent(self) -> bool:
        return not self.problems

    def items(self, queue: int) -> list[MappingItem]:
        return self.queues.get(queue, [])

    def leader(self, queue: int) -> MappingItem | None:
        return leader(self.items(queue))

    def writable(self) -> set[int]:
        """Physical queues that are some logic queue's unsealed item (the ones a broker should
        have open; every other physical queue is sealed and read from object storage)."""
        return {items[-1].queue for items in self.queues.values() if items and not items[-1].sealed}

    def physical_queues(self) -> dict[int, tuple[int, MappingItem]]:
        """physical queue id -> (logic queue, item)."""
        out = {}
        for q, items in self.queues.items():
            for item in items:
                out[item.queue] = (q, item)
        return out


def _better(a: MappingItem, b: MappingItem) -> MappingItem:
    """Of two versions of the same item, the one that knows more (sealed, decided, newer)."""

    def rank(i: MappingItem) -> tuple[int, int, int]:
        return (int(i.sealed), int(i.decided), i.update_time)

    return a if rank(a) >= rank(b) else b


def assemble(copies: Mapping[int, MappingCopy], total_queues: int) -> MappingView:
    """Merge the copies and run the Global Epoch Check."""
    problems: list[str] = []
    ignored: list[str] = []
    good: dict[int, MappingCopy] = {}
    for key, copy_ in sorted(copies.items()):
        if copy_.bname != key:
            ignored.append(
                f"the copy stored for broker {key} names broker {copy_.bname}: a misplaced copy, "
                "ignored"
            )
            continue
        good[key] = copy_
    epochs = {b: c.epoch for b, c in good.items()}
    epoch = max(epochs.values(), default=0)
    if len(set(epochs.values())) > 1:
        detail = ", ".join(f"broker {b} at {e}" for b, e in sorted(epochs.items()))
        problems.append(f"copies are at different epochs ({detail}): an update did not finish")
    for b, c in sorted(good.items()):
        if c.total_queues != total_queues:
            problems.append(f"broker {b}'s copy has {c.total_queues} queues, not {total_queues}")
    queues: dict[int, list[MappingItem]] = {}
    for q in range(total_queues):
        by_gen: dict[int, MappingItem] = {}
        claims = []
        for b, c in sorted(good.items()):
            for item in c.hosted.get(q, []):
                if item.broker < 0:
                    continue
                known = by_gen.get(item.gen)
                if known is not None and (known.queue, known.broker) != (item.queue, item.broker):
                    problems.append(
                        f"queue {q} gen {item.gen}: broker {b}'s copy names physical queue "
                        f"{item.queue} on broker {item.broker}, another copy {known.queue} on "
                        f"broker {known.broker}"
                    )
                    continue
                by_gen[item.gen] = item.copy() if known is None else _better(known, item).copy()
            if c.leads(q):
                claims.append(b)
        items = [by_gen[g] for g in sorted(by_gen)]
        queues[q] = items
        if not items:
            problems.append(f"queue {q} is in no copy")
            continue
        last = items[-1]
        if len(claims) > 1:
            problems.append(f"queue {q} is claimed by the copies of brokers {claims}")
        elif not claims:
            if last.sealed:
                problems.append(
                    f"queue {q} has no writable item: its leader gen {last.gen} on broker "
                    f"{last.broker} is sealed (a switch was interrupted)"
                )
            else:
                problems.append(
                    f"queue {q}: the copy of broker {last.broker} lacks its leader item gen "
                    f"{last.gen} (leader completeness)"
                )
        problems.extend(check_order(items, q))
    return MappingView(epoch, total_queues, queues, problems, ignored)


def distribute(
    queues: Mapping[int, Sequence[MappingItem]],
    total_queues: int,
    epoch: int,
    brokers: Iterable[int] = (),
) -> dict[int, MappingCopy]:
    """The copies of a consistent mapping at `epoch`: the leader's broker keeps a queue's full
    item list, the second leader's broker its list through its own item (its copy from when it
    led, sealed), every other broker none of it (the seed's cleanup of mappings older than two
    generations). Brokers in `brokers` get a copy even when they host nothing, so that the
    epoch check can see them."""
    copies: dict[int, MappingCopy] = {}

    def copy_for(b: int) -> MappingCopy:
        if b not in copies:
            copies[b] = MappingCopy(b, epoch, total_queues)
        return copies[b]

    for b in brokers:
        copy_for(b)
    for q, items in sorted(queues.items()):
        if not items:
            continue
        lead = items[-1]
        copy_for(lead.broker).hosted[q] = [i.copy() for i in items]
        second = second_leader(items)
        if second is not None and second.broker != lead.broker:
            copy_for(second.broker).hosted[q] = [i.copy() for i in items[:-1]]
    return copies


# ------------------------------------------------------------------------- the topic state
@dataclass(slots=True)
class StaticTopicState:
    """A static topic in the cluster metadata: its configuration and the mapping copies."""

    name: str
    total_queues: int
    brokers: list[int] | None  # None: every live broker may host its physical queues
    copies: dict[int, MappingCopy] = field(default_factory=dict)
    jump: int = DEFAULT_JUMP
    # physical queues whose data is gone (expired items), kept so their ids are never reused
    retired: list[int] = field(default_factory=list)

    def view(self) -> MappingView:
        return assemble(self.copies, self.total_queues)

    def epoch(self) -> int:
        return max((c.epoch for c in self.copies.values()), default=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "total_queues": self.total_queues,
            "brokers": None if self.brokers is None else list(self.brokers),
            "copies": {str(b): c.to_json() for b, c in sorted(self.copies.items())},
            "jump": self.jump,
            "retired": list(self.retired),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StaticTopicState:
        brokers = doc.get("brokers")
        return cls(
            name=doc["name"],
            total_queues=int(doc["total_queues"]),
            brokers=None if brokers is None else [int(b) for b in brokers],
            copies={int(b): MappingCopy.from_json(c) for b, c in doc.get("copies", {}).items()},
            jump=int(doc.get("jump", DEFAULT_JUMP)),
            retired=[int(r) for r in doc.get("retired", [])],
        )


def initial_mapping(
    name: str,
    total_queues: int,
    placement: Sequence[int],
    *,
    brokers: list[int] | None,
    now_ms: int,
    copy_brokers: Iterable[int] = (),
) -> StaticTopicState:
    """A new static topic: logic queue q starts as physical queue q on broker placement[q]."""
    if len(placement) != total_queues:
        raise MappingError(f"{len(placement)} placements for {total_queues} queues")
    queues = {
        q: [MappingItem(q, b, 0, 0, time_of_start=now_ms, update_time=now_ms)]
        for q, b in enumerate(placement)
    }
    state = StaticTopicState(name, total_queues, brokers)
    state.copies = distribute(queues, total_queues, 0, {*copy_brokers, *placement})
    return state


def require_consistent(state: StaticTopicState) -> MappingView:
    view = state.view()
    if not view.consistent:
        raise MappingConflict(view.problems)
    return view


# ------------------------------------------------------------------------------- switches
# A switch moves a logic queue's writes to a new physical queue on another broker. The
# controller runs the steps below as separate writes, with I/O between them: closing the old
# physical queue on its broker (or sealing it from object storage if that broker is dead) to
# learn its end offset. Every step moves the copies it writes from epoch e to e + 1; `finish`
# brings all copies to e + 1. A crash between steps leaves the copies at different epochs (the
# check refuses further updates) with every item in at least one copy, and the older items in
# two: `repair` (`finish` of the merged copies) completes the switch.
#
# strict ("block old, then switch"):
#     close the old physical queue -> block_old(end) -> switch_strict -> finish
# available ("switch new, block old, switch new"):
#     switch_new (new queue writable, logic offset undecided; producers are answered with
#     the tentative offset: old end as known + jump) -> close the old physical queue ->
#     block_old(end) -> fix_new (logic offset = max(tentative, old end): offsets may jump by
#     a bounded step, never go backwards) -> finish


def _copy_of(state: StaticTopicState, broker: int, epoch: int) -> MappingCopy:
    c = state.copies.get(broker)
    if c is None or c.bname != broker:
        c = MappingCopy(broker, epoch, state.total_queues)
        state.copies[broker] = c
    return c


def _leader_copy_items(state: StaticTopicState, queue: int) -> list[MappingItem]:
    view = state.view()
    items = view.items(queue)
    if not items:
        raise MappingError(f"logic queue {queue} has no items")
    return items


def switch_new(
    state: StaticTopicState,
    queue: int,
    target: int,
    new_queue: int,
    *,
    known_end: int,
    now_ms: int,
    target_epoch: int,
) -> MappingItem:
    """Availability order, step 1 ("switch new"): the new physical queue on `target` becomes
    the writable leader before the old one is blocked. Its logic offset stays undecided;
    producers are answered relative to `tentative = old logic end as known + jump`
    (`known_end`: the old physical queue's end as the controller last heard it). Writes the
    target's copy at `target_epoch`."""
    items = _leader_copy_items(state, queue)
    old = items[-1]
    if old.sealed or not old.decided:
        raise MappingError(f"logic queue {queue} is already switching")
    if old.broker == target:
        raise MappingError(f"logic queue {queue} is already on broker {target}")
    tentative = old.logic_end(max(known_end, old.start_offset)) + state.jump
    new = MappingItem(
        new_queue,
        target,
        old.gen + 1,
        UNDECIDED,
        0,
        time_of_start=now_ms,
        update_time=now_ms,
        tentative_offset=tentative,
    )
    copy_ = _copy_of(state, target, target_epoch)
    copy_.hosted[queue] = [*(i.copy() for i in items), new]
    copy_.epoch = target_epoch
    return new


def block_old(
    state: StaticTopicState,
    queue: int,
    gen: int,
    *,
    end_offset: int,
    time_of_end: int,
    now_ms: int,
    target_epoch: int,
) -> None:
    """Step 'block old': record the end of the (closed) physical queue of generation `gen` in
    its broker's copy (which keeps the queue's items through that generation) at
    `target_epoch`."""
    items = [i.copy() for i in _leader_copy_items(state, queue)]
    idx = next((k for k, i in enumerate(items) if i.gen == gen), None)
    if idx is None:
        raise MappingError(f"logic queue {queue} has no gen {gen}")
    old = items[idx]
    if end_offset < old.start_offset:
        raise MappingError(f"queue {queue} gen {gen}: end {end_offset} < start {old.start_offset}")
    old.end_offset = end_offset
    old.time_of_end = time_of_end
    old.update_time = now_ms
    copy_ = _copy_of(state, old.broker, target_epoch)
    mine = copy_.hosted.get(queue)
    # the old broker's copy keeps what it knew; a later item it hosts stays (it may lead again)
    keep = items[: idx + 1]
    if mine:
        keep += [i for i in mine if i.gen > gen]
    copy_.hosted[queue] = keep
    copy_.epoch = target_epoch
    # a copy already written in this update (the new leader's, availability order) learns
    # the end too; copies still at the old epoch are left as they were
    for c in state.copies.values():
        if c is copy_ or c.epoch != target_epoch:
            continue
        for i in c.hosted.get(queue, []):
            if i.gen == gen:
                i.end_offset, i.time_of_end, i.update_time = end_offset, time_of_end, now_ms


def switch_strict(
    state: StaticTopicState,
    queue: int,
    target: int,
    new_queue: int,
    *,
    now_ms: int,
    target_epoch: int,
) -> MappingItem:
    """Strict order, step 2: after block_old, the new physical queue on `target` continues at
    exactly the logic offset where the old one ended (no hole)."""
    items = _leader_copy_items(state, queue)
    old = items[-1]
    if not old.sealed:
        raise MappingError(f"logic queue {queue}: gen {old.gen} is not blocked yet")
    new = MappingItem(
        new_queue,
        target,
        old.gen + 1,
        old.logic_end(),
        0,
        time_of_start=now_ms,
        update_time=now_ms,
    )
    copy_ = _copy_of(state, target, target_epoch)
    copy_.hosted[queue] = [*(i.copy() for i in items), new]
    copy_.epoch = target_epoch
    return new


def fix_new(state: StaticTopicState, queue: int, *, now_ms: int, target_epoch: int) -> int:
    """Availability order, step 3: decide the new item's logic offset once the old one is
    blocked: the tentative offset producers were answered with, unless the old queue took more
    records than the jump allowed (then its end: offsets still never go backwards). Returns the
    jump (hole size) consumers will see."""
    items = _leader_copy_items(state, queue)
    new = items[-1]
    if new.decided:
        return 0
    prev = second_leader(items)
    if prev is None or not prev.sealed:
        raise MappingError(f"logic queue {queue}: the previous item is not blocked yet")
    end = prev.logic_end()
    fixed = max(new.tentative_offset, end)
    copy_ = _copy_of(state, new.broker, target_epoch)
    copy_.hosted[queue] = [i.copy() for i in items]
    copy_.hosted[queue][-1].logic_offset = fixed
    copy_.hosted[queue][-1].update_time = now_ms
    copy_.epoch = target_epoch
    return fixed - end


def finish(
    state: StaticTopicState, *, copy_brokers: Iterable[int] = (), target_epoch: int | None = None
) -> MappingView:
    """The last step of every update (and of `repair`): merge the copies, check the result, and
    rewrite every copy at one epoch, at least as high as any copy's. `copy_brokers` get a copy
    even if they host nothing (the topic's broker set), besides every broker hosting an item.
    Raises MappingConflict if the merged mapping is not sound yet (an unsealed old item, a
    sealed or undecided leader: the caller finishes those switches first)."""
    merged = state.view()
    problems = []
    for q, items in merged.queues.items():
        problems.extend(check_order(items, q))
        if not items:
            problems.append(f"queue {q} is in no copy")
        elif items[-1].sealed:
            problems.append(f"queue {q}: its last item gen {items[-1].gen} is sealed")
        elif not items[-1].decided:
            problems.append(f"queue {q}: the logic offset of gen {items[-1].gen} is undecided")
    if problems:
        raise MappingConflict(problems)
    epoch = merged.epoch + 1 if target_epoch is None else max(target_epoch, merged.epoch)
    state.copies = distribute(merged.queues, state.total_queues, epoch, copy_brokers)
    return state.view()


def pending_work(view: MappingView) -> dict[str, list[tuple[int, MappingItem]]]:
    """What `repair` must do with I/O before `finish` can succeed:
    - "seal": unsealed items that are not last (an interrupted availability switch), and
    - "reopen": sealed last items (an interrupted strict switch: a new item must follow),
    - "fix": undecided last items whose predecessor is sealed."""
    out: dict[str, list[tuple[int, MappingItem]]] = {"seal": [], "reopen": [], "fix": []}
    for q, items in sorted(view.queues.items()):
        for item in items[:-1]:
            if not item.sealed:
                out["seal"].append((q, item))
        if items:
            last = items[-1]
            if last.sealed:
                out["reopen"].append((q, last))
            elif not last.decided:
                out["fix"].append((q, last))
    return out


# ------------------------------------------------------------------------------- cleanup
def expired_items(
    view: MappingView, *, now_ms: int, retention_ms: int, empty_grace_ms: int = 60_000
) -> list[tuple[int, MappingItem]]:
    """Sealed items the seed's cleanup removes: those whose every record is older than
    retention, and empty ones (switched away from before anything was written) after a grace
    period. Never a leader. Their physical queues can be deleted."""
    out = []
    for q, items in sorted(view.queues.items()):
        for item in items[:-1]:
            if not item.sealed:
                continue
            expired = retention_ms >= 0 and 0 <= item.time_of_end < now_ms - retention_ms
            empty = (
                item.end_offset == item.start_offset and item.update_time < now_ms - empty_grace_ms
            )
            if expired or empty:
                out.append((q, item))
    return out


def drop_items(state: StaticTopicState, doomed: Iterable[tuple[int, MappingItem]]) -> None:
    """Remove items from every copy (after their physical queues were deleted)."""
    gone = {(q, i.gen) for q, i in doomed}
    for c in state.copies.values():
        for q in list(c.hosted):
            c.hosted[q] = [i for i in c.hosted[q] if (q, i.gen) not in gone]
            if not c.hosted[q]:
                del c.hosted[q]
    for _, item in doomed:
        if item.queue not in state.retired:
            state.retired.append(item.queue)


# ------------------------------------------------------------------------------ placement
def plan_placement(
    leaders: Mapping[int, int | None], brokers: Sequence[int], pins: Mapping[int, int] = {}
) -> dict[int, int]:
    """Which logic queues should move where so the queues spread evenly over `brokers`
    (each within one of the average), moving as few as possible; `pins` (queue -> broker,
    explicit remap requests) win. Returns queue -> new broker for the queues that move."""
    live = sorted(set(brokers))
    if not live:
        raise MappingError("no broker to place the logic queues on")
    moves: dict[int, int] = {}
    current: dict[int, int | None] = {}
    for q, b in leaders.items():
        want = pins.get(q)
        if want is not None:
            if want != b:
                moves[q] = want
            continue
        current[q] = b if b in live else None
    pinned = Counter(pins[q] for q in leaders if q in pins)
    total = len(leaders)
    base, extra = divmod(total, len(live))
    counts = Counter(b for b in current.values() if b is not None)
    for b, n in pinned.items():
        counts[b] += n
    # targets: floor or ceil of the average, ceilings to the brokers holding most already
    order = sorted(live, key=lambda b: (-counts.get(b, 0), b))
    targets = {b: base + (1 if i < extra else 0) for i, b in enumerate(order)}
    surplus: list[int] = [q for q, b in sorted(current.items()) if b is None]
    holding: dict[int, list[int]] = {b: [] for b in live}
    for q, b in sorted(current.items()):
        if b is not None:
            holding[b].append(q)
    for b in live:
        excess = counts.get(b, 0) - targets[b]
        while excess > 0 and holding[b]:
            surplus.append(holding[b].pop())
            counts[b] -= 1
            excess -= 1
    for q in sorted(surplus):
        target = min(live, key=lambda b: (counts.get(b, 0) - targets[b], b))
        counts[target] += 1
        if leaders[q] != target:
            moves[q] = target
    return moves


def placement_of(view: MappingView) -> dict[int, int | None]:
    return {q: (items[-1].broker if items else None) for q, items in view.queues.items()}


def complete(
    state: StaticTopicState,
    *,
    ends: Mapping[int, tuple[int, int]],
    targets: Mapping[int, int],
    allocate: Callable[[int, int], int],
    now_ms: int,
    target_epoch: int,
    copy_brokers: Iterable[int] = (),
) -> MappingView:
    """Finish every switch the copies show in progress, given the end (physical end offset,
    time of end) of each physical queue that has been closed or sealed meanwhile (`ends`, by
    physical queue id). For each logic queue, in order:

    - block_old for every item that is closed but not recorded as sealed yet;
    - a sealed last item gets a successor on `targets[q]` (default: the same broker) at exactly
      its logic end (strict order), on the physical queue `allocate(q, broker)` returns;
    - an undecided last item gets its logic offset fixed (availability order);

    then `finish` rewrites every copy at `target_epoch`. This is both the end of a normal
    update and `repair` of an interrupted one. Raises MappingError if an item that must be
    sealed has no end in `ends` (its physical queue is still open: close it first)."""
    view = state.view()
    for q, items in sorted(view.queues.items()):
        for item in items:
            if item.sealed or item.queue not in ends:
                continue
            end, time_of_end = ends[item.queue]
            block_old(
                state,
                q,
                item.gen,
                end_offset=end,
                time_of_end=time_of_end,
                now_ms=now_ms,
                target_epoch=target_epoch,
            )
    work = pending_work(state.view())
    if work["seal"]:
        missing = ", ".join(f"queue {q} gen {i.gen} (physical {i.queue})" for q, i in work["seal"])
        raise MappingError(f"not sealed yet: {missing}")
    for q, last in work["reopen"]:
        target = targets.get(q, last.broker)
        new_queue = allocate(q, target)
        switch_strict(state, q, target, new_queue, now_ms=now_ms, target_epoch=target_epoch)
    for q, _ in work["fix"]:
        fix_new(state, q, now_ms=now_ms, target_epoch=target_epoch)
    return finish(state, copy_brokers=copy_brokers, target_epoch=target_epoch)
