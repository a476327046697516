"""One open partition of the storage engine (implements api.PartitionLog): the class the
engine opens, composed of one part a concern, each a module of this package named for what it
owns (docs/architecture/produce-and-fetch.md):

- state.py: the fields and their invariants, the State machine's names, PartitionHost (what a
  partition uses of its engine), the primitives every part uses.
- checkpoints.py: snapshot and commit of the checkpoint (If-Match, fencing).
- flushes.py: WAL flush completion (index, durable producer state, high watermark, acks) and
  the rollback after a failed flush.
- appends.py: validation, producer sequence checks, offset assignment, transaction markers.
- reads.py: reads by offset (cache, ranged GETs, read-ahead, read_committed) and by timestamp.
- log_changes.py: compaction's and the log cleaner's index swaps, moves of the log start.
- closing.py: close (the end of a move), fence, abandon.

The parts stand in layers (checked by import-linter, .importlinter): state under checkpoints,
checkpoints under flushes and log changes, flushes under closing; appends and reads stand on
the state alone. Callers import Partition, State and PartitionHost from here only.
"""

from __future__ import annotations

from tidalmq_broker.storage.partition.appends import Appends
from tidalmq_broker.storage.partition.closing import Closing
from tidalmq_broker.storage.partition.log_changes import LogChanges
from tidalmq_broker.storage.partition.reads import Reads
from tidalmq_broker.storage.partition.state import PartitionHost, State

__all__ = ["Partition", "PartitionHost", "State"]


class Partition(Appends, Reads, LogChanges, Closing):
    """Implements api.PartitionLog: one open partition, its parts composed (see above)."""

    __slots__ = ()
