"""A standby controller registers the feature levels it supports with the active controller.

Kafka's controllers each send ControllerRegistration to the active controller when they start
(KIP-919), so a finalized level is never raised above what a controller that may lead next
supports. TidalMQ's standbys (the operator's replicas that Kopf peering keeps paused, or any
process that would host a controller later) write nothing to the metadata log; without this,
one registered only once it had led, and a level could be raised above it meanwhile: it then
refused to lead at a failover (`start_refused`).

`StandbyRegistration.run` asks the active controller, through the control-plane HTTP API with
the cluster token (`POST /v1/controllers/register`, admin-only), to register this controller's
id and ranges, at start and then every `interval_s` while this process does not lead. The
active controller writes a record only when its metadata does not hold these ranges under this
id (O(1) per attempt): a standby that finds itself unregistered (its id forgotten by `tidalmq
controller forget`, or a new cluster) is registered again by its next attempt. A failed
attempt (the controller unreachable, in a failover, or refusing the id) is one log line per
change of outcome, and is tried again at the next interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tidalmq_core.control_tls import ControlTls
from tidalmq_core.metadata import SUPPORTED_FEATURES

from tidalmq_controller._errors import ControllerError
from tidalmq_controller._rpc_client import HttpControllerClient

log = logging.getLogger(__name__)


class StandbyRegistration:
    """Registers `controller_id` and the ranges its code supports with the controller at
    `controller_url` (the address the brokers use: it reaches whichever controller leads)."""

    def __init__(
        self,
        controller_url: str,
        *,
        controller_id: str,
        token: str,
        tls: ControlTls | None = None,
        supported_features: dict[str, tuple[int, int]] | None = None,
        interval_s: float = 30.0,
    ) -> None:
        self.controller_url = controller_url.rstrip("/")
        self.controller_id = controller_id
        self.supported_features = dict(
            SUPPORTED_FEATURES if supported_features is None else supported_features
        )
        self.interval_s = interval_s
        self._client = HttpControllerClient(self.controller_url, token=token, tls=tls)
        self._last_failure: str | None = None
        self.registrations = 0  # attempts that wrote the registration (first, or again)

    async def register_once(self) -> bool:
        """One attempt; True when the active controller wrote it now (False: it had it).
        Raises ControllerError (a refusal, or the controller unreachable)."""
        wrote = await self._client.register_controller(self.controller_id, self.supported_features)
        if wrote:
            self.registrations += 1
            log.info(
                "controller %s registered%s with the active controller at %s (supports %s)",
                self.controller_id,
                " again" if self.registrations > 1 else "",
                self.controller_url,
                self.supported_features,
            )
        return wrote

    async def run(self, leading: Callable[[], bool]) -> None:
        """Attempt every `interval_s` while `leading()` is false, until cancelled."""
        try:
            while True:
                if not leading():
                    try:
                        await self.register_once()
                        self._last_failure = None
                    except ControllerError as exc:  # unreachable, refused, not leading
                        why = f"{type(exc).__name__}: {exc}"
                        if why != self._last_failure:
                            log.warning(
                                "controller %s could not register with the active controller "
                                "(%s); trying again every %gs",
                                self.controller_id,
                                why,
                                self.interval_s,
                            )
                        self._last_failure = why
                await asyncio.sleep(self.interval_s)
        finally:
            await self._client.close()

    async def close(self) -> None:
        await self._client.close()
