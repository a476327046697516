from __future__ import annotations

import pytest
from tidalmq_broker.settings import BrokerSettings, broker_id_from_hostname, from_sources


def test_broker_id_from_statefulset_hostname() -> None:
    assert broker_id_from_hostname("tidalmq-broker-12") == 12
    assert broker_id_from_hostname("tidalmq-broker-3.tidalmq-brokers.ns.svc") == 3
    with pytest.raises(SystemExit, match="cannot take a broker id"):
        broker_id_from_hostname("laptop")


def test_environment_then_flags() -> None:
    env = {
        "TIDALMQ_PORT": "1234",
        "TIDALMQ_AUTO_CREATE_TOPICS": "no",
        "TIDALMQ_FLUSH_INTERVAL_MS": "2.5",
    }
    s = from_sources(None, env)
    assert (s.port, s.auto_create_topics, s.flush_interval_ms) == (1234, False, 2.5)
    assert BrokerSettings().auto_create_topics  # Kafka's auto.create.topics.enable default
    with pytest.raises(SystemExit, match="TIDALMQ_PORT"):
        from_sources(None, {"TIDALMQ_PORT": "many"})
    assert isinstance(s, BrokerSettings)


def test_the_listener_bounds_come_from_flags_and_environment() -> None:
    import argparse

    from tidalmq_broker.broker import listener_limits
    from tidalmq_broker.settings import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--max-connections", "100", "--connections-max-idle-ms", "1500"])
    env = {
        "TIDALMQ_MAX_CONNECTIONS_PER_IP": "7",
        "TIDALMQ_MAX_CONNECTIONS_PER_IP_OVERRIDES": "127.0.0.2:50, [::1]:9,localhost:3",
        "TIDALMQ_QUEUED_MAX_RESPONSE_BYTES": "1000000",
        "TIDALMQ_FLUSH_TIMEOUT_MS": "2500",
    }
    s = from_sources(args, env)
    limits = listener_limits(s)
    assert (limits.max_connections, limits.max_connections_per_ip) == (100, 7)
    assert limits.idle_timeout_s == 1.5 and limits.queued_max_response_bytes == 1_000_000
    assert limits.max_connections_per_ip_overrides["127.0.0.2"] == 50
    assert limits.max_connections_per_ip_overrides["::1"] in (9, 3)  # localhost may be ::1 too
    assert limits.max_connections_per_ip_overrides["127.0.0.1"] == 3  # a name, resolved
    assert s.storage_config().flush_timeout_ms == 2500
    described = s.described()
    assert described["max.connections"] == "100" and described["connections.max.idle.ms"] == "1500"


def test_a_bad_override_stops_the_broker_with_one_line() -> None:
    from tidalmq_broker.broker import listener_limits

    for bad in ("10.0.0.1", "10.0.0.1:many", ":5"):
        with pytest.raises(SystemExit, match=r"max\.connections\.per\.ip\.overrides"):
            listener_limits(BrokerSettings(max_connections_per_ip_overrides=bad))
