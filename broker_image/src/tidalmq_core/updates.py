"""What the controller sends a broker so it catches up: the batches after the version it has, or
(when it is too far behind, or new) a snapshot and the batches after it.

On the wire, lines of JSON: a header `{"base": B, "snapshot": K}`, then the K lines of a snapshot
(tidalmq_core.snapshots; K = 0: none), then one line per batch (`{"v": version, "epoch": E,
"ts": ms, "r": [records]}`, as the metadata log stores it). Batches are sent as the log holds
them, never re-encoded per broker.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidalmq_core.records import Record


class UpdateError(ValueError):
    """A metadata update that cannot be read."""


@dataclass(slots=True)
class MetadataUpdate:
    base: int  # the version the batches follow (with a snapshot: the snapshot's)
    snapshot: bytes | None = None
    batches: list[tuple[int, list[Record]]] = field(default_factory=list)

    @property
    def last_version(self) -> int:
        return self.batches[-1][0] if self.batches else self.base


def encode(base: int, snapshot: bytes | None, batches: Sequence[bytes]) -> list[bytes]:
    """The parts of an update (join them, or send them as they are)."""
    lines = snapshot.rstrip(b"\n").split(b"\n") if snapshot else []
    parts = [json.dumps({"base": base, "snapshot": len(lines)}).encode() + b"\n"]
    if lines:
        parts.append(b"\n".join(lines) + b"\n")
    parts.extend(b + b"\n" for b in batches)
    return parts


def decode(data: bytes) -> MetadataUpdate:
    lines = data.split(b"\n")
    try:
        header = json.loads(lines[0])
        count = int(header["snapshot"])
        snapshot = b"\n".join(lines[1 : 1 + count]) + b"\n" if count else None
        update = MetadataUpdate(int(header["base"]), snapshot)
        for line in lines[1 + count :]:
            if line:
                doc = json.loads(line)
                update.batches.append((int(doc["v"]), doc["r"]))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UpdateError(f"corrupt metadata update: {exc}") from exc
    return update
