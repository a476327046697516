"""The state of one transactional id and the transitions the coordinator allows (KIP-98).

Pure: no I/O, no clock of its own (every call takes `now_ms`), so the rules are unit-tested with
a fake clock. A transition returns the new metadata to log to `__transaction_state`; the caller
makes it durable and only then makes it the current state (what replay would rebuild).

    Empty -> Ongoing                      (AddPartitionsToTxn / AddOffsetsToTxn)
    Ongoing -> PrepareCommit|PrepareAbort (EndTxn, or a timeout / a new incarnation: abort)
    Prepare* -> Complete*                 (every partition has its marker)
    Complete*|Empty -> Ongoing            (the next transaction)

Transaction version 2 (KIP-890 part 2, docs/transactions-v2.md): a transaction started by an
implicit add (Produce v12, TxnOffsetCommit v5) or ended by EndTxn v5, on a cluster whose
`transaction.version` is 2, bumps the producer epoch at Ongoing -> Prepare* (a new producer id
at Complete* when the epoch is exhausted) and tells retries apart by the epoch.

Writing Prepare* is the point of no return: from then on the markers are written, whoever
coordinates (a new coordinator finds Prepare* when it replays the partition and resumes).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from kio.schema.errors import ErrorCode

MAX_EPOCH = 32767  # Short.MaxValue: the epoch is exhausted one below it (Kafka's rule)
TV2 = 2  # the client transaction version that bumps the epoch per transaction


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def idle(self) -> bool:
        """No transaction open: a new one may start."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


class TxnError(Exception):
    """A request the state refuses, with the Kafka code to answer."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    # the epoch before the last bump (KIP-360: a producer whose transaction the coordinator
    # aborted may recover with its old (id, epoch)); -1 when none
    last_producer_epoch: int = -1
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    start_ms: int = -1  # when the ongoing transaction started
    update_ms: int = -1
    # the client transaction version of the last transition (Kafka's clientTransactionVersion):
    # TV2 when the transaction was started by an implicit add or ended by EndTxn v5 at
    # transaction.version 2, 0 otherwise (versions 0 and 1 behave alike here)
    txn_version: int = 0
    # TV2 at an exhausted epoch: the producer id the transaction's Complete* moves to (-1: none),
    # and the one it moved from (a retried EndTxn of the old id is recognised by it)
    next_producer_id: int = -1
    previous_producer_id: int = -1

    def expired(self, now_ms: int) -> bool:
        return self.state is TxnState.ONGOING and now_ms > self.start_ms + self.timeout_ms


def check_producer(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> None:
    """The request's producer must be the current incarnation: a different id is an unknown
    or replaced producer, an older epoch a zombie."""
    if producer_id != meta.producer_id:
        raise TxnError(ErrorCode.invalid_producer_id_mapping)
    if producer_epoch != meta.producer_epoch:
        raise TxnError(ErrorCode.producer_fenced)


def new_producer(
    transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int
) -> TxnMetadata:
    return TxnMetadata(transactional_id, producer_id, 0, timeout_ms, update_ms=now_ms)


def bump_epoch(meta: TxnMetadata) -> TxnMetadata | None:
    """The next epoch of the same producer id; None when the epoch is exhausted (the caller
    allocates a new producer id, as Kafka does)."""
    if meta.producer_epoch >= MAX_EPOCH - 1:
        return None
    return replace(
        meta, producer_epoch=meta.producer_epoch + 1, last_producer_epoch=meta.producer_epoch
    )


def reinit(
    meta: TxnMetadata,
    *,
    timeout_ms: int,
    now_ms: int,
    expected: tuple[int, int] | None,
) -> TxnMetadata | None:
    """InitProducerId for an id whose transaction is finished: the same producer id with the
    epoch bumped (None: exhausted, a new producer id is needed). `expected` is the (producer id,
    epoch) a KIP-360 client sends to recover; it must be the current incarnation, or the one
    just before a bump the coordinator made itself (a timeout abort)."""
    if not meta.state.idle:
        raise TxnError(ErrorCode.concurrent_transactions)
    if expected is not None and expected[0] >= 0:
        pid, epoch = expected
        if pid != meta.producer_id:
            raise TxnError(ErrorCode.producer_fenced)
        if epoch != meta.producer_epoch and epoch != meta.last_producer_epoch:
            raise TxnError(ErrorCode.producer_fenced)
    bumped = bump_epoch(meta)
    if bumped is None:
        return None
    return replace(
        bumped,
        timeout_ms=timeout_ms,
        state=TxnState.EMPTY,
        partitions=frozenset(),
        start_ms=-1,
        update_ms=now_ms,
    )


def add_partitions(
    meta: TxnMetadata,
    producer_id: int,
    producer_epoch: int,
    partitions: set[tuple[str, int]],
    now_ms: int,
    *,
    tv2: bool = False,
) -> TxnMetadata | None:
    """The partitions join the transaction (starting it if none is open). None: nothing to log
    (every partition is already in it). `tv2`: the implicit add of a TV2 client (Produce v12,
    TxnOffsetCommit v5), which marks the transaction as TV2."""
    if meta.state.preparing and producer_id == meta.next_producer_id >= 0:
        # a TV2 client already has the new producer id of an epoch overflow, whose markers
        # are still going out: retriable, as for the same producer id
        raise TxnError(ErrorCode.concurrent_transactions)
    check_producer(meta, producer_id, producer_epoch)
    if meta.state.preparing:
        raise TxnError(ErrorCode.concurrent_transactions)
    version = TV2 if tv2 else meta.txn_version if meta.state is TxnState.ONGOING else 0
    if meta.state is TxnState.ONGOING:
        if partitions <= meta.partitions and version == meta.txn_version:
            return None
        return replace(
            meta, partitions=meta.partitions | partitions, update_ms=now_ms, txn_version=version
        )
    return replace(
        meta,
        state=TxnState.ONGOING,
        partitions=frozenset(partitions),
        start_ms=now_ms,
        update_ms=now_ms,
        txn_version=version,
    )


def verify_partitions(
    meta: TxnMetadata | None,
    producer_id: int,
    producer_epoch: int,
    partitions: set[tuple[str, int]],
) -> dict[tuple[str, int], ErrorCode]:
    """KIP-890's verify-only AddPartitionsToTxn (v4+, from a partition leader): is each
    partition in this producer's ongoing transaction? Changes nothing."""
    if meta is None or meta.producer_id != producer_id:
        return dict.fromkeys(partitions, ErrorCode.invalid_producer_id_mapping)
    if meta.producer_epoch != producer_epoch:
        return dict.fromkeys(partitions, ErrorCode.producer_fenced)
    ongoing = meta.state is TxnState.ONGOING
    return {
        tp: ErrorCode.none if ongoing and tp in meta.partitions else ErrorCode.transaction_abortable
        for tp in partitions
    }


def needs_new_producer_id(meta: TxnMetadata, producer_epoch: int, *, tv2: bool) -> bool:
    """A TV2 EndTxn of an ongoing transaction at an exhausted epoch: the caller allocates the
    producer id Complete* moves to and passes it to `prepare_end`."""
    return (
        tv2
        and meta.state is TxnState.ONGOING
        and producer_epoch == meta.producer_epoch >= MAX_EPOCH - 1
    )


def prepare_end(
    meta: TxnMetadata,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    now_ms: int,
    *,
    tv2: bool = False,
    next_producer_id: int = -1,
) -> TxnMetadata | None:
    """EndTxn: Ongoing -> Prepare*. None: the same end is already complete (a retried EndTxn,
    answered NONE). `tv2`: EndTxn v5 at transaction.version 2, which bumps the epoch (to
    MAX_EPOCH with `next_producer_id` when exhausted, see `needs_new_producer_id`)."""
    if meta.txn_version >= TV2:
        _check_tv2_end(meta, producer_id, producer_epoch)
    else:
        check_producer(meta, producer_id, producer_epoch)
    state = meta.state
    if state is TxnState.ONGOING:
        prepared = replace(
            meta,
            state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
            update_ms=now_ms,
        )
        if not tv2:
            return replace(prepared, txn_version=0)
        exhausted = meta.producer_epoch >= MAX_EPOCH - 1
        if exhausted != (next_producer_id >= 0):
            raise ValueError("a new producer id is needed exactly when the epoch is exhausted")
        return replace(
            prepared,
            producer_epoch=meta.producer_epoch + 1,
            last_producer_epoch=meta.producer_epoch,
            next_producer_id=next_producer_id,
            txn_version=TV2,
        )
    if state.preparing:
        raise TxnError(ErrorCode.concurrent_transactions)
    if (state is TxnState.COMPLETE_COMMIT and commit) or (
        state is TxnState.COMPLETE_ABORT and not commit
    ):
        return None
    raise TxnError(
        ErrorCode.invalid_txn_state,
        f"cannot {'commit' if commit else 'abort'} transaction in state {state.value}",
    )


def _check_tv2_end(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> None:
    """Kafka's EndTxn check for a TV2 transaction: "same state, same epoch" is the next
    transaction, so a retry is known by its epoch being the one before the bump (or, after an
    epoch overflow, by the previous producer id at the exhausted epoch)."""
    retry_on_overflow = (
        meta.previous_producer_id == producer_id
        and producer_epoch == MAX_EPOCH - 1
        and meta.producer_epoch == 0
    )
    retry_on_bump = meta.producer_epoch == producer_epoch + 1
    if meta.state.preparing:
        valid = retry_on_bump
    elif meta.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
        valid = retry_on_bump or retry_on_overflow
    else:
        valid = producer_epoch == meta.producer_epoch
    if meta.producer_id != producer_id and not retry_on_overflow:
        raise TxnError(ErrorCode.invalid_producer_id_mapping)
    if not valid:
        raise TxnError(ErrorCode.producer_fenced)


def end_answer(meta: TxnMetadata) -> tuple[int, int]:
    """The producer id and epoch EndTxn v5 answers: those of the producer's next transaction
    (after an overflow, the new producer id at epoch 0)."""
    if meta.next_producer_id >= 0:
        return meta.next_producer_id, 0
    return meta.producer_id, meta.producer_epoch


def fence_and_abort(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """The coordinator aborts an ongoing transaction itself (it timed out, or a new incarnation
    of the producer called InitProducerId): bump the epoch, so the old producer is fenced,
    and prepare the abort. At an exhausted epoch the abort keeps the epoch (the new producer id
    fences the old one afterwards)."""
    assert meta.state is TxnState.ONGOING
    bumped = bump_epoch(meta) or meta
    # aborted as a TV1 transaction: the one bump above fences the producer either way
    return replace(bumped, state=TxnState.PREPARE_ABORT, update_ms=now_ms, txn_version=0)


def complete(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Every partition has its marker: Prepare* -> Complete*, the partitions forgotten."""
    assert meta.state.preparing
    state = (
        TxnState.COMPLETE_COMMIT
        if meta.state is TxnState.PREPARE_COMMIT
        else TxnState.COMPLETE_ABORT
    )
    done = replace(meta, state=state, partitions=frozenset(), start_ms=-1, update_ms=now_ms)
    if meta.next_producer_id >= 0:  # a TV2 epoch overflow: the new producer id from now on
        return replace(
            done,
            producer_id=meta.next_producer_id,
            producer_epoch=0,
            last_producer_epoch=meta.producer_epoch,
            previous_producer_id=meta.producer_id,
            next_producer_id=-1,
        )
    return done


def expired(metas: list[TxnMetadata], now_ms: int) -> list[TxnMetadata]:
    """The ongoing transactions past their timeout, oldest first."""
    return sorted((m for m in metas if m.expired(now_ms)), key=lambda m: m.start_ms)


def id_expired(meta: TxnMetadata, now_ms: int, expiration_ms: int) -> bool:
    """Kafka's rule for forgetting a transactional id (transactional.id.expiration.ms): no
    transaction open and no change for that long."""
    return meta.state.idle and meta.update_ms + expiration_ms <= now_ms


def expired_ids(metas: list[TxnMetadata], now_ms: int, expiration_ms: int) -> list[TxnMetadata]:
    """The transactional ids to forget, least recently changed first."""
    return sorted(
        (m for m in metas if id_expired(m, now_ms, expiration_ms)), key=lambda m: m.update_ms
    )
