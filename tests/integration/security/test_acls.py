"""ACLs with Kafka's own APIs and semantics ([R1] item 4), against a real broker process with a
SASL_SSL listener (which turns authorization on), `admin` as its bootstrap user and so its super
user, and a PLAINTEXT listener whose clients are User:ANONYMOUS.

- Apache Kafka 4.3's `kafka-acls` (over SASL_SSL as admin, with a client.properties) adds,
  lists and removes ACLs unchanged, and refuses a user who may not.
- The Java client (bench/kafka/java/AclCheck.java: produce, consume in a group, describeConfigs,
  createTopics) gets, step by step, exactly the exceptions Apache Kafka 4.3.1 gave it with the
  same ACLs (recorded against a StandardAuthorizer broker: the KAFKA_* tables below): nothing
  granted, READ on the topic only, everything granted (a PREFIXED binding included), a DENY on
  WRITE (the idempotent producer then gets CLUSTER_AUTHORIZATION_FAILED from InitProducerId, as
  on Kafka), and User:* with wildcard resources but a DENY on the group.
- confluent-kafka gets Kafka's error codes per API, then success once allowed; a DENY overrides
  an ALLOW; PREFIXED bindings cover what they start; the super user bypasses a DENY to everyone.
- No client, super user included, deletes, grows or reconfigures `__consumer_offsets`, or
  appends to it.
- The ACL APIs survive mutated requests while authorization is on (the suite's fuzz test runs
  its broker with authorization off, where they answer SECURITY_DISABLED), and so does every
  other API and version when some of what a request names is allowed and some refused.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kio.schema.errors import ErrorCode
from tidalmq_broker.protocol.records import TRANSACTIONAL_FLAG, build_batch

from bench.kafka.harness import KafkaDist, java_acl_check, run_tool
from tests.integration.broker.test_bad_input import RawClient
from tests.integration.security.conftest import ADMIN, ADMIN_PASSWORD, SecureBroker, make_pki
from tests.support.broker_process import BrokerProcess, free_port
from tests.support.fuzz_broker import Fuzzer, prepare_topics, serves
from tests.support.request_fuzz import GROUP, TOPICS, cases, served_pairs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

OK = "ok"
TOPIC_DENIED, GROUP_DENIED = "TopicAuthorizationException", "GroupAuthorizationException"
CLUSTER_DENIED = "ClusterAuthorizationException"
# What Apache Kafka 4.3.1 answered the Java client, step by step (see the module's docstring)
KAFKA_NOTHING = {
    "produce": TOPIC_DENIED,
    "consume": TOPIC_DENIED,
    "describe_configs": TOPIC_DENIED,
    "create_topic": TOPIC_DENIED,
}
KAFKA_TOPIC_READ = {
    "produce": CLUSTER_DENIED,
    "consume": GROUP_DENIED,
    "describe_configs": TOPIC_DENIED,
    "create_topic": TOPIC_DENIED,
}
KAFKA_GRANTED = {"produce": OK, "consume": OK, "describe_configs": OK, "create_topic": OK}
# (on Kafka the consumer read nothing here, its group being at the end; the test adds a record
# first, so that reading is checked too: a DENY on WRITE does not touch READ)
KAFKA_WRITE_DENIED = {
    "produce": CLUSTER_DENIED,
    "consume": OK,
    "describe_configs": OK,
    "create_topic": OK,
}
KAFKA_GROUP_DENIED = {
    "produce": OK,
    "consume": GROUP_DENIED,
    "describe_configs": OK,
    "create_topic": OK,
}


@dataclass(frozen=True)
class AclBroker:
    secure: SecureBroker

    @property
    def sasl(self) -> str:
        return self.secure.bootstrap("SASL_SSL")

    @property
    def plaintext(self) -> str:
        return self.secure.bootstrap("PLAINTEXT")

    def conf(
        self, user: str = ADMIN, password: str = ADMIN_PASSWORD, **extra: Any
    ) -> dict[str, Any]:
        return self.secure.confluent(
            "SASL_SSL", **{"sasl.username": user, "sasl.password": password, **extra}
        )

    def admin(self, user: str = ADMIN, password: str = ADMIN_PASSWORD) -> AdminClient:
        return AdminClient(self.conf(user, password))

    def user(self, name: str) -> tuple[str, str]:
        """A new SCRAM user (made by admin), and its password."""
        password = f"{name}-secret"
        admin = self.admin()  # kept: a client destroyed fails its futures
        done = admin.alter_user_scram_credentials(
            [
                UserScramCredentialUpsertion(
                    name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
                )
            ]
        )
        for future in done.values():
            future.result(30)
        return name, password


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    root = tmp_path_factory.mktemp("acl-broker")
    pki = make_pki(root / "pki")
    proc = BrokerProcess(f"file://{root / 'objects'}", root / "logs")
    ports = {"PLAINTEXT": proc.port, "SASL_SSL": free_port()}
    proc.args = [
        "--listeners",
        ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "--ssl-keystore-location",
        str(root / "pki" / "broker.pem"),
        "--sasl-enabled-mechanisms",
        "SCRAM-SHA-512",
    ]
    proc.env = {
        "TIDALMQ_SSL_KEY_PASSWORD": "broker-key-pw",
        "TIDALMQ_SCRAM_BOOTSTRAP": f"{ADMIN}:SCRAM-SHA-512:{ADMIN_PASSWORD}",
    }
    with proc:
        log = proc.log_path.read_text()
        assert "authorization on (ACLs; super users User:admin;" in log  # the start line says so
        yield AclBroker(SecureBroker(proc, ports, pki))


def topic_with_a_record(broker: AclBroker, name: str, *, create: bool = True) -> str:
    admin = broker.admin()
    if create:
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    producer = Producer(broker.conf())
    producer.produce(name, b"first")
    assert producer.flush(30) == 0
    return name


def acls_tool(broker: AclBroker, props: Path, *args: str, check: bool = True) -> str:
    proc = run_tool(
        "kafka-acls",
        "--command-config",
        str(props),
        *args,
        bootstrap=broker.sasl,
        check=check,
        timeout=120,
    )
    return proc.stdout + proc.stderr


def entry(user: str, op: str, permission: str = "ALLOW") -> str:
    return f"(principal=User:{user}, host=*, operation={op}, permissionType={permission})"


def resource(kind: str, name: str, pattern: str = "LITERAL") -> str:
    return f"`ResourcePattern(resourceType={kind}, name={name}, patternType={pattern})`"


def test_kafka_acls_and_the_java_client_as_on_kafka(
    acl_broker: AclBroker, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    user, password = acl_broker.user(f"alice{tag}")
    admin = acl_broker.secure.java_properties(tmp_path / "admin.properties")
    alice = acl_broker.secure.java_properties(
        tmp_path / "alice.properties", user=user, password=password
    )
    prefix = f"{user}-"
    topic = topic_with_a_record(acl_broker, f"{prefix}orders")
    group = f"{user}-group"

    def check(step: int) -> dict[str, str]:
        return java_acl_check(
            acl_broker.sasl, topic, group, f"{prefix}new-{step}", command_config=alice
        )

    assert check(1) == KAFKA_NOTHING
    out = acls_tool(
        acl_broker,
        admin,
        "--add",
        "--allow-principal",
        f"User:{user}",
        "--operation",
        "Read",
        "--topic",
        topic,
    )
    assert f"Adding ACLs for resource {resource('TOPIC', topic)}" in out
    assert entry(user, "READ") in out
    assert check(2) == KAFKA_TOPIC_READ
    # everything a producer and a consumer in the group need; describe and create by prefix
    out = acls_tool(
        acl_broker,
        admin,
        "--add",
        "--allow-principal",
        f"User:{user}",
        "--producer",
        "--consumer",
        "--topic",
        topic,
        "--group",
        group,
    )
    assert f"Adding ACLs for resource {resource('GROUP', group)}" in out
    assert all(entry(user, op) in out for op in ("WRITE", "DESCRIBE", "CREATE"))
    out = acls_tool(
        acl_broker,
        admin,
        "--add",
        "--allow-principal",
        f"User:{user}",
        "--operation",
        "Create",
        "--operation",
        "DescribeConfigs",
        "--resource-pattern-type",
        "prefixed",
        "--topic",
        prefix,
    )
    assert f"Adding ACLs for resource {resource('TOPIC', prefix, 'PREFIXED')}" in out
    assert check(3) == KAFKA_GRANTED
    # a DENY wins over every ALLOW (the idempotent producer is refused its producer id: no
    # WRITE on any topic is left); a new record, so that the group has something to read
    acls_tool(
        acl_broker,
        admin,
        "--add",
        "--deny-principal",
        f"User:{user}",
        "--operation",
        "Write",
        "--topic",
        topic,
    )
    topic_with_a_record(acl_broker, topic, create=False)
    assert check(4) == KAFKA_WRITE_DENIED
    listed = acls_tool(acl_broker, admin, "--list", "--topic", topic)
    assert f"Current ACLs for resource {resource('TOPIC', topic)}" in listed
    for op, permission in [
        ("READ", "ALLOW"),
        ("WRITE", "ALLOW"),
        ("DESCRIBE", "ALLOW"),
        ("CREATE", "ALLOW"),
        ("WRITE", "DENY"),
    ]:
        assert entry(user, op, permission) in listed, listed
    # only who may DESCRIBE the cluster lists ACLs
    refused = acls_tool(acl_broker, alice, "--list", check=False)
    assert "Error while executing ACL command" in refused
    assert f"errors.{CLUSTER_DENIED}" in refused
    # removed, they no longer apply: nothing granted on the topic (only the prefixed and group
    # bindings are left)
    acls_tool(acl_broker, admin, "--remove", "--force", "--topic", topic)
    client = acl_broker.admin()
    left = client.describe_acls(
        AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            f"User:{user}",
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    ).result(30)
    assert {(b.name, b.resource_pattern_type) for b in left} == {
        (prefix, ResourcePatternType.PREFIXED),
        (group, ResourcePatternType.LITERAL),
    }
    assert produce_error(acl_broker.conf(user, password), topic) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )


def test_wildcards_with_a_deny_on_the_group_as_on_kafka(
    acl_broker: AclBroker, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    user, password = acl_broker.user(f"carol{tag}")
    topic = topic_with_a_record(acl_broker, f"wild-{tag}")
    group = f"wild-group-{tag}"
    admin = acl_broker.admin()
    grants = [
        AclBinding(
            ResourceType.TOPIC,
            "*",
            ResourcePatternType.LITERAL,
            "User:*",
            "*",
            AclOperation.ALL,
            AclPermissionType.ALLOW,
        ),
        AclBinding(
            ResourceType.GROUP,
            "*",
            ResourcePatternType.LITERAL,
            "User:*",
            "*",
            AclOperation.ALL,
            AclPermissionType.ALLOW,
        ),
        AclBinding(
            ResourceType.GROUP,
            group,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            AclOperation.READ,
            AclPermissionType.DENY,
        ),
    ]
    try:
        for future in admin.create_acls(grants).values():
            future.result(30)
        props = acl_broker.secure.java_properties(
            tmp_path / "carol.properties", user=user, password=password
        )
        got = java_acl_check(acl_broker.sasl, topic, group, f"wild-new-{tag}", command_config=props)
        assert got == KAFKA_GROUP_DENIED
    finally:
        for future in admin.delete_acls(
            [
                AclBindingFilter(
                    rt,
                    "*",
                    ResourcePatternType.LITERAL,
                    "User:*",
                    None,
                    AclOperation.ANY,
                    AclPermissionType.ANY,
                )
                for rt in (ResourceType.TOPIC, ResourceType.GROUP)
            ]
        ).values():
            future.result(30)


# ------------------------------------------------------------------------------ confluent-kafka
def produce_error(conf: dict[str, Any], topic: str) -> int | None:
    """The error code of producing one record, None when acknowledged (a new producer each
    time: a client remembers a refusal in its metadata)."""
    codes: list[int | None] = []

    def delivered(error: KafkaError | None, _: Any) -> None:
        codes.append(None if error is None else int(error.code()))

    producer = Producer({**conf, "message.timeout.ms": 10000})
    try:
        producer.produce(topic, b"v", on_delivery=delivered)
    except KafkaException as exc:
        return int(exc.args[0].code())
    producer.flush(15)
    return codes[0] if codes else -1


def consume_error(conf: dict[str, Any], topic: str, group: str) -> int | None:
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                return int(m.error().code())
            consumer.commit(asynchronous=False)
            return None
        return -1
    finally:
        consumer.close()


def admin_error(future: Any) -> int | None:
    try:
        future.result(30)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def allow(broker: AclBroker, *bindings: tuple[Any, ...]) -> None:
    acls = [
        AclBinding(rt, name, pt, principal, "*", op, perm)
        for rt, name, pt, principal, op, perm in bindings
    ]
    admin = broker.admin()
    for future in admin.create_acls(acls).values():
        future.result(30)


def test_confluent_kafka_denied_per_api_then_allowed(acl_broker: AclBroker) -> None:
    tag = uuid.uuid4().hex[:6]
    user, password = acl_broker.user(f"dave{tag}")
    principal = f"User:{user}"
    topic = topic_with_a_record(acl_broker, f"dave-{tag}")
    group, new = f"dave-group-{tag}", f"dave-new-{tag}"
    conf = acl_broker.conf(user, password)
    dave = AdminClient(conf)
    config = ConfigResource("TOPIC", topic)
    # nothing granted: Kafka's code for each API
    assert produce_error(conf, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert admin_error(dave.describe_configs([config])[config]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    assert admin_error(dave.create_topics([NewTopic(new, 1, 1)])[new]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    ok = AclPermissionType.ALLOW
    allow(acl_broker, (ResourceType.TOPIC, topic, lit, principal, AclOperation.READ, ok))
    assert consume_error(conf, topic, group) == KafkaError.GROUP_AUTHORIZATION_FAILED
    # allowed: each works
    allow(
        acl_broker,
        (ResourceType.GROUP, group, lit, principal, AclOperation.READ, ok),
        (ResourceType.TOPIC, topic, lit, principal, AclOperation.WRITE, ok),
        (ResourceType.TOPIC, topic, lit, principal, AclOperation.DESCRIBE_CONFIGS, ok),
        (ResourceType.TOPIC, "dave-new-", pre, principal, AclOperation.CREATE, ok),
    )
    assert produce_error(conf, topic) is None
    assert consume_error(conf, topic, group) is None
    assert admin_error(dave.describe_configs([config])[config]) is None
    assert admin_error(dave.create_topics([NewTopic(new, 1, 1)])[new]) is None  # the prefix
    other = f"elsewhere-{tag}"
    assert admin_error(dave.create_topics([NewTopic(other, 1, 1)])[other]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    # a DENY overrides the ALLOW
    allow(
        acl_broker,
        (ResourceType.GROUP, group, lit, principal, AclOperation.READ, AclPermissionType.DENY),
    )
    assert consume_error(conf, topic, f"{group}") == KafkaError.GROUP_AUTHORIZATION_FAILED
    # the topics a client may not describe are not even listed for it: CREATE does not imply
    # DESCRIBE, so not the one it created either
    listed = set(dave.list_topics(timeout=10).topics)
    assert topic in listed and new not in listed and "__consumer_offsets" not in listed
    admin = acl_broker.admin()
    assert new in admin.list_topics(timeout=10).topics


def test_the_super_user_bypasses_a_deny_to_everyone(acl_broker: AclBroker) -> None:
    tag = uuid.uuid4().hex[:6]
    user, password = acl_broker.user(f"erin{tag}")
    topic = topic_with_a_record(acl_broker, f"closed-{tag}")
    everyone = (
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        "User:*",
        AclOperation.ALL,
        AclPermissionType.DENY,
    )
    erin = (
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        f"User:{user}",
        AclOperation.ALL,
        AclPermissionType.ALLOW,
    )
    allow(acl_broker, everyone, erin)
    assert produce_error(acl_broker.conf(), topic) is None  # admin: a super user
    assert produce_error(acl_broker.conf(user, password), topic) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    # User:ANONYMOUS on the PLAINTEXT listener has no ACL: refused, and sees no topic
    anonymous = AdminClient({"bootstrap.servers": acl_broker.plaintext})
    assert set(anonymous.list_topics(timeout=10).topics) == set()
    name = f"anon-{tag}"
    assert admin_error(anonymous.create_topics([NewTopic(name, 1, 1)])[name]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    # DescribeAcls shows what was granted, to the super user
    admin = acl_broker.admin()
    found = admin.describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.MATCH,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    ).result(30)
    assert {(b.principal, b.permission_type) for b in found} == {
        ("User:*", AclPermissionType.DENY),
        (f"User:{user}", AclPermissionType.ALLOW),
    }


def test_no_client_changes_the_offsets_topic(acl_broker: AclBroker) -> None:
    admin = acl_broker.admin()  # the super user: ACLs are not what stops it
    offsets = "__consumer_offsets"
    before = len(admin.list_topics(offsets, timeout=10).topics[offsets].partitions)
    grown = admin.create_partitions([NewPartitions(offsets, before + 1)])[offsets]
    assert admin_error(grown) == KafkaError.TOPIC_EXCEPTION  # INVALID_TOPIC_EXCEPTION
    config = ConfigResource(
        "TOPIC",
        offsets,
        incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    changed = admin.incremental_alter_configs([config])[config]
    assert admin_error(changed) == KafkaError.TOPIC_EXCEPTION
    assert admin_error(admin.delete_topics([offsets])[offsets]) == KafkaError.TOPIC_EXCEPTION
    assert produce_error(acl_broker.conf(), offsets) == KafkaError.TOPIC_EXCEPTION
    after = admin.list_topics(offsets, timeout=10).topics[offsets]
    assert after.error is None and len(after.partitions) == before


def test_acl_apis_survive_mutated_requests_with_authorization_on(tmp_path: Path) -> None:
    proc = BrokerProcess(
        f"file://{tmp_path / 'objects'}",
        tmp_path / "logs",
        args=["--authorizer", "acl", "--super-users", "User:ANONYMOUS"],
    )
    with proc:
        assert proc.proc is not None
        pairs = [p for p in served_pairs() if p[0] in (29, 30, 31)]
        assert sorted({v for k, v in pairs}) == [1, 2, 3]
        fuzzer = Fuzzer(
            proc.bootstrap, proc.proc.pid, proc.log_path, metrics_url=f"{proc.http_url}/metrics"
        )
        report = fuzzer.run(list(cases(20261126, 450, pairs)))
        print(report.summary())
        assert report.alive and report.failed_requests == {}, report.summary()
        assert report.not_one_line == [], report.not_one_line[:5]
        assert report.results["answered"] > 20  # some reached the handlers, and the controller
        assert serves(proc.bootstrap)


def test_every_api_survives_mutated_requests_half_refused(acl_broker: AclBroker) -> None:
    """Every served API and version, mutated, from User:ANONYMOUS (the PLAINTEXT listener) with
    ACLs that allow part of what the fuzz requests name and refuse the rest, so each handler's
    refusals run beside its work: no handler may fail. Last in the module: the requests may
    delete topics and groups."""
    first, second = TOPICS
    anonymous = "User:ANONYMOUS"
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    ok, no = AclPermissionType.ALLOW, AclPermissionType.DENY
    allow(
        acl_broker,
        (ResourceType.TOPIC, first, lit, anonymous, AclOperation.ALL, ok),
        (ResourceType.TOPIC, "fuzz-", pre, anonymous, AclOperation.CREATE, ok),
        (ResourceType.TOPIC, "fuzz-", pre, anonymous, AclOperation.READ, ok),
        (ResourceType.TOPIC, second, lit, anonymous, AclOperation.WRITE, no),
        (ResourceType.GROUP, GROUP, lit, anonymous, AclOperation.READ, ok),
        # (confluent-kafka's BROKER is Kafka's CLUSTER)
        (ResourceType.BROKER, "kafka-cluster", lit, anonymous, AclOperation.DESCRIBE, ok),
    )
    proc = acl_broker.secure.process
    assert proc.proc is not None
    prepare_topics(acl_broker.plaintext)
    fuzzer = Fuzzer(
        acl_broker.plaintext, proc.proc.pid, proc.log_path, metrics_url=f"{proc.http_url}/metrics"
    )
    report = fuzzer.run(list(cases(20261127, 2000)))
    print(report.summary())
    assert report.alive and report.failed_requests == {}, report.summary()
    assert report.not_one_line == [], report.not_one_line[:5]
    assert report.results["answered"] > 200
    assert serves(acl_broker.plaintext)


def test_transaction_markers_and_transactional_writes_need_their_acls(
    acl_broker: AclBroker,
) -> None:
    """WriteTxnMarkers needs CLUSTER_ACTION on the cluster, a transactional Produce WRITE on its
    transactional id (docs/transactions.md); User:ANONYMOUS on PLAINTEXT has neither."""
    topic = topic_with_a_record(acl_broker, f"txn-{uuid.uuid4().hex[:8]}")
    c = RawClient(acl_broker.plaintext)
    try:
        resp = c.call(
            27,
            1,
            {
                "markers": [
                    {
                        "producer_id": 1,
                        "producer_epoch": 0,
                        "transaction_result": True,
                        "topics": [{"name": topic, "partition_indexes": [0]}],
                        "coordinator_epoch": 0,
                    }
                ]
            },
        )
        codes = [p.error_code for p in resp.markers[0].topics[0].partitions]  # type: ignore[attr-defined]
        assert codes == [ErrorCode.cluster_authorization_failed]
        records = build_batch(
            [(None, b"v")],
            producer_id=1,
            producer_epoch=0,
            base_sequence=0,
            attributes=TRANSACTIONAL_FLAG,
        )
        for transactional_id in ("tx-1", None):  # a transactional batch needs its id
            resp = c.call(
                0,
                9,
                {
                    "transactional_id": transactional_id,
                    "acks": -1,
                    "timeout": 5000,
                    "topic_data": [
                        {"name": topic, "partition_data": [{"index": 0, "records": records}]}
                    ],
                },
            )
            part = resp.responses[0].partition_responses[0]  # type: ignore[attr-defined]
            assert part.error_code == ErrorCode.transactional_id_authorization_failed
    finally:
        c.close()
