"""How a produce request waits for its appends ([L1] item 1): once for all of its partitions'
WAL flushes, without cancelling them, and what each partition is answered from what it got."""

from __future__ import annotations

import asyncio
import time

from tidalmq_broker.apis.produce import _all_done, _result
from tidalmq_broker.storage.api import Acknowledgement, AppendResult, ObjectStoreUnavailable

OFFSETS = AppendResult(10, 14, -1, 0)


async def test_waits_for_every_flush_then_answers_each_partition() -> None:
    loop = asyncio.get_running_loop()
    flushes = [loop.create_future() for _ in range(3)]
    acks = [Acknowledgement(OFFSETS, f) for f in flushes]
    waiting = asyncio.create_task(_all_done(flushes, 5.0))
    flushes[0].set_result(None)
    flushes[2].set_exception(ObjectStoreUnavailable("PUT failed"))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # one flush still out
    flushes[1].set_result(None)
    await asyncio.wait_for(waiting, 1)
    assert _result(acks[0]) == OFFSETS
    assert _result(acks[1]) == OFFSETS
    failed = _result(acks[2])
    assert isinstance(failed, ObjectStoreUnavailable)


async def test_a_flush_not_durable_in_time_is_answered_as_timed_out_and_left_running() -> None:
    loop = asyncio.get_running_loop()
    late = loop.create_future()
    done = loop.create_future()
    done.set_result(None)
    started = time.monotonic()
    await _all_done([late], 0.1)
    assert 0.09 <= time.monotonic() - started < 2
    assert not late.cancelled()  # the flush completes it whatever the request did
    assert _result(Acknowledgement(OFFSETS, late)) is None  # REQUEST_TIMED_OUT
    assert _result(Acknowledgement(OFFSETS, done)) == OFFSETS
    late.set_result(None)


async def test_acks_0_and_refused_appends_need_no_wait() -> None:
    await asyncio.wait_for(_all_done([], 5.0), 0.5)
    assert _result(Acknowledgement(OFFSETS, None)) == OFFSETS  # acks=0: nothing to wait for
    refused = ValueError("corrupt")
    assert _result(refused) is refused


async def test_a_cancelled_request_leaves_the_flushes_alone() -> None:
    flush = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(_all_done([flush], 5.0))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert not flush.cancelled()
    flush.set_result(None)
