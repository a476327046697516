"""An operator whose ClusterState points past the metadata log in its store (the store wiped or
replaced) does not start the controller on it: it says so (ClusterState Ready False
MetadataLost, a warning Event, tidalmq_operator_metadata_lost 1) and looks again every
`metadata_retry_s`, not at once: a look that followed the last one immediately wrote the
ClusterState's condition and posted an Event every few milliseconds for as long as the log was
missing."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from prometheus_client import REGISTRY
from tidalmq_operator.runtime import OperatorRuntime
from tidalmq_operator.settings import OperatorSettings

from tests.unit.operator_pkg.test_unsupported_feature_level import ClusterStateKube

RETRY_S = 0.4


class StopAfterEvents:
    """Kopf's `stopped` flag: set once `count` Events were posted."""

    def __init__(self, kube: ClusterStateKube, count: int) -> None:
        self.kube, self.count = kube, count

    def __bool__(self) -> bool:
        return len(self.kube.events) >= self.count


async def test_a_missing_metadata_log_is_looked_for_again_after_the_retry_interval(
    tmp_path: Path,
) -> None:
    kube = ClusterStateKube("a-cluster")
    # the ClusterState says version 12 was committed; the store holds no log at all
    kube.state["metadata"]["annotations"]["tidalmq.io/metadata-log"] = json.dumps({"head": 12})
    posted: list[float] = []
    event = kube.event

    async def timed_event(*args: object, **kwargs: object) -> None:
        posted.append(time.monotonic())
        await event(*args, **kwargs)  # type: ignore[arg-type]

    kube.event = timed_event  # type: ignore[method-assign]
    settings = OperatorSettings(
        storage_url=f"file://{tmp_path / 'objects'}", metadata_retry_s=RETRY_S
    )
    runtime = OperatorRuntime(settings, kube)  # type: ignore[arg-type]
    await asyncio.wait_for(runtime.run_controller(StopAfterEvents(kube, 2)), 10)
    assert runtime.controller is None and not runtime.active.is_set()
    assert [e[0] for e in kube.events] == ["MetadataLost", "MetadataLost"], kube.events
    assert "ends at version 0, but ClusterState tidalmq says version 12" in kube.events[0][1]
    assert posted[1] - posted[0] >= RETRY_S, posted
    (ready,) = kube.state["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "MetadataLost"), ready
    assert REGISTRY.get_sample_value("tidalmq_operator_metadata_lost") == 1


def test_the_retry_interval_is_a_setting() -> None:
    assert OperatorSettings.from_env({}).metadata_retry_s == 30
    assert OperatorSettings.from_env({"TIDALMQ_METADATA_RETRY_S": "2.5"}).metadata_retry_s == 2.5
