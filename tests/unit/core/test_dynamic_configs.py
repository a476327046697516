"""Configs that Kafka's reassignment tool and kafka-configs change at runtime: the replication
throttles (broker-level rates, topic-level replica lists) and where they are kept."""

from __future__ import annotations

import pytest
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.topics import (
    CLUSTER_DEFAULT,
    DYNAMIC_BROKER_CONFIG_DEFAULTS,
    InvalidConfig,
    StaticConfig,
    validate_broker_config_scope,
    validate_broker_configs,
    validate_configs,
)


@pytest.mark.parametrize("value", ["", "*", "0:1", "0:1,1:2", "0:1, 2:0"])
def test_throttled_replica_lists(value: str) -> None:
    for name in (
        "leader.replication.throttled.replicas",
        "follower.replication.throttled.replicas",
    ):
        assert validate_configs({name: value}) == {name: value}


@pytest.mark.parametrize("value", ["x", "0", "0:", ":1", "0:1;1:2", "*,0:1"])
def test_bad_throttled_replica_lists(value: str) -> None:
    with pytest.raises(InvalidConfig, match="must be the literal '\\*' or a list of replicas"):
        validate_configs({"leader.replication.throttled.replicas": value})


def test_dynamic_broker_configs() -> None:
    assert validate_broker_configs(
        {"leader.replication.throttled.rate": "1000", "follower.replication.throttled.rate": None}
    ) == {"leader.replication.throttled.rate": "1000"}
    with pytest.raises(InvalidConfig, match="must be an integer"):
        validate_broker_configs({"leader.replication.throttled.rate": "fast"})
    with pytest.raises(InvalidConfig, match="at least 0"):
        validate_broker_configs({"follower.replication.throttled.rate": "-1"})
    with pytest.raises(
        InvalidConfig, match=r"unknown dynamic broker config 'log\.cleaner\.threads'"
    ):
        validate_broker_configs({"log.cleaner.threads": "2"})


def test_static_broker_configs_need_a_restart() -> None:
    static = frozenset({"num.partitions", "broker.id"})
    with pytest.raises(StaticConfig, match=r"dynamically: \[broker.id, num.partitions\]"):
        validate_broker_configs({"num.partitions": "3", "broker.id": "1"}, static)
    # a static name is only refused as such when the broker says it has it
    with pytest.raises(InvalidConfig):
        validate_broker_configs({"num.partitions": "3"})


@pytest.mark.parametrize("scope", ["", "0", "12"])
def test_broker_config_scopes(scope: str) -> None:
    validate_broker_config_scope(scope)


@pytest.mark.parametrize("scope", ["-1", "b1", " 1"])
def test_bad_broker_config_scopes(scope: str) -> None:
    with pytest.raises(InvalidConfig):
        validate_broker_config_scope(scope)


def test_broker_configs_live_in_the_metadata() -> None:
    meta = ClusterMetadata(cluster_id="c")
    rate = "leader.replication.throttled.rate"
    assert meta.dynamic_broker_config(1, rate) is None
    meta.broker_configs[CLUSTER_DEFAULT] = {rate: "500"}
    assert meta.dynamic_broker_config(1, rate) == (CLUSTER_DEFAULT, "500")
    meta.broker_configs["1"] = {rate: "100"}
    assert meta.dynamic_broker_config(1, rate) == ("1", "100")  # the broker's own wins
    assert meta.dynamic_broker_config(2, rate) == (CLUSTER_DEFAULT, "500")
    again = ClusterMetadata.from_json(meta.to_json())
    assert again.broker_configs == {"": {rate: "500"}, "1": {rate: "100"}}
    # snapshots written before broker configs existed still load
    old = meta.to_json()
    del old["broker_configs"]
    assert ClusterMetadata.from_json(old).broker_configs == {}
    assert set(DYNAMIC_BROKER_CONFIG_DEFAULTS) >= {rate, "follower.replication.throttled.rate"}
