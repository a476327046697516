"""The Kafka harness's extra listeners (bench/kafka/harness.py), as bench/broker_throughput.py
--tls uses them: each broker gets them beside PLAINTEXT, advertised and mapped to their security
protocol, with the TLS and SASL settings of bench/listener_security.py."""

from __future__ import annotations

from pathlib import Path

from bench import listener_security
from bench.kafka.harness import KafkaCluster, KafkaNode


def properties(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(ln.split("=", 1) for ln in lines if ln and not ln.startswith("#"))


def test_a_broker_gets_the_extra_listeners_with_their_protocols(tmp_path: Path) -> None:
    pki = listener_security.make_pki(tmp_path / "pki")
    cluster = KafkaCluster(
        1,
        dir=tmp_path,
        listeners=listener_security.kafka_listeners(),
        broker_config=listener_security.kafka_config(pki),
    )
    node = KafkaNode(1, ("broker", "controller"), tmp_path / "node-1", 9101, 9102)
    node.listener_ports = {"SSL": 9103, "SASL_SSL": 9104}
    cluster.nodes[1] = node
    cluster._write_config(node)
    config = properties(node.config_path)
    assert config["listeners"] == (
        "PLAINTEXT://127.0.0.1:9101,CONTROLLER://127.0.0.1:9102,"
        "SSL://127.0.0.1:9103,SASL_SSL://127.0.0.1:9104"
    )
    assert config["advertised.listeners"] == (
        "PLAINTEXT://127.0.0.1:9101,SSL://127.0.0.1:9103,SASL_SSL://127.0.0.1:9104"
    )
    assert config["listener.security.protocol.map"] == (
        "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL"
    )
    assert config["ssl.keystore.location"] == str(pki.keystore)
    assert config["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert cluster.listener_bootstrap("SASL_SSL") == "127.0.0.1:9104"
    assert cluster.listener_bootstrap("PLAINTEXT") == "127.0.0.1:9101"


def test_without_extra_listeners_the_config_is_plaintext_only(tmp_path: Path) -> None:
    cluster = KafkaCluster(1, dir=tmp_path)
    node = KafkaNode(1, ("broker", "controller"), tmp_path / "node-1", 9101, 9102)
    cluster.nodes[1] = node
    cluster._write_config(node)
    config = properties(node.config_path)
    assert config["listeners"] == "PLAINTEXT://127.0.0.1:9101,CONTROLLER://127.0.0.1:9102"
    assert config["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9101"
    assert config["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"


def test_both_brokers_clients_get_the_same_settings(tmp_path: Path) -> None:
    pki = listener_security.make_pki(tmp_path)
    assert listener_security.client_config("PLAINTEXT", pki) == {}
    assert listener_security.client_config("SSL", pki) == {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
    }
    sasl = listener_security.client_config("SASL_SSL", pki)
    assert sasl["sasl.mechanism"] == "SCRAM-SHA-512" and sasl["security.protocol"] == "SASL_SSL"
    args, env = listener_security.tidalmq_args({"PLAINTEXT": 1, "SSL": 2, "SASL_SSL": 3}, pki)
    assert args[args.index("--listeners") + 1] == (
        "PLAINTEXT://127.0.0.1:1,SSL://127.0.0.1:2,SASL_SSL://127.0.0.1:3"
    )
    user = f"{listener_security.USER}:SCRAM-SHA-512:{listener_security.PASSWORD}"
    assert env == {"TIDALMQ_SCRAM_BOOTSTRAP": user}
