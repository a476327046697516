"""Transaction version 2 (KIP-890 part 2) in the state machine (transactions/state.py): the
implicit add, the epoch bump per transaction at EndTxn v5, the new producer id at an exhausted
epoch, both kinds of retry Kafka recognises, fencing by epoch, and the state records; and that
transaction version 1 keeps its rules and its record bytes."""

from __future__ import annotations

import json

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.transactions import state as txn
from tidalmq_broker.transactions.records import decode_value, encode_value
from tidalmq_broker.transactions.state import MAX_EPOCH, TV2, TxnError, TxnState

T0 = 1_000_000
A, B = ("orders", 0), ("payments", 3)
PID, NEW_PID = 42, 77


def code_of(call: object, *args: object, **kwargs: object) -> ErrorCode:
    with pytest.raises(TxnError) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return info.value.code


def tv2_ongoing(epoch: int = 0) -> txn.TxnMetadata:
    meta = txn.TxnMetadata("t1", PID, epoch, 60_000, update_ms=T0)
    new = txn.add_partitions(meta, PID, epoch, {A}, T0 + 5, tv2=True)
    assert new is not None
    return new


def test_an_implicit_add_starts_a_tv2_transaction_and_tv1_adds_stay_tv1() -> None:
    meta = tv2_ongoing()
    assert (meta.state, meta.partitions, meta.txn_version) == (TxnState.ONGOING, {A}, TV2)
    assert txn.add_partitions(meta, PID, 0, {A}, T0 + 6, tv2=True) is None  # already in it
    tv1 = txn.add_partitions(txn.new_producer("t1", PID, 60_000, T0), PID, 0, {A}, T0)
    assert tv1 is not None and tv1.txn_version == 0
    # a stale epoch is fenced by the add itself, whatever the partition remembers
    assert code_of(txn.add_partitions, meta, PID, 1, {B}, T0, tv2=True) is ErrorCode.producer_fenced


def test_end_txn_v5_bumps_the_epoch_per_transaction() -> None:
    prepared = txn.prepare_end(tv2_ongoing(3), PID, 3, True, T0 + 10, tv2=True)
    assert prepared is not None
    assert (prepared.state, prepared.producer_epoch, prepared.last_producer_epoch) == (
        TxnState.PREPARE_COMMIT,
        4,
        3,
    )
    assert txn.end_answer(prepared) == (PID, 4)  # the client's next transaction runs at 4
    done = txn.complete(prepared, T0 + 20)
    assert (done.state, done.producer_id, done.producer_epoch) == (TxnState.COMPLETE_COMMIT, PID, 4)
    # the next transaction at the new epoch; a zombie at the old one is fenced
    nxt = txn.add_partitions(done, PID, 4, {B}, T0 + 30, tv2=True)
    assert nxt is not None and nxt.state is TxnState.ONGOING
    assert code_of(txn.add_partitions, done, PID, 3, {B}, T0, tv2=True) is ErrorCode.producer_fenced


def test_a_tv1_end_keeps_the_epoch() -> None:
    meta = txn.add_partitions(txn.new_producer("t1", PID, 60_000, T0), PID, 0, {A}, T0)
    assert meta is not None
    prepared = txn.prepare_end(meta, PID, 0, True, T0 + 1)
    assert prepared is not None and prepared.producer_epoch == 0
    assert txn.end_answer(prepared) == (PID, 0)
    done = txn.complete(prepared, T0 + 2)
    assert txn.prepare_end(done, PID, 0, True, T0 + 3) is None  # TV1 retry: same epoch


def test_retries_are_told_apart_by_the_epoch_before_the_bump() -> None:
    prepared = txn.prepare_end(tv2_ongoing(3), PID, 3, False, T0 + 10, tv2=True)
    assert prepared is not None
    # a retry (epoch 3) while the markers go out: retriable; the current epoch is fenced
    assert code_of(txn.prepare_end, prepared, PID, 3, False, T0, tv2=True) is (
        ErrorCode.concurrent_transactions
    )
    assert code_of(txn.prepare_end, prepared, PID, 4, False, T0, tv2=True) is (
        ErrorCode.producer_fenced
    )
    done = txn.complete(prepared, T0 + 20)
    assert txn.prepare_end(done, PID, 3, False, T0 + 21, tv2=True) is None  # answered NONE
    assert txn.end_answer(done) == (PID, 4)
    # the other outcome of the same transaction is an invalid transition
    assert code_of(txn.prepare_end, done, PID, 3, True, T0, tv2=True) is ErrorCode.invalid_txn_state
    # "same state, same epoch" is the next transaction with nothing in it: fenced, as Kafka
    assert code_of(txn.prepare_end, done, PID, 4, False, T0, tv2=True) is (
        ErrorCode.producer_fenced
    )
    assert code_of(txn.prepare_end, done, PID, 2, False, T0, tv2=True) is (
        ErrorCode.producer_fenced
    )


def test_an_exhausted_epoch_moves_to_a_new_producer_id_at_completion() -> None:
    meta = tv2_ongoing(MAX_EPOCH - 1)
    assert txn.needs_new_producer_id(meta, MAX_EPOCH - 1, tv2=True)
    assert not txn.needs_new_producer_id(meta, MAX_EPOCH - 1, tv2=False)
    assert not txn.needs_new_producer_id(tv2_ongoing(5), 5, tv2=True)
    with pytest.raises(ValueError):  # the caller must allocate first
        txn.prepare_end(meta, PID, MAX_EPOCH - 1, True, T0, tv2=True)
    prepared = txn.prepare_end(
        meta, PID, MAX_EPOCH - 1, True, T0 + 10, tv2=True, next_producer_id=NEW_PID
    )
    assert prepared is not None
    # markers go out with the old producer id at the last epoch; the answer is the new id
    assert (prepared.producer_id, prepared.producer_epoch) == (PID, MAX_EPOCH)
    assert txn.end_answer(prepared) == (NEW_PID, 0)
    # the client already holding the new id gets a retriable answer while markers go out
    assert code_of(txn.add_partitions, prepared, NEW_PID, 0, {B}, T0, tv2=True) is (
        ErrorCode.concurrent_transactions
    )
    done = txn.complete(prepared, T0 + 20)
    assert (done.producer_id, done.producer_epoch, done.previous_producer_id) == (NEW_PID, 0, PID)
    assert done.next_producer_id == -1
    # a retry with the old id at the exhausted epoch (retryOnOverflow) is answered NONE
    assert txn.prepare_end(done, PID, MAX_EPOCH - 1, True, T0 + 21, tv2=True) is None
    assert txn.end_answer(done) == (NEW_PID, 0)
    assert code_of(txn.prepare_end, done, PID, 5, True, T0, tv2=True) is (
        ErrorCode.invalid_producer_id_mapping
    )
    nxt = txn.add_partitions(done, NEW_PID, 0, {A}, T0 + 30, tv2=True)
    assert nxt is not None and nxt.state is TxnState.ONGOING


def test_a_timeout_still_fences_a_tv2_producer() -> None:
    meta = tv2_ongoing(3)
    aborting = txn.fence_and_abort(meta, T0 + 70_000)
    assert (aborting.state, aborting.producer_epoch) == (TxnState.PREPARE_ABORT, 4)
    done = txn.complete(aborting, T0 + 70_001)
    # aborted as TV1 with one bump (as before TV2): the producer at its epoch (3) is fenced,
    # its EndTxn included
    assert code_of(txn.prepare_end, done, PID, 3, True, T0, tv2=True) is ErrorCode.producer_fenced
    assert code_of(txn.add_partitions, done, PID, 3, {A}, T0, tv2=True) is (
        ErrorCode.producer_fenced
    )


def test_state_records_carry_tv2_fields_and_tv1_records_are_unchanged() -> None:
    tv1 = txn.add_partitions(txn.new_producer("t1", PID, 60_000, T0), PID, 0, {A}, T0)
    assert tv1 is not None
    raw = json.loads(encode_value(tv1))
    assert raw["v"] == 1 and "txn_version" not in raw and "next_pid" not in raw
    assert decode_value("t1", encode_value(tv1)) == tv1
    prepared = txn.prepare_end(
        tv2_ongoing(MAX_EPOCH - 1), PID, MAX_EPOCH - 1, True, T0, tv2=True, next_producer_id=NEW_PID
    )
    assert prepared is not None
    raw = json.loads(encode_value(prepared))
    assert (raw["v"], raw["txn_version"], raw["next_pid"]) == (2, TV2, NEW_PID)
    assert decode_value("t1", encode_value(prepared)) == prepared
    done = txn.complete(prepared, T0 + 1)
    assert decode_value("t1", encode_value(done)) == done
    # a record of a format newer than this code is refused, not misread
    with pytest.raises(ValueError):
        decode_value("t1", json.dumps(dict(raw, v=3)).encode())
