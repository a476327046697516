"""The control plane at scale on Kubernetes ([M1]): 100,000 partitions (ten Topics of 10,000, the
most a Topic resource may ask for) on three broker processes behind the operator, against a real
kube-apiserver. No TidalMQ object grows with the partition count: the largest stays under
256 KiB (the ClusterState is the metadata log's fence and pointer, a big Topic's status lists
what is not served and counts the rest per broker). A restarted operator (the old one killed)
is controlling again soon (the target is 10 s; the figure is printed; with the default peering
lifetime of 8 s a successor whose random priority is lower waits at most that long for the
killed replica's peering record to expire): it reads the metadata log from the object store (snapshot and
batches), claims the next controller epoch and answers the brokers."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.integration.operator.test_operator import (  # noqa: F401  (fixtures)
    OperatorProcess,
    api_with_crds,
    apply,
    condition,
    deployment,
    get,
    topic,
    wait_for,
)

pytestmark = pytest.mark.integration

TOPICS = 10
PARTITIONS = 10_000  # per Topic: the CRD's maximum
LIMIT = 256 * 1024


def largest_objects(d: dict[str, Any]) -> list[tuple[int, str]]:
    """(size of its JSON, kind/name) of every TidalMQ object of the namespace, largest first."""
    out = []
    for kind in ("clusterstates", "topics", "statictopics", "partitionreassignments"):
        items = json.loads(d["api"].kubectl("-n", d["ns"], "get", kind, "-o", "json").stdout)
        for item in items["items"]:
            out.append((len(json.dumps(item)), f"{kind}/{item['metadata']['name']}"))
    return sorted(out, reverse=True)


def test_100k_partitions_keep_every_object_small_and_a_new_operator_takes_over_fast(
    deployment: dict[str, Any],  # noqa: F811
) -> None:
    d = deployment
    started = time.monotonic()
    for i in range(TOPICS):
        apply(d, topic(f"big-{i}", PARTITIONS))

    def all_ready() -> bool:
        for i in range(TOPICS):
            c = condition(get(d, "topic", f"big-{i}"), "Ready")
            if c is None or c["status"] != "True":
                return False
        return True

    wait_for(all_ready, timeout_s=600, what=f"{TOPICS} Topics of {PARTITIONS} partitions Ready")
    created_s = time.monotonic() - started
    status = get(d, "topic", "big-0")["status"]
    assert status["partitionCount"] == PARTITIONS
    assert sum(status["partitionsByBroker"].values()) == PARTITIONS
    assert status["partitions"] == [], "every partition is served: none listed"
    sizes = largest_objects(d)
    print(
        f"\n{TOPICS * PARTITIONS} partitions Ready in {created_s:.1f} s; largest objects: "
        f"{sizes[:4]}"
    )
    assert sizes[0][0] < LIMIT, f"{sizes[0][1]} is {sizes[0][0]} bytes"
    state = get(d, "clusterstates", "tidalmq")
    assert "document" not in state["spec"], "the ClusterState holds no metadata document"

    # the active operator killed, a new one started: controlling again within 10 s
    old: OperatorProcess = d["operator"]
    epoch = int(state["metadata"]["annotations"]["tidalmq.io/controller-epoch"])
    old.kill()
    new = OperatorProcess(
        d["api"], d["ns"], old.storage_url, d["tmp"], name="successor", env=old.env
    )
    new.controller_port, new.http_port = old.controller_port, old.http_port  # the brokers' URL
    launched = time.monotonic()
    print(f"successor launched at {time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d}")
    new.launch()
    d["operator"] = new  # stopped by the fixture
    wait_for(new.ready, timeout_s=60, what="the new operator controlling")
    took = time.monotonic() - launched
    annotations = get(d, "clusterstates", "tidalmq")["metadata"]["annotations"]
    claimed = int(annotations["tidalmq.io/controller-epoch"])
    print(
        f"a new operator controlled again {took:.1f} s after its launch (epoch {epoch} -> "
        f"{claimed})"
    )
    assert claimed > epoch
    # the target is 10 s (measured 9.4 s at load 10 on the 2-core machine, of which 5.7 s
    # importing Python); a timed test only guards against a regression far past it
    assert took <= 30, f"the new operator took {took:.1f} s to control"
    # and it serves: a topic created now is Ready
    apply(d, topic("after-restart", 3))
    wait_for(
        lambda: (
            (condition(get(d, "topic", "after-restart"), "Ready") or {}).get("status") == "True"
        ),
        timeout_s=120,
        what="a topic created after the restart Ready",
    )
