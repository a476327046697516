"""`tidalmq operator uninstall` (the chart's pre-delete hook): which finalizers it drops and the
patch that drops them. The API calls run against a real kube-apiserver in
tests/integration/chart/test_chart_on_apiserver.py."""

from __future__ import annotations

from tidalmq_operator.uninstall import FINALIZER, PLURALS, finalizer_patch, selector_string


def test_only_the_operators_finalizer_is_removed() -> None:
    obj = {"metadata": {"name": "orders", "finalizers": ["other.io/keep", FINALIZER]}}
    assert finalizer_patch(obj) == [
        {"op": "test", "path": "/metadata/finalizers", "value": ["other.io/keep", FINALIZER]},
        {"op": "replace", "path": "/metadata/finalizers", "value": ["other.io/keep"]},
    ]


def test_nothing_to_patch_without_the_finalizer() -> None:
    assert finalizer_patch({"metadata": {"name": "a"}}) is None
    assert finalizer_patch({"metadata": {"name": "a", "finalizers": ["other.io/keep"]}}) is None
    assert finalizer_patch({"metadata": {"name": "a", "finalizers": None}}) is None


def test_the_patch_guards_against_a_concurrent_change() -> None:
    """The test op carries the list as read: a finalizer added meanwhile fails the patch
    instead of being dropped with ours."""
    patch = finalizer_patch({"metadata": {"finalizers": [FINALIZER]}})
    assert patch is not None
    assert patch[0] == {"op": "test", "path": "/metadata/finalizers", "value": [FINALIZER]}
    assert patch[1]["value"] == []


def test_every_resource_the_operator_finalizes_and_the_cluster_state_last() -> None:
    assert FINALIZER == "tidalmq.io/finalizer"
    assert set(PLURALS) == {
        "topics",
        "statictopics",
        "partitionreassignments",
        "users",
        "clusterstates",
    }
    assert PLURALS[-1] == "clusterstates"


def test_selector_of_match_labels() -> None:
    assert selector_string({"b": "2", "a": "1"}) == "a=1,b=2"
