"""`tidalmq local up --security sasl_ssl`: brokers listening with SASL_SSL only, a CA and an
admin user made for the data dir, a client.properties for Kafka's tools; credentials and ACLs
created on one broker reach the others through the controller (HTTP); all of it survives a
restart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from tidalmq_operator import users
from tidalmq_operator.planning import client_secret_data
from tidalmq_planner import assignment as sources

from bench.kafka.harness import KafkaDist, run_tool
from tests.support.local_cluster import LocalClusterProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def confluent(bootstrap: str, security: Path, user: str, password: str) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(security / "ca.pem"),
    }


def tidalmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidalmq_broker.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def reassign(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tidalmq_broker.cli",
            "reassign",
            "--bootstrap-server",
            bootstrap,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_local_cluster_with_sasl_ssl(tmp_path: Path, apache_kafka_dist: KafkaDist) -> None:
    data = tmp_path / "local"
    security = data / "security"
    cluster = LocalClusterProcess(data, brokers=2, args=["--security", "sasl_ssl"])
    with cluster:
        # what it printed is what works
        assert f"user admin, password in {security / 'admin-password'}" in cluster.output
        assert f"--command-config {security / 'client.properties'} --list" in cluster.output
        password = (security / "admin-password").read_text().strip()
        props = security / "client.properties"
        first, second = cluster.bootstrap.split(",")
        topic = f"local-{uuid.uuid4().hex[:8]}"
        created = run_tool(
            "kafka-topics",
            "--command-config",
            str(props),
            "--create",
            "--topic",
            topic,
            "--partitions",
            "2",
            bootstrap=first,
            check=True,
        )
        assert f"Created topic {topic}." in created.stdout
        # the project's own Kafka clients take the same client.properties: `tidalmq reassign`
        # (Kafka's --command-config) and the planner's --bootstrap-server
        listed = reassign(first, "--list", "--command-config", str(props))
        assert listed.returncode == 0, listed.stderr
        assert "No partition reassignments found." in listed.stdout
        wrong = tmp_path / "wrong.properties"
        wrong.write_text(props.read_text().replace(password, "not-the-password"))
        refused_cli = reassign(first, "--list", "--command-config", str(wrong))
        assert refused_cli.returncode == 1 and "authentication of 'admin' failed" in (
            refused_cli.stderr
        ), refused_cli.stderr
        plain = reassign(first, "--list")
        assert plain.returncode == 1 and "connection failed" in plain.stderr, plain.stderr
        view = sources.from_bootstrap(first, command_config=str(props))
        assert {(topic, 0), (topic, 1)} <= set(view.assignment) and view.brokers == [0, 1]
        # ... and `tidalmq static-topic describe --bootstrap-server` (the mapping over Kafka)
        made = tidalmq("static-topic", "create", "ledger", "--queues", "2", "--data-dir", str(data))
        assert made.returncode == 0, made.stderr
        described = tidalmq(
            "static-topic",
            "describe",
            "ledger",
            "--bootstrap-server",
            second,
            "--command-config",
            str(props),
            "--output",
            "json",
        )
        assert described.returncode == 0, described.stderr
        assert json.loads(described.stdout)["totalQueues"] == 2
        bare = tidalmq("static-topic", "describe", "ledger", "--bootstrap-server", second)
        assert bare.returncode == 1 and bare.stderr.count("\n") == 1, bare.stderr
        # the planner's driver on Kubernetes: its own User (SCRAM, Describe on every topic), the
        # client Secret the operator writes for a run, mounted as files, read through Kafka's
        # DirectoryConfigProvider; without the ACL it sees no topic
        admin = AdminClient(confluent(first, security, "admin", password))
        scram = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        upsert = UserScramCredentialUpsertion("planner", scram, b"planner-secret")
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
        mount = tmp_path / "planner-client"
        mount.mkdir()
        planner_user = {
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": users.jaas_config("planner", "planner-secret"),
        }
        ca_pem = (security / "ca.pem").read_text()
        for name, text in client_secret_data(
            "SASL_SSL", planner_user, ca_pem, mount=str(mount)
        ).items():
            (mount / name).write_text(text)
        planner_props = str(mount / "client.properties")
        assert "planner-secret" not in (mount / "client.properties").read_text()
        assert not {(topic, 0)} & set(
            sources.from_bootstrap(first, command_config=planner_props).assignment
        )
        describe = AclBinding(
            ResourceType.TOPIC,
            "*",
            ResourcePatternType.LITERAL,
            "User:planner",
            "*",
            AclOperation.DESCRIBE,
            AclPermissionType.ALLOW,
        )
        for future in admin.create_acls([describe]).values():
            future.result(30)
        view = sources.from_bootstrap(first, command_config=planner_props)
        assert {(topic, 0), (topic, 1)} <= set(view.assignment) and view.brokers == [0, 1]
        # a user made through broker 0 logs in at broker 1 only: the controller pushed it
        run_tool(
            "kafka-configs",
            "--command-config",
            str(props),
            "--alter",
            "--add-config",
            "SCRAM-SHA-512=[password=bob-secret]",
            "--entity-type",
            "users",
            "--entity-name",
            "bob",
            bootstrap=first,
            check=True,
        )
        # ACLs are enforced, admin is the super user: bob is refused until he is granted (at
        # broker 0, which answered for his credentials), then may write and read what he is
        # granted
        refused: list[int] = []
        early = Producer(
            {**confluent(first, security, "bob", "bob-secret"), "message.timeout.ms": 10000}
        )
        early.produce(topic, b"no", on_delivery=lambda e, _: refused.append(e and e.code()))
        early.flush(15)
        assert refused == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
        run_tool(
            "kafka-acls",
            "--command-config",
            str(props),
            "--add",
            "--allow-principal",
            "User:bob",
            "--producer",
            "--consumer",
            "--topic",
            topic,
            "--group",
            "g-bob",
            bootstrap=first,
            check=True,
        )
        bob = confluent(second, security, "bob", "bob-secret")
        producer = Producer({**bob, "acks": "all"})
        for i in range(10):
            producer.produce(topic, f"m{i}".encode())
        assert producer.flush(30) == 0
        # and no port serves without authentication
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": first, "socket.timeout.ms": 3000}).list_topics(
                timeout=5
            )
    # a restart keeps the CA, the admin's password and the users
    again = LocalClusterProcess(data, brokers=2, args=["--security", "sasl_ssl"])
    with again:
        assert (security / "admin-password").read_text().strip() == password
        for user, secret in (("admin", password), ("bob", "bob-secret")):
            conf = confluent(again.bootstrap, security, user, secret)
            consumer = Consumer({**conf, "group.id": f"g-{user}", "auto.offset.reset": "earliest"})
            consumer.subscribe([topic])
            got = []
            deadline = time.monotonic() + 60
            while len(got) < 10 and time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is not None and m.error() is None:
                    got.append(m.value())
            consumer.close()
            assert sorted(got) == sorted(f"m{i}".encode() for i in range(10)), user
