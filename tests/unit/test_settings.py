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
