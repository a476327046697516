from __future__ import annotations

from tidalmq_broker.storage.cache import TailCache


def view(n: int) -> memoryview:
    return memoryview(b"x" * n)


def test_lookup_returns_chunks_within_max_bytes_at_least_one() -> None:
    cache = TailCache(10_000)
    pc = cache.partition()
    pc.add(0, 9, view(100))
    pc.add(10, 19, view(100))
    pc.add(20, 29, view(100))
    assert [len(v) for v in pc.lookup(15, 250) or []] == [100, 100]
    assert [len(v) for v in pc.lookup(0, 10) or []] == [100]
    assert pc.lookup(30, 100) is None
    assert pc.exact(10, 29) is not None and pc.exact(10, 25) is None and pc.exact(11, 19) is None


def test_eviction_is_global_oldest_first() -> None:
    cache = TailCache(300)
    a, b = cache.partition(), cache.partition()
    a.add(0, 0, view(100))
    b.add(0, 0, view(100))
    a.add(1, 1, view(100))
    b.add(1, 1, view(100))  # evicts a@0
    assert cache.bytes == 300
    assert a.lookup(0, 1000) is None and a.start_offset == 1
    assert b.start_offset == 0
    a.clear()
    assert cache.bytes == 200
    b.add(2, 2, view(250))  # evicts b@0, b@1 (a's stale entry frees nothing)
    assert cache.bytes == 250 and b.start_offset == 2


def test_a_gap_restarts_the_partition_cache() -> None:
    cache = TailCache(1000)
    pc = cache.partition()
    pc.add(0, 4, view(10))
    pc.add(7, 9, view(10))
    assert pc.start_offset == 7 and cache.bytes == 10
    pc.drop_before(10)
    assert pc.start_offset is None and cache.bytes == 0
