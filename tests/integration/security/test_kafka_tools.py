"""Apache Kafka's own CLI tools and Java client (4.3, through bench/kafka/harness.py) with a
client.properties, against a broker with SASL_SSL and SSL listeners: the Java producer and
consumer over SCRAM-SHA-512 and over mTLS; kafka-configs creates, describes and deletes a SCRAM
user exactly as it does on Kafka, and that user then logs in with the console tools, or is
refused."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.kafka.harness import (
    KafkaDist,
    java_consume,
    java_produce,
    parse_table,
    run_tool,
)
from tests.integration.security.conftest import SecureBroker, new_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

COUNT = 1000
AUTH_FAILED = (
    "org.apache.kafka.common.errors.SaslAuthenticationException: Authentication "
    "failed during authentication due to invalid credentials with SASL mechanism "
    "SCRAM-SHA-512"
)


def tool(name: str, *args: str, bootstrap: str, config: Path, check: bool = True) -> str:
    proc = run_tool(
        name, "--command-config", str(config), *args, bootstrap=bootstrap, check=check, timeout=120
    )
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("how", ["SASL_SSL", "SSL"])
def test_java_client(
    secure_broker: SecureBroker, apache_kafka_dist: KafkaDist, tmp_path: Path, how: str
) -> None:
    props = secure_broker.java_properties(tmp_path / "client.properties", mtls=how == "SSL")
    bootstrap = secure_broker.bootstrap(how)
    topic, group = new_topic(secure_broker, 3), f"jg-{uuid.uuid4().hex[:8]}"
    produced = java_produce(bootstrap, topic, COUNT, command_config=props)
    assert produced["client_version"] == apache_kafka_dist.version
    assert produced["acked"] == COUNT and produced["contiguous"] is True
    assert produced["enable_idempotence"] is True and produced["producer_ids"]
    assert produced["describe_producers_error"] is None  # the admin client authenticated too
    consumed = java_consume(bootstrap, topic, group, COUNT, command_config=props)
    assert consumed["received"] == COUNT and consumed["distinct_keys"] == COUNT
    assert sum(consumed["committed"].values()) == COUNT
    described = tool(
        "kafka-consumer-groups", "--describe", "--group", group, bootstrap=bootstrap, config=props
    )
    rows = parse_table(described, "GROUP")
    assert len(rows) == 3 and all(r["LAG"] == "0" for r in rows), described


def test_kafka_configs_manages_scram_users_who_then_log_in(
    secure_broker: SecureBroker, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    b = secure_broker.bootstrap("SASL_SSL")
    admin = secure_broker.java_properties(tmp_path / "admin.properties")
    user = f"alice-{uuid.uuid4().hex[:6]}"
    users = ["--entity-type", "users", "--entity-name", user]
    out = tool(
        "kafka-configs",
        "--alter",
        "--add-config",
        "SCRAM-SHA-512=[password=alice-secret]",
        *users,
        bootstrap=b,
        config=admin,
    )
    assert f"Completed updating config for user {user}." in out
    out = tool(
        "kafka-configs",
        "--alter",
        "--add-config",
        "SCRAM-SHA-256=[iterations=8192,password=alice-secret]",
        *users,
        bootstrap=b,
        config=admin,
    )
    assert f"Completed updating config for user {user}." in out
    out = tool("kafka-configs", "--describe", *users, bootstrap=b, config=admin)
    assert (
        f"SCRAM credential configs for user-principal '{user}' are "
        "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096"
    ) in out
    everyone = tool(
        "kafka-configs", "--describe", "--entity-type", "users", bootstrap=b, config=admin
    )
    assert "user-principal 'admin' are SCRAM-SHA-512=iterations=4096" in everyone
    assert f"user-principal '{user}'" in everyone
    # as on Kafka 4.3: two mechanisms of one user in one request are refused
    twice = tool(
        "kafka-configs",
        "--alter",
        "--add-config",
        "SCRAM-SHA-256=[password=x],SCRAM-SHA-512=[password=x]",
        *users,
        bootstrap=b,
        config=admin,
        check=False,
    )
    assert "DuplicateResourceException: A user credential cannot be altered twice" in twice

    # the new user logs in (SCRAM-SHA-512, SCRAM-SHA-256, and PLAIN against the same password)
    topic = new_topic(secure_broker, 1)
    alice = secure_broker.java_properties(
        tmp_path / "alice.properties", user=user, password="alice-secret"
    )
    run_tool(
        "kafka-console-producer",
        "--topic",
        topic,
        "--command-config",
        str(alice),
        bootstrap=b,
        input="one\ntwo\nthree\n",
        check=True,
        timeout=120,
    )
    for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
        props = secure_broker.java_properties(
            tmp_path / f"alice-{mechanism}.properties",
            user=user,
            password="alice-secret",
            mechanism=mechanism,
        )
        read = run_tool(
            "kafka-console-consumer",
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            "3",
            "--timeout-ms",
            "30000",
            "--command-config",
            str(props),
            bootstrap=b,
            timeout=120,
        )
        assert read.stdout.splitlines() == ["one", "two", "three"], (mechanism, read.stderr)
    # a wrong password is refused with Kafka's exception and message
    wrong = secure_broker.java_properties(
        tmp_path / "wrong.properties", user=user, password="guess"
    )
    refused = tool("kafka-topics", "--list", bootstrap=b, config=wrong, check=False)
    assert AUTH_FAILED in refused
    # deleted, the credential no longer logs in
    out = tool(
        "kafka-configs",
        "--alter",
        "--delete-config",
        "SCRAM-SHA-512",
        *users,
        bootstrap=b,
        config=admin,
    )
    assert f"Completed updating config for user {user}." in out
    gone = tool("kafka-topics", "--list", bootstrap=b, config=alice, check=False)
    assert AUTH_FAILED in gone
    missing = tool(
        "kafka-configs",
        "--alter",
        "--delete-config",
        "SCRAM-SHA-512",
        *users,
        bootstrap=b,
        config=admin,
        check=False,
    )
    assert (
        "ResourceNotFoundException: Attempt to delete a user credential that does not exist"
        in missing
    )


def test_console_tools_over_mtls(
    secure_broker: SecureBroker, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    b = secure_broker.bootstrap("SSL")
    props = secure_broker.java_properties(tmp_path / "mtls.properties", mtls=True)
    topic = f"mtls-{uuid.uuid4().hex[:8]}"
    created = tool(
        "kafka-topics", "--create", "--topic", topic, "--partitions", "2", bootstrap=b, config=props
    )
    assert f"Created topic {topic}." in created
    run_tool(
        "kafka-console-producer",
        "--topic",
        topic,
        "--command-config",
        str(props),
        bootstrap=b,
        input="a\nb\n",
        check=True,
        timeout=120,
    )
    read = run_tool(
        "kafka-console-consumer",
        "--topic",
        topic,
        "--from-beginning",
        "--max-messages",
        "2",
        "--timeout-ms",
        "30000",
        "--command-config",
        str(props),
        bootstrap=b,
        timeout=120,
    )
    assert sorted(read.stdout.splitlines()) == ["a", "b"]
    # a client certificate of another CA: the TLS handshake fails, the tool gives up
    bad = tmp_path / "bad-keystore.pem"
    bad.write_bytes(
        secure_broker.pki.untrusted_key.read_bytes() + secure_broker.pki.untrusted_cert.read_bytes()
    )
    bad_props = tmp_path / "bad.properties"
    bad_props.write_text(
        props.read_text().replace(str(secure_broker.pki.client_keystore), str(bad))
        + "request.timeout.ms=5000\ndefault.api.timeout.ms=10000\n"
    )
    refused = tool("kafka-topics", "--list", bootstrap=b, config=bad_props, check=False)
    assert "SslAuthenticationException" in refused or "SSL handshake failed" in refused, refused


def test_kafka_configs_reloads_a_listeners_keystore(
    secure_broker: SecureBroker, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    """Kafka's way to reload a keystore now: kafka-configs sets a listener's keystore path to
    the path it has (docs/security.md, "Reloading now"); the tool accepts the broker's answer
    as it does Kafka's, and another path is refused with the broker's reason. (That the reload
    happens at once is checked in test_certificate_reload.py.)"""
    b = secure_broker.bootstrap("SASL_SSL")
    admin = secure_broker.java_properties(tmp_path / "admin.properties")
    keystore = secure_broker.pki.directory / "broker.pem"
    broker = ["--entity-type", "brokers", "--entity-name", "0"]
    same = f"listener.name.sasl_ssl.ssl.keystore.location={keystore}"
    out = tool("kafka-configs", "--alter", "--add-config", same, *broker, bootstrap=b, config=admin)
    assert "Completed updating config for broker 0." in out, out
    elsewhere = f"ssl.keystore.location={tmp_path / 'other.pem'}"
    other = tool(
        "kafka-configs",
        "--alter",
        "--add-config",
        elsewhere,
        *broker,
        bootstrap=b,
        config=admin,
        check=False,
    )
    assert "InvalidConfigurationException" in other and "changes only with a restart" in other
