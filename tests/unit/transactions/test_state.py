"""The transaction state machine (transactions/state.py): what each request may do in each state,
fencing of older epochs, and timeouts against a fake clock."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.transactions import state as txn
from tidalmq_broker.transactions.records import (
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for_transactional_id,
)
from tidalmq_broker.transactions.state import TxnError, TxnState

T0 = 1_000_000
A, B = ("orders", 0), ("payments", 3)


def started() -> txn.TxnMetadata:
    meta = txn.new_producer("t1", 42, 60_000, T0)
    new = txn.add_partitions(meta, 42, 0, {A}, T0 + 5)
    assert new is not None
    return new


def code_of(call: object, *args: object, **kwargs: object) -> ErrorCode:
    with pytest.raises(TxnError) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return info.value.code


def test_a_transaction_starts_with_its_first_partition_and_grows() -> None:
    meta = started()
    assert (meta.state, meta.partitions, meta.start_ms) == (TxnState.ONGOING, {A}, T0 + 5)
    assert txn.add_partitions(meta, 42, 0, {A}, T0 + 9) is None  # nothing new to log
    grown = txn.add_partitions(meta, 42, 0, {B}, T0 + 9)
    assert grown is not None and grown.partitions == {A, B} and grown.start_ms == T0 + 5


def test_older_epochs_and_other_producer_ids_are_refused() -> None:
    meta = started()
    assert code_of(txn.add_partitions, meta, 42, 1, {B}, T0) == ErrorCode.producer_fenced
    assert code_of(txn.prepare_end, meta, 41, 0, True, T0) == ErrorCode.invalid_producer_id_mapping
    bumped = txn.reinit(
        txn.complete(txn.prepare_end(meta, 42, 0, True, T0), T0),  # type: ignore[arg-type]
        timeout_ms=1000,
        now_ms=T0,
        expected=None,
    )
    assert bumped is not None and (bumped.producer_epoch, bumped.last_producer_epoch) == (1, 0)
    assert code_of(txn.add_partitions, bumped, 42, 0, {A}, T0) == ErrorCode.producer_fenced


def test_end_prepares_then_completes_and_a_retry_is_answered() -> None:
    meta = started()
    prepared = txn.prepare_end(meta, 42, 0, True, T0 + 10)
    assert prepared is not None and prepared.state is TxnState.PREPARE_COMMIT
    # while markers are written, the producer waits
    assert code_of(txn.prepare_end, prepared, 42, 0, True, T0) == ErrorCode.concurrent_transactions
    assert code_of(txn.add_partitions, prepared, 42, 0, {B}, T0) == (
        ErrorCode.concurrent_transactions
    )
    done = txn.complete(prepared, T0 + 20)
    assert (done.state, done.partitions) == (TxnState.COMPLETE_COMMIT, frozenset())
    assert txn.prepare_end(done, 42, 0, True, T0) is None  # a retried commit: NONE
    assert code_of(txn.prepare_end, done, 42, 0, False, T0) == ErrorCode.invalid_txn_state
    empty = txn.new_producer("t1", 42, 60_000, T0)
    assert code_of(txn.prepare_end, empty, 42, 0, True, T0) == ErrorCode.invalid_txn_state


def test_timeouts_abort_with_a_bumped_epoch() -> None:
    meta = started()  # 60 s timeout from T0 + 5
    assert txn.expired([meta], T0 + 60_005) == []
    assert txn.expired([meta], T0 + 60_006) == [meta]
    aborted = txn.fence_and_abort(meta, T0 + 60_006)
    assert (aborted.state, aborted.producer_epoch, aborted.last_producer_epoch) == (
        TxnState.PREPARE_ABORT,
        1,
        0,
    )
    assert aborted.partitions == {A}  # the markers still go to its partitions
    # the fenced producer may recover with its old (id, epoch) once the abort completed
    done = txn.complete(aborted, T0 + 60_010)
    again = txn.reinit(done, timeout_ms=60_000, now_ms=T0, expected=(42, 0))
    assert again is not None and again.producer_epoch == 2
    assert code_of(txn.reinit, done, timeout_ms=1, now_ms=T0, expected=(42, 7)) == (
        ErrorCode.producer_fenced
    )
    assert code_of(txn.reinit, meta, timeout_ms=1, now_ms=T0, expected=None) == (
        ErrorCode.concurrent_transactions
    )


def test_an_id_expires_only_when_idle_for_the_expiration() -> None:
    week = 604_800_000
    fresh = txn.new_producer("t1", 42, 60_000, T0)  # Empty, changed at T0
    assert txn.id_expired(fresh, T0 + week, week)
    assert not txn.id_expired(fresh, T0 + week - 1, week)
    ongoing = started()  # an open transaction is never forgotten, however old
    assert not txn.id_expired(ongoing, T0 + 10 * week, week)
    preparing = txn.prepare_end(ongoing, 42, 0, True, T0 + 10)
    assert preparing is not None and not txn.id_expired(preparing, T0 + 10 * week, week)
    done = txn.complete(preparing, T0 + 20)
    assert txn.id_expired(done, T0 + 20 + week, week)
    assert not txn.id_expired(done, T0 + 19 + week, week)
    assert txn.expired_ids([done, ongoing, fresh], T0 + 10 * week, week) == [fresh, done]


def test_an_exhausted_epoch_needs_a_new_producer_id() -> None:
    meta = txn.new_producer("t1", 42, 1000, T0)
    old = txn.TxnMetadata("t1", 42, txn.MAX_EPOCH - 1, 1000)
    assert txn.reinit(old, timeout_ms=1000, now_ms=T0, expected=None) is None
    assert txn.reinit(meta, timeout_ms=1000, now_ms=T0, expected=None) is not None


def test_verify_only_answers_whether_the_partition_is_in_the_transaction() -> None:
    meta = started()
    assert txn.verify_partitions(meta, 42, 0, {A, B}) == {
        A: ErrorCode.none,
        B: ErrorCode.transaction_abortable,
    }
    assert txn.verify_partitions(meta, 42, 3, {A}) == {A: ErrorCode.producer_fenced}
    assert txn.verify_partitions(None, 42, 0, {A}) == {A: ErrorCode.invalid_producer_id_mapping}


def test_records_round_trip_and_ids_hash_as_kafka() -> None:
    meta = txn.add_partitions(started(), 42, 0, {B}, T0 + 7)
    assert meta is not None
    assert decode_key(encode_key("t1")) == "t1"
    assert decode_value("t1", encode_value(meta)) == meta
    # Utils.abs(id.hashCode()) % 50, computed by Java ("my-txn".hashCode() = -1061187895)
    assert partition_for_transactional_id("my-txn", 50) == 3
    assert partition_for_transactional_id("txn-\u00e9", 50) == 44
