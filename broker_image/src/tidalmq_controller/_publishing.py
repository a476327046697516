"""Publishing committed metadata to the brokers: one pusher task per broker.

Owns: each broker's channel (`BrokerChannel`: HTTP to a broker in another process, none for a
broker of the earlier protocol, which fetches instead), the version each broker is known to hold
(from its pushes' answers and its heartbeats), the pusher tasks that send each broker the
batches after that version (a snapshot when it is too far behind), never waiting for a broker in
the controller's loop, and `update_for` (what a broker that fetches needs).

Must not touch: the journal's contents (it only reads committed batches and snapshots) or any
decision of the controller: which brokers exist is the controller's (it connects and disconnects
them here), what is committed the journal's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from prometheus_client import Counter

from tidalmq_controller._journal import Journal
from tidalmq_controller._log import Batch

log = logging.getLogger(__name__)

PUSHES = Counter(
    "tidalmq_controller_metadata_pushes_total", "Metadata updates sent to brokers", ["kind"]
)


class BrokerChannel(Protocol):
    """How the controller reaches one broker."""

    async def push_update(self, base: int, snapshot: bytes | None, batches: list[Batch]) -> int:
        """Send the batches after `base` (with a snapshot: the snapshot, then the batches after
        it); returns the version the broker holds afterwards."""
        ...


class MetadataPublisher:
    """Sends every connected broker the committed batches it misses."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._channels: dict[int, BrokerChannel | None] = {}  # None: a protocol-1 broker
        self._acked: dict[int, int] = {}  # broker -> the version it holds (pushes, heartbeats)
        self._pushers: dict[int, asyncio.Task[None]] = {}
        self._push_wake: dict[int, asyncio.Event] = {}

    def connect(self, broker_id: int, channel: BrokerChannel | None) -> None:
        """A broker (re)registered: nothing is known of what it holds yet."""
        self._channels[broker_id] = channel
        self._acked[broker_id] = -1

    def disconnect(self, broker_id: int) -> None:
        self._channels.pop(broker_id, None)
        self._acked.pop(broker_id, None)

    def holds(self, broker_id: int, version: int) -> None:
        """A heartbeat said the broker holds `version` (a push may have been lost)."""
        self._acked[broker_id] = max(self._acked.get(broker_id, -1), version)

    def publish(self) -> None:
        """A batch was committed: wake every broker's pusher."""
        for broker_id in list(self._channels):
            self._kick_pusher(broker_id)

    def stop(self) -> None:
        for pusher in self._pushers.values():
            pusher.cancel()

    def _kick_pusher(self, broker_id: int) -> None:
        event = self._push_wake.setdefault(broker_id, asyncio.Event())
        event.set()
        pusher = self._pushers.get(broker_id)
        if pusher is None or pusher.done():
            self._pushers[broker_id] = asyncio.create_task(
                self._pusher(broker_id), name=f"push to broker {broker_id}"
            )

    async def _pusher(self, broker_id: int) -> None:
        """Send the broker what it misses, one update at a time, never waiting for it in the
        controller's loop; heartbeats tell what it holds if a push was lost."""
        event = self._push_wake[broker_id]
        failures = 0
        while True:
            event.clear()
            channel = self._channels.get(broker_id)
            if channel is None:
                return
            have = self._acked.get(broker_id, -1)
            committed = self._journal.committed_version
            if have < committed:
                batches = self._journal.batches_since(have) if have >= 0 else None
                snapshot = None
                base = have
                if batches is None:
                    snapshot = self._journal.snapshot_bytes
                    base = self._journal.snapshot_version
                    batches = self._journal.batches_since(base) or []
                    PUSHES.labels("snapshot").inc()
                else:
                    PUSHES.labels("batches").inc()
                try:
                    got = await asyncio.wait_for(channel.push_update(base, snapshot, batches), 10)
                    self._acked[broker_id] = got  # what it holds now (it refuses a wrong base)
                    if got > have:
                        failures = 0
                        continue
                    failures += 1  # no progress: it refused (or lost its state); not in a loop
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failures += 1
                    log.debug("metadata push to broker %d failed: %s", broker_id, exc)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(0.05 * 2**failures, 2.0)):
                        await event.wait()
                continue
            await event.wait()

    def update_for(self, version: int) -> tuple[int, bytes | None, list[Batch]]:
        """What a broker at `version` needs: (base, snapshot or None, batches)."""
        batches = self._journal.batches_since(version) if version >= 0 else None
        if batches is not None:
            return version, None, batches
        base = self._journal.snapshot_version
        return base, self._journal.snapshot_bytes, self._journal.batches_since(base) or []
