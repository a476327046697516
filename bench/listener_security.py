"""The same listener security for TidalMQ and Apache Kafka, for benchmarks that compare them
(bench/broker_throughput.py --tls): PLAINTEXT, SSL (one-way TLS: the broker's certificate, no
client certificate) and SASL_SSL with SCRAM-SHA-512 over the same TLS, on one broker of each.

Both brokers get the same certificate and key (ECDSA P-256, from tidalmq_broker.security.certs,
one PEM keystore that both read: Kafka as ssl.keystore.type=PEM), the same SCRAM user, and no
client authentication on SSL. TidalMQ turns authorization on with TLS or SASL listeners; here
every principal may do anything (allow.everyone.if.no.acl.found), as on Kafka without an
authorizer, so neither checks ACLs on the produce path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidalmq_broker.security import certs

LISTENERS = ("PLAINTEXT", "SSL", "SASL_SSL")
USER, PASSWORD = "bench", "bench-secret"
MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Pki:
    ca: Path  # what clients trust
    keystore: Path  # the brokers' key and certificate chain (unencrypted PEM)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = certs.new_ca("bench CA")
    (directory / "ca.pem").write_bytes(ca.cert_pem())
    broker = certs.issue(ca, "broker", hosts=["127.0.0.1", "localhost"])
    certs.write_keystore(directory / "broker.pem", broker, ca)
    return Pki(directory / "ca.pem", directory / "broker.pem")


def client_config(listener: str, pki: Pki) -> dict[str, Any]:
    """confluent-kafka (librdkafka) settings for a listener, the same for both brokers."""
    if listener == "PLAINTEXT":
        return {}
    conf: dict[str, Any] = {"security.protocol": listener, "ssl.ca.location": str(pki.ca)}
    if listener == "SASL_SSL":
        conf |= {"sasl.mechanism": MECHANISM, "sasl.username": USER, "sasl.password": PASSWORD}
    return conf


def tidalmq_args(ports: dict[str, int], pki: Pki) -> tuple[list[str], dict[str, str]]:
    """Broker flags and environment: one listener per name in `ports`."""
    args = [
        "--listeners",
        ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "--ssl-keystore-location",
        str(pki.keystore),
        "--sasl-enabled-mechanisms",
        MECHANISM,
        "--allow-everyone-if-no-acl-found",
        "true",
    ]
    return args, {"TIDALMQ_SCRAM_BOOTSTRAP": f"{USER}:{MECHANISM}:{PASSWORD}"}


def kafka_listeners() -> dict[str, str]:
    """KafkaCluster's `listeners` beside PLAINTEXT: name -> security protocol."""
    return {name: name for name in LISTENERS if name != "PLAINTEXT"}


def kafka_config(pki: Pki) -> dict[str, str]:
    """Broker settings for those listeners (the SCRAM user is added once Kafka runs:
    `kafka_add_user`)."""
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.keystore),
        "ssl.client.auth": "none",
        "sasl.enabled.mechanisms": MECHANISM,
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    }


def kafka_add_user(bootstrap: str) -> None:
    """The SCRAM user, added over PLAINTEXT with Kafka's own kafka-configs."""
    from bench.kafka.harness import run_tool

    run_tool(
        "kafka-configs",
        "--alter",
        "--entity-type",
        "users",
        "--entity-name",
        USER,
        "--add-config",
        f"{MECHANISM}=[iterations=4096,password={PASSWORD}]",
        bootstrap=bootstrap,
        check=True,
    )
