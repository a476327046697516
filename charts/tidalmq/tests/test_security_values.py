"""The chart's security values (docs/security.md, "Kubernetes: listeners, certificates, User
resources"): listeners.tls / listeners.sasl choose the Kafka listener's protocol, the TLS
certificates come from the chart's generated Secrets or tls.existingSecret, the clients CA is
what brokers trust and the operator signs tls Users with, authorization.* reach the brokers, and
users.enabled gives the operator its Secret rights. Checked against the code that reads them:
the rendered environment (and the generated certificates, written as the Secret volume
lays them out) is fed to the broker's own settings, listener and TLS setup."""

from __future__ import annotations

import base64
import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from tidalmq_broker.security.endpoints import build_authorizer, build_endpoints
from tidalmq_broker.security.principal import PrincipalMapper
from tidalmq_broker.settings import from_sources
from tidalmq_core.acls import AclOperation, ResourceType
from tidalmq_operator import clients_crl, users

from tests.support.helm import (
    FULL,
    NAMESPACE,
    OPERATOR,
    STS,
    container,
    env_of,
    find,
    find_all,
    pod_spec,
    render,
    run_helm,
    template_args,
)

BROKER_TLS = f"{FULL}-broker-tls"
CLIENTS_CA = f"{FULL}-clients-ca"
PLAINTEXT = {"listeners": {"tls": {"enabled": False}, "sasl": {"enabled": False}}}
SECURITY_ENV = ("TIDALMQ_LISTENERS", "TIDALMQ_ADVERTISED_LISTENERS", "TIDALMQ_SSL_KEYSTORE_LOCATION",
                "TIDALMQ_SSL_KEYSTORE_KEY_LOCATION",
                "TIDALMQ_SSL_TRUSTSTORE_LOCATION", "TIDALMQ_SSL_CLIENT_AUTH",
                "TIDALMQ_SASL_ENABLED_MECHANISMS", "TIDALMQ_SUPER_USERS")  # fmt: skip

pytestmark = pytest.mark.usefixtures("helm", "pod_hostname")


@pytest.fixture
def pod_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker takes its id from its pod's name (TIDALMQ_BROKER_ID_FROM_HOSTNAME)."""
    monkeypatch.setattr("socket.gethostname", lambda: f"{STS}-1")


def broker_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return env_of(container(find(docs, "StatefulSet", STS), "broker"))


def expanded(env: dict[str, Any]) -> dict[str, str]:
    """The broker container's environment as the kubelet expands it."""
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    host = plain["TIDALMQ_ADVERTISED_HOST"].replace("$(POD_NAME)", f"{STS}-1")
    return {k: v.replace("$(POD_IP)", "10.1.2.3").replace("$(POD_NAME)", f"{STS}-1")
            .replace("$(TIDALMQ_ADVERTISED_HOST)", host) for k, v in plain.items()}  # fmt: skip


def secret_data(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    s = find(docs, "Secret", name)
    return {k: base64.b64decode(v).decode() for k, v in s["data"].items()}


def volumes(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {v["name"]: v for v in pod_spec(find(docs, "StatefulSet", STS))["volumes"]}


def mounts(docs: list[dict[str, Any]]) -> dict[str, str]:
    c = container(find(docs, "StatefulSet", STS), "broker")
    return {m["name"]: m["mountPath"] for m in c["volumeMounts"]}


def with_files(env: dict[str, str], docs: list[dict[str, Any]], tmp: Path) -> dict[str, str]:
    """The env with the keystore and truststore paths pointing at files made of the rendered
    Secrets, exactly as the Secret volumes lay them out."""
    tls = secret_data(docs, BROKER_TLS)
    (tmp / "tls.crt").write_text(tls["tls.crt"])
    (tmp / "tls.key").write_text(tls["tls.key"])
    env = dict(
        env,
        TIDALMQ_SSL_KEYSTORE_LOCATION=str(tmp / "tls.crt"),
        TIDALMQ_SSL_KEYSTORE_KEY_LOCATION=str(tmp / "tls.key"),
    )
    if "TIDALMQ_SSL_TRUSTSTORE_LOCATION" in env:
        ca = tmp / "ca.crt"
        ca.write_text(secret_data(docs, CLIENTS_CA)["tls.crt"])
        env["TIDALMQ_SSL_TRUSTSTORE_LOCATION"] = str(ca)
    if "TIDALMQ_SSL_CRL_LOCATION" in env:
        # what the operator puts in FULLNAME-clients-crl at its start: an empty CRL of the CA
        ca_data = secret_data(docs, CLIENTS_CA)
        crl = tmp / "crl.pem"
        crl.write_bytes(
            clients_crl.sign_crl(
                clients_crl.CrlState(),
                ca_data["tls.crt"].encode(),
                ca_data["tls.key"].encode(),
                datetime.datetime.now(datetime.UTC),
            )
        )
        env["TIDALMQ_SSL_CRL_LOCATION"] = str(crl)
    return env


# ---------------------------------------------------------------------------- the default
def test_a_fresh_default_install_is_sasl_ssl_with_acls_and_control_plane_mtls(
    tmp_path: Path,
) -> None:
    """Secure by default (docs/security.md, "Secure by default"): the three switches are auto,
    which at a fresh install (helm template finds no release's StatefulSet) is on: a SASL_SSL
    listener offering SCRAM-SHA-512, ACLs enforced, the planner's SCRAM User, control-plane
    mTLS, and the modes recorded on the StatefulSet for the next upgrade."""
    docs = render()
    env = expanded(broker_env(docs))
    assert env["TIDALMQ_LISTENERS"] == "SASL_SSL://0.0.0.0:9092"
    assert env["TIDALMQ_AUTHORIZER"] == "auto"
    settings = from_sources(None, with_files(env, docs, tmp_path))
    listeners, endpoints = build_endpoints(settings, lambda u, m: None)
    (endpoint,) = endpoints
    assert (endpoint.security_protocol, endpoint.ssl_context is not None) == ("SASL_SSL", True)
    assert endpoint.sasl is not None and endpoint.sasl.mechanisms == ("SCRAM-SHA-512",)
    assert build_authorizer(settings, listeners, []).enabled
    assert env["TIDALMQ_CONTROLLER_URL"].startswith("https://")
    assert "TIDALMQ_CONTROL_TLS_CERT_FILE" in env
    assert find(docs, "User", f"{FULL}-planner")["spec"]["authentication"]["type"] == (
        "scram-sha-512"
    )
    assert modes(docs) == {"tls": True, "sasl": True, "controlTls": True}


def modes(docs: list[dict[str, Any]]) -> dict[str, bool]:
    """The security modes recorded on the brokers' StatefulSet (what auto keeps at an upgrade)."""
    recorded = find(docs, "StatefulSet", STS)["metadata"]["annotations"]
    return dict(json.loads(recorded["tidalmq.io/security-modes"]))


def test_explicit_false_is_one_plaintext_listener_as_before() -> None:
    docs = render(PLAINTEXT)
    env = broker_env(docs)
    assert not [k for k in SECURITY_ENV if k in env], "the PLAINTEXT listener is unchanged"
    assert env["TIDALMQ_AUTHORIZER"] == "auto"  # off on PLAINTEXT (the broker's own rule)
    assert "initContainers" not in pod_spec(find(docs, "StatefulSet", STS))
    assert not [
        s for s in find_all(docs, "Secret") if s["metadata"]["name"] in (BROKER_TLS, CLIENTS_CA)
    ]
    settings = from_sources(None, expanded(env))
    listeners, endpoints = build_endpoints(settings, lambda u, m: None)
    assert [(e.name, e.security_protocol, e.ssl_context) for e in endpoints] == [
        ("PLAINTEXT", "PLAINTEXT", None)
    ]
    assert not build_authorizer(settings, listeners, []).enabled
    assert not find_all(docs, "User")
    assert modes(docs) == {"tls": False, "sasl": False, "controlTls": True}
    # the operator knows the clients CA's Secret (it makes one at the first tls User)
    op_env = env_of(container(find(docs, "Deployment", OPERATOR), "operator"))
    assert op_env["TIDALMQ_CLIENTS_CA_SECRET"] == CLIENTS_CA


@pytest.mark.parametrize(
    "values, protocol",
    [({}, "SASL_SSL"),
     ({"listeners": {"tls": {"enabled": "auto"}, "sasl": {"enabled": "auto"}}}, "SASL_SSL"),
     ({"listeners": {"tls": {"enabled": True}, "sasl": {"enabled": True}}}, "SASL_SSL"),
     # one switch set: the other's auto is off, its default before auto (so commands written
     # for the earlier chart get what they got)
     ({"listeners": {"tls": {"enabled": True}}}, "SSL"),
     ({"listeners": {"sasl": {"enabled": True}}}, "SASL_PLAINTEXT"),
     ({"listeners": {"tls": {"enabled": False}}}, "PLAINTEXT"),
     ({"listeners": {"sasl": {"enabled": False}}}, "PLAINTEXT"),
     ({"listeners": {"tls": {"enabled": True}, "sasl": {"enabled": "auto"}}}, "SSL"),
     (PLAINTEXT, "PLAINTEXT")],
    ids=["default", "auto", "both-true", "tls-true", "sasl-true", "tls-false", "sasl-false",
         "tls-true-sasl-auto", "both-false"],
)  # fmt: skip
def test_auto_at_a_fresh_install(values: dict[str, Any], protocol: str) -> None:
    docs = render(values)
    env = broker_env(docs)
    assert env.get("TIDALMQ_LISTENERS", "PLAINTEXT://0.0.0.0:9092") == f"{protocol}://0.0.0.0:9092"
    assert modes(docs)["tls"] == ("SSL" in protocol)
    assert modes(docs)["sasl"] == protocol.startswith("SASL")


@pytest.mark.parametrize("enabled", ["auto", True, False])
def test_each_switch_takes_auto_true_or_false(enabled: object) -> None:
    for values in ({"listeners": {"tls": {"enabled": enabled}}},
                   {"listeners": {"sasl": {"enabled": enabled}}},
                   {"controlPlane": {"tls": {"enabled": enabled}}}):  # fmt: skip
        run_helm(*template_args(values, ()))


# ---------------------------------------------------------------------------- each combination
@pytest.mark.parametrize(
    "tls, sasl, protocol",
    [(True, True, "SASL_SSL"), (True, False, "SSL"), (False, True, "SASL_PLAINTEXT")],
)
def test_listener_protocol_and_what_the_broker_makes_of_it(
    tls: bool, sasl: bool, protocol: str, tmp_path: Path
) -> None:
    docs = render({"listeners": {"tls": {"enabled": tls}, "sasl": {"enabled": sasl}}})
    env = expanded(broker_env(docs))
    assert env["TIDALMQ_LISTENERS"] == f"{protocol}://0.0.0.0:9092"
    advertised = f"{STS}-1.{FULL}-brokers.{NAMESPACE}.svc.cluster.local"
    assert env["TIDALMQ_ADVERTISED_LISTENERS"] == f"{protocol}://{advertised}:9092"
    if tls:
        env = with_files(env, docs, tmp_path)
    settings = from_sources(None, env)
    listeners, endpoints = build_endpoints(settings, lambda u, m: None)
    (endpoint,) = endpoints
    assert (endpoint.name, endpoint.security_protocol, endpoint.port) == (protocol, protocol, 9092)
    assert (endpoint.ssl_context is not None) == tls
    assert (endpoint.sasl is not None) == sasl
    assert [(a.host, a.port) for a in listeners.advertised] == [(advertised, 9092)]
    # ACLs are enforced as soon as the listener is not PLAINTEXT
    assert build_authorizer(settings, listeners, []).enabled
    if sasl:
        assert endpoint.sasl is not None and endpoint.sasl.mechanisms == ("SCRAM-SHA-512",)
    if tls and not sasl:
        # mTLS: client certificates required, from the clients CA; CN=NAME is User:NAME
        assert env["TIDALMQ_SSL_CLIENT_AUTH"] == "required"
        mapper = PrincipalMapper(settings.ssl_principal_mapping_rules)
        assert mapper.name("CN=alice") == "alice"
        assert mapper.name("CN=alice,O=Acme") == "CN=alice,O=Acme"  # not a User's: unchanged
    else:
        assert "TIDALMQ_SSL_CLIENT_AUTH" not in env and "clients-ca" not in volumes(docs)


def test_generated_certificates(tmp_path: Path) -> None:
    docs = render({"listeners": {"tls": {"enabled": True}}})
    tls = secret_data(docs, BROKER_TLS)
    assert find(docs, "Secret", BROKER_TLS)["type"] == "kubernetes.io/tls"
    cert = x509.load_pem_x509_certificate(tls["tls.crt"].encode())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(tls["ca.crt"].encode()))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = names.get_values_for_type(x509.DNSName)
    assert f"*.{FULL}-brokers.{NAMESPACE}.svc.cluster.local" in dns
    assert f"{FULL}-bootstrap.{NAMESPACE}.svc" in dns
    # the clients CA: the operator signs tls Users with it, and the brokers trust what it signs
    ca = secret_data(docs, CLIENTS_CA)
    pair = users.issue_client_cert(
        users.KeyPair(ca["tls.key"].encode(), ca["tls.crt"].encode()), "alice"
    )
    user_cert = x509.load_pem_x509_certificate(pair.cert_pem)
    user_cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca["tls.crt"].encode()))
    assert ca["tls.crt"] != tls["ca.crt"], "clients and brokers have CAs of their own"


def test_the_broker_reads_its_tls_secret_as_mounted() -> None:
    docs = render({"listeners": {"tls": {"enabled": True}}})
    spec = pod_spec(find(docs, "StatefulSet", STS))
    # no copy of the key made at start: a renewed Secret reaches the broker's files
    assert "initContainers" not in spec
    v = volumes(docs)
    assert v["tls"]["secret"]["secretName"] == BROKER_TLS
    assert "keystore" not in v
    # the brokers get the clients CA's certificate, never its key
    assert v["clients-ca"]["secret"] == {"secretName": CLIENTS_CA, "defaultMode": 0o444,
                                         "items": [{"key": "tls.crt", "path": "ca.crt"}]}  # fmt: skip
    broker = container(find(docs, "StatefulSet", STS), "broker")
    (tls_mount,) = [m for m in broker["volumeMounts"] if m["name"] == "tls"]
    # a subPath mount would never see an update
    assert tls_mount == {"name": "tls", "mountPath": "/etc/tidalmq/tls", "readOnly": True}
    env = broker_env(docs)
    assert env["TIDALMQ_SSL_KEYSTORE_LOCATION"] == "/etc/tidalmq/tls/tls.crt"
    assert env["TIDALMQ_SSL_KEYSTORE_KEY_LOCATION"] == "/etc/tidalmq/tls/tls.key"
    assert env["TIDALMQ_SSL_TRUSTSTORE_LOCATION"] == "/etc/tidalmq/clients-ca/ca.crt"


def test_existing_secrets_replace_the_generated_ones() -> None:
    docs = render({"listeners": {"tls": {"enabled": True}},
                   "tls": {"existingSecret": "my-broker-cert", "clientsCaSecret": "my-clients-ca"}})  # fmt: skip
    names = {s["metadata"]["name"] for s in find_all(docs, "Secret")}
    assert not names & {BROKER_TLS, CLIENTS_CA}
    v = volumes(docs)
    assert v["tls"]["secret"]["secretName"] == "my-broker-cert"
    assert v["clients-ca"]["secret"]["secretName"] == "my-clients-ca"
    op_env = env_of(container(find(docs, "Deployment", OPERATOR), "operator"))
    assert op_env["TIDALMQ_CLIENTS_CA_SECRET"] == "my-clients-ca"


def test_sasl_mechanisms_client_auth_authorizer_and_super_users() -> None:
    docs = render({"listeners": {"tls": {"enabled": True, "clientAuth": "requested"},
                                 "sasl": {"enabled": False}},
                   "authorization": {"authorizer": "acl", "superUsers": ["User:admin", "User:ops"]}})  # fmt: skip
    env = broker_env(docs)
    assert env["TIDALMQ_SSL_CLIENT_AUTH"] == "requested"
    assert env["TIDALMQ_AUTHORIZER"] == "acl"
    assert env["TIDALMQ_SUPER_USERS"] == "User:admin;User:ops"
    docs = render(
        {"listeners": {"sasl": {"enabled": True, "mechanisms": ["SCRAM-SHA-256", "SCRAM-SHA-512"]}}}
    )
    env = expanded(broker_env(docs))
    assert env["TIDALMQ_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-256,SCRAM-SHA-512"
    (endpoint,) = build_endpoints(from_sources(None, env), lambda u, m: None)[1]
    assert endpoint.sasl is not None and endpoint.sasl.mechanisms == (
        "SCRAM-SHA-256",
        "SCRAM-SHA-512",
    )
    assert not find_all(docs, "Secret") or BROKER_TLS not in {
        s["metadata"]["name"] for s in find_all(docs, "Secret")
    }


def test_a_crl_secret_is_mounted_and_named_to_the_brokers() -> None:
    docs = render({"listeners": {"tls": {"enabled": True, "crlSecret": "clients-crl"}}})
    env = broker_env(docs)
    assert env["TIDALMQ_SSL_CRL_LOCATION"] == "/etc/tidalmq/crl/crl.pem"
    crl = volumes(docs)["crl"]["secret"]
    assert crl["secretName"] == "clients-crl" and crl["items"] == [
        {"key": "crl.pem", "path": "crl.pem"}
    ]
    assert "optional" not in crl  # a missing Secret holds the pod back: never no CRL at all
    # the user's CRL wins: the operator keeps none
    assert "TIDALMQ_CLIENTS_CRL_SECRET" not in operator_env(docs)
    broker = container(find(docs, "StatefulSet", f"{FULL}-broker"), "broker")
    mounts = {m["name"]: m for m in broker["volumeMounts"]}
    assert mounts["crl"]["mountPath"] == "/etc/tidalmq/crl" and "subPath" not in mounts["crl"]


CLIENTS_CRL = f"{FULL}-clients-crl"


@pytest.mark.parametrize("client_auth", ["required", "requested"])
def test_the_operator_keeps_the_clients_crl_which_the_brokers_mount(
    client_auth: str, tmp_path: Path
) -> None:
    docs = render({"listeners": {"tls": {"enabled": True, "clientAuth": client_auth}}})
    assert operator_env(docs)["TIDALMQ_CLIENTS_CRL_SECRET"] == CLIENTS_CRL
    env = broker_env(docs)
    assert env["TIDALMQ_SSL_CRL_LOCATION"] == "/etc/tidalmq/crl/crl.pem"
    crl = volumes(docs)["crl"]["secret"]
    assert crl["secretName"] == CLIENTS_CRL and "optional" not in crl
    assert crl["items"] == [{"key": "crl.pem", "path": "crl.pem"}]  # never revoked.json
    assert mounts(docs)["crl"] == "/etc/tidalmq/crl"
    # the chart makes no such Secret (it cannot sign a CRL): the operator does, at its start
    assert CLIENTS_CRL not in {s["metadata"]["name"] for s in find_all(docs, "Secret")}
    # the broker takes the files as the operator makes them (an empty CRL of the clients CA)
    settings = from_sources(None, with_files(expanded(env), docs, tmp_path))
    (endpoint,) = build_endpoints(settings, lambda u, m: None)[1]
    assert endpoint.ssl_context is not None


@pytest.mark.parametrize(
    "values",
    [
        {"listeners": {"tls": {"enabled": True, "clientAuth": "none"}}},  # no client certificates
        {"listeners": {"tls": {"enabled": True}, "sasl": {"enabled": True}}},  # SASL_SSL
        {"listeners": {"tls": {"enabled": True}}, "users": {"enabled": False}},  # no Users
        {"listeners": {"sasl": {"enabled": True}}},
        {},
    ],
)
def test_no_operator_crl_without_client_certificates_from_users(values: dict[str, Any]) -> None:
    docs = render(values)
    assert "TIDALMQ_CLIENTS_CRL_SECRET" not in operator_env(docs)
    assert "TIDALMQ_SSL_CRL_LOCATION" not in broker_env(docs)
    assert "crl" not in volumes(docs)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"listeners": {"tls": {"enabled": True, "crlSecret": "Bad_Name"}}}, "crlSecret"),
        ({"listeners": {"sasl": {"enabled": True, "mechanisms": ["GSSAPI"]}}}, "mechanisms"),
        ({"listeners": {"sasl": {"enabled": True, "mechanisms": []}}}, "mechanisms"),
        ({"listeners": {"tls": {"enabled": True, "clientAuth": "maybe"}}}, "clientAuth"),
        ({"authorization": {"authorizer": "yes"}}, "authorizer"),
        ({"authorization": {"superUsers": ["admin"]}}, "superUsers"),
        ({"tls": {"existingSecret": "Bad_Name"}}, "existingSecret"),
        ({"users": {"enabled": "yes"}}, "users"),
        # the three security switches: auto, true or false, nothing else
        ({"listeners": {"tls": {"enabled": "on"}}}, "/listeners/tls/enabled"),
        ({"listeners": {"sasl": {"enabled": "yes"}}}, "/listeners/sasl/enabled"),
        ({"controlPlane": {"tls": {"enabled": "true"}}}, "/controlPlane/tls/enabled"),
    ],
)
def test_bad_security_values_are_refused(values: dict[str, Any], message: str) -> None:
    proc = run_helm(*template_args(values, ()), check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------- the operator's RBAC
def _secret_verbs(docs: list[dict[str, Any]]) -> set[str]:
    role = find(docs, "Role", OPERATOR)
    return {v for r in role["rules"] if "" in r["apiGroups"] and "secrets" in r["resources"]
            for v in r["verbs"]}  # fmt: skip


def test_operator_may_write_users_secrets_by_name_only() -> None:
    docs = render()
    assert _secret_verbs(docs) == {"get", "create", "patch", "delete"}  # never list or watch
    role = find(docs, "Role", OPERATOR)
    ours = {res for r in role["rules"] if "tidalmq.io" in r["apiGroups"] for res in r["resources"]}
    assert {"users", "users/status", "users/finalizers"} <= ours
    assert _secret_verbs(render({"users": {"enabled": False}})) == set()


PLANNER_ENV = ("TIDALMQ_KAFKA_SECURITY_PROTOCOL", "TIDALMQ_PLANNER_USER_SECRET",
               "TIDALMQ_BROKER_CA_SECRET")  # fmt: skip


def operator_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return env_of(container(find(docs, "Deployment", OPERATOR), "operator"))


@pytest.mark.parametrize(
    ("tls", "sasl", "auth", "protocol"),
    [(True, True, "scram-sha-512", "SASL_SSL"), (True, False, "tls", "SSL"),
     (False, True, "scram-sha-512", "SASL_PLAINTEXT")],
)  # fmt: skip
def test_the_planner_has_its_own_user_on_a_secured_listener(
    tls: bool, sasl: bool, auth: str, protocol: str
) -> None:
    docs = render({"listeners": {"tls": {"enabled": tls}, "sasl": {"enabled": sasl}}})
    user = find(docs, "User", f"{FULL}-planner")
    assert user["spec"]["authentication"] == {"type": auth}
    # Metadata of every topic and nothing else
    assert user["spec"]["authorization"]["acls"] == [
        {"resource": {"type": "topic", "name": "*"}, "operations": ["Describe"]}
    ]
    env = operator_env(docs)
    assert env["TIDALMQ_KAFKA_SECURITY_PROTOCOL"] == protocol
    assert env["TIDALMQ_PLANNER_USER_SECRET"] == f"{FULL}-planner"
    if tls:
        assert env["TIDALMQ_BROKER_CA_SECRET"] == BROKER_TLS
        # the Secret the operator reads the CA from has it (the chart generated it)
        assert "ca.crt" in find(docs, "Secret", BROKER_TLS)["data"]
    else:
        assert "TIDALMQ_BROKER_CA_SECRET" not in env
    # the operator may read both Secrets and write the run's client Secret
    assert {"get", "create", "delete"} <= _secret_verbs(docs)


def test_sha256_only_listeners_give_the_planner_a_sha256_user() -> None:
    docs = render({"listeners": {"sasl": {"enabled": True, "mechanisms": ["SCRAM-SHA-256"]}}})
    assert find(docs, "User", f"{FULL}-planner")["spec"]["authentication"]["type"] == (
        "scram-sha-256"
    )


@pytest.mark.parametrize(
    "values",
    [PLAINTEXT, {"listeners": {"sasl": {"enabled": True}}, "users": {"enabled": False}},
     {"listeners": {"sasl": {"enabled": True}}, "spark": {"enabled": False}}],
)  # fmt: skip
def test_no_planner_user_without_a_secured_listener_users_and_spark(
    values: dict[str, Any],
) -> None:
    docs = render(values)
    assert f"{FULL}-planner" not in {u["metadata"]["name"] for u in find_all(docs, "User")}
    assert not set(PLANNER_ENV) & set(operator_env(docs))


# ---------------------------------------------------------------------------- the bootstrap admin
ADMIN = f"{FULL}-admin"


def test_a_fresh_secure_install_has_an_admin_user_allowed_everything(tmp_path: Path) -> None:
    """users.admin.enabled auto at a fresh install on a secured listener: the User
    FULLNAME-admin, whose ACLs (as the operator makes them, loaded in the broker's own
    authorizer) allow every operation, and no super user in the brokers' environment (adding it
    to a running release would roll them)."""
    docs = render()
    admin = find(docs, "User", ADMIN)
    assert admin["spec"]["authentication"]["type"] == "scram-sha-512"
    _, bindings = users.parse_user(ADMIN, admin["spec"])
    env = with_files(expanded(broker_env(docs)), docs, tmp_path)
    assert "TIDALMQ_SUPER_USERS" not in env
    settings = from_sources(None, env)
    listeners, _ = build_endpoints(settings, lambda u, m: None)
    authorizer = build_authorizer(settings, listeners, [])
    authorizer.load(bindings)
    checks = [(AclOperation.CREATE, ResourceType.CLUSTER, "kafka-cluster"),
              (AclOperation.ALTER, ResourceType.CLUSTER, "kafka-cluster"),
              (AclOperation.WRITE, ResourceType.TOPIC, "orders"),
              (AclOperation.DELETE, ResourceType.TOPIC, "orders"),
              (AclOperation.READ, ResourceType.GROUP, "billing"),
              (AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, "tx-1")]  # fmt: skip
    for op, rt, name in checks:
        assert authorizer.authorize(f"User:{ADMIN}", "10.0.0.1", op, rt, name), (op, rt, name)
        assert not authorizer.authorize("User:someone", "10.0.0.1", op, rt, name), (op, rt, name)


@pytest.mark.parametrize(
    "values, made",
    [(PLAINTEXT, False),
     ({"users": {"admin": {"enabled": False}}}, False),
     ({"users": {"enabled": False}}, False),
     ({"listeners": {"tls": {"enabled": True}}}, True)],
    ids=["plaintext", "admin-false", "users-off", "ssl"],
)  # fmt: skip
def test_the_admin_user_only_on_a_secured_listener_when_wanted(
    values: dict[str, Any], made: bool
) -> None:
    docs = render(values)
    admins = [u for u in find_all(docs, "User") if u["metadata"]["name"] == ADMIN]
    assert bool(admins) == made
    if made:  # an SSL listener: a tls User (a client certificate of the clients CA)
        assert admins[0]["spec"]["authentication"]["type"] == "tls"
