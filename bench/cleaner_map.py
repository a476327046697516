"""Memory and speed of the log cleaner's key map (storage/cleaner.OffsetMap): bytes per key,
which sets the default bound (log_cleaner.DEFAULT_MAP_KEYS), and keys mapped per second from
real batches (docs/compaction.md section 5, open question 2).

    .venv/bin/python bench/cleaner_map.py --keys 500000
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidalmq_broker.protocol.records import build_batch, read_header
from tidalmq_broker.storage.cleaner import OffsetMap, TxnTracker, map_batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=100, help="records per batch")
    args = parser.parse_args()

    batches = bytearray()
    for base in range(0, args.keys, args.batch):
        data = bytearray(
            build_batch([(b"user-%012d" % (base + i), b"v" * 100) for i in range(args.batch)])
        )
        data[0:8] = base.to_bytes(8, "big")
        batches += data
    assert read_header(batches).record_count == args.batch

    offset_map = OffsetMap(args.keys)  # timed without tracemalloc, which slows allocation
    started = time.perf_counter()
    full = map_batches(batches, offset_map, TxnTracker([]), 0)
    seconds = time.perf_counter() - started
    assert not full and len(offset_map) == args.keys
    del offset_map
    tracemalloc.start()
    offset_map = OffsetMap(args.keys)
    map_batches(batches, offset_map, TxnTracker([]), 0)
    size, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"{len(offset_map)} keys: {size / len(offset_map):.0f} bytes per key "
        f"({size / 2**20:.1f} MiB), {len(offset_map) / seconds:,.0f} keys/s "
        f"({len(batches) / 2**20 / seconds:.1f} MiB/s of batches)"
    )


if __name__ == "__main__":
    main()
