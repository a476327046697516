"""The control plane on Kubernetes (docs/security.md, "The control plane"): the tokens' Secret
(generated once, kept across upgrades), who mounts which key, the HTTP ports on the pod's IP,
and the NetworkPolicies that let only the operator reach the brokers' control port and only the
brokers reach the operator's controller port. Checked against the code that reads them: the
rendered environment is fed to the broker's and the operator's own settings."""

from __future__ import annotations

from typing import Any

import pytest
from tidalmq_broker.settings import from_sources
from tidalmq_operator.settings import OperatorSettings

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
)

SECRET = f"{FULL}-control"
TOKENS = "/etc/tidalmq/control"
PROMETHEUS = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}  # fmt: skip

pytestmark = pytest.mark.usefixtures("helm")


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


def template_labels(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    return find(docs, kind, name)["spec"]["template"]["metadata"]["labels"]


def mounted_keys(docs: list[dict[str, Any]], kind: str, name: str, c: str) -> dict[str, Any]:
    """The control-token volume of a workload: its Secret, mode, keys, and where it is mounted."""
    volume = next(
        v for v in pod_spec(find(docs, kind, name))["volumes"] if v["name"] == "control-token"
    )
    mount = next(m for m in container(find(docs, kind, name), c)["volumeMounts"]
                 if m["name"] == "control-token")  # fmt: skip
    return {"secret": volume["secret"]["secretName"], "mode": volume["secret"]["defaultMode"],
            "keys": [i["key"] for i in volume["secret"]["items"]], "path": mount["mountPath"],
            "readOnly": mount["readOnly"]}  # fmt: skip


def with_pod_ip(env: dict[str, Any], ip: str = "10.1.2.3") -> dict[str, str]:
    """The container's environment as the kubelet expands it (strings only)."""
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    return {
        k: v.replace("$(POD_IP)", ip).replace("$(POD_NAME)", f"{STS}-1") for k, v in plain.items()
    }


# ---------------------------------------------------------------------------- the tokens
def test_the_chart_generates_two_secrets_for_the_control_plane(
    default: list[dict[str, Any]],
) -> None:
    import base64

    secret = find(default, "Secret", SECRET)
    assert secret["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert set(values) == {"admin-token", "broker-secret"}
    assert all(len(v) == 48 and v.isalnum() for v in values.values())
    assert values["admin-token"] != values["broker-secret"]


def test_brokers_get_the_brokers_secret_only_the_operator_both(
    default: list[dict[str, Any]],
) -> None:
    broker = mounted_keys(default, "StatefulSet", STS, "broker")
    assert broker == {"secret": SECRET, "mode": 0o440, "keys": ["broker-secret"], "path": TOKENS,
                      "readOnly": True}, "a broker pod never holds the admin token"  # fmt: skip
    operator = mounted_keys(default, "Deployment", OPERATOR, "operator")
    assert operator == {"secret": SECRET, "mode": 0o440, "keys": ["admin-token", "broker-secret"],
                        "path": TOKENS, "readOnly": True}  # fmt: skip
    # no token travels as a plain env value
    for kind, name, c in (("StatefulSet", STS, "broker"), ("Deployment", OPERATOR, "operator")):
        env = env_of(container(find(default, kind, name), c))
        assert "TIDALMQ_CONTROL_TOKEN" not in env and "TIDALMQ_CONTROL_BROKER_SECRET" not in env


def test_an_existing_secret_replaces_the_generated_one() -> None:
    docs = render({"controlPlane": {"existingSecret": "my-control"}})
    assert not [s for s in find_all(docs, "Secret") if s["metadata"]["name"] == SECRET]
    assert mounted_keys(docs, "StatefulSet", STS, "broker")["secret"] == "my-control"
    assert mounted_keys(docs, "Deployment", OPERATOR, "operator")["secret"] == "my-control"


def test_the_control_checksum_is_a_constant_of_the_values(default: list[dict[str, Any]]) -> None:
    """Like checksum/object-store: it never hashes the generated tokens (random until stored),
    so an upgrade with the same values restarts no pod; another Secret does."""

    def sums(docs: list[dict[str, Any]]) -> set[str]:
        return {find(docs, kind, name)["spec"]["template"]["metadata"]["annotations"]
                ["checksum/control-token"]
                for kind, name in (("StatefulSet", STS), ("Deployment", OPERATOR))}  # fmt: skip

    (first,) = sums(default)
    assert sums(render()) == {first}
    assert sums(render({"broker": {"logLevel": "DEBUG"}})) == {first}
    (other,) = sums(render({"controlPlane": {"existingSecret": "my-control"}}))
    assert other != first


# ------------------------------------------------------------------ what the code reads from it
def test_the_broker_reads_its_token_and_control_address_from_the_rendered_env(
    default: list[dict[str, Any]], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = with_pod_ip(env_of(container(find(default, "StatefulSet", STS), "broker")))
    token_file = tmp_path / "broker-secret"
    token_file.write_text("s" * 48)
    assert env["TIDALMQ_CONTROL_TOKEN_FILE"] == f"{TOKENS}/broker-secret"
    env["TIDALMQ_CONTROL_TOKEN_FILE"] = str(token_file)
    monkeypatch.setattr("socket.gethostname", lambda: f"{STS}-1")
    settings = from_sources(None, env)
    assert settings.broker_id == 1 and settings.http_host == "10.1.2.3"
    # the controller's pushes and the preStop drain go to the control port at the pod's IP,
    # over mTLS by default (test_control_tls.py: the certificates)
    assert settings.control_url() == "https://10.1.2.3:9645"
    credentials = settings.control_credentials()
    assert credentials is not None and credentials.token.startswith("broker-1.")
    assert settings.controller_url == f"https://{OPERATOR}.{NAMESPACE}.svc:9690"


def test_the_operator_reads_its_tokens_and_bind_addresses_from_the_rendered_env(
    default: list[dict[str, Any]], tmp_path: Any
) -> None:
    env = with_pod_ip(env_of(container(find(default, "Deployment", OPERATOR), "operator")))
    for key in ("admin-token", "broker-secret"):
        (tmp_path / key).write_text(key[0] * 48)
        name = (
            "TIDALMQ_CONTROL_TOKEN_FILE"
            if key == "admin-token"
            else "TIDALMQ_CONTROL_BROKER_SECRET_FILE"
        )
        assert env[name] == f"{TOKENS}/{key}"
        env[name] = str(tmp_path / key)
    settings = OperatorSettings.from_env(env)
    assert (settings.controller_host, settings.http_host) == ("10.1.2.3", "10.1.2.3")
    auth = settings.control_auth()
    assert auth.token == "a" * 48
    assert auth.broker_token(0) != f"broker-0.{'a' * 64}"  # derived from the brokers' secret


# ---------------------------------------------------------------------------- NetworkPolicy
def policy(docs: list[dict[str, Any]], name: str) -> dict[int, list[dict[str, Any]] | None]:
    """port -> the peers allowed to it (None: anyone)."""
    np = find(docs, "NetworkPolicy", name)
    assert np["spec"]["policyTypes"] == ["Ingress"]
    out: dict[int, list[dict[str, Any]] | None] = {}
    for rule in np["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP" and port["port"] not in out
            out[port["port"]] = rule.get("from")
    return out


def test_network_policies_let_only_the_operator_and_the_brokers_reach_each_other(
    default: list[dict[str, Any]],
) -> None:
    broker_labels = template_labels(default, "StatefulSet", STS)
    operator_labels = template_labels(default, "Deployment", OPERATOR)
    broker_np = find(default, "NetworkPolicy", STS)
    operator_np = find(default, "NetworkPolicy", OPERATOR)
    assert broker_np["spec"]["podSelector"]["matchLabels"].items() <= broker_labels.items()
    assert operator_np["spec"]["podSelector"]["matchLabels"].items() <= operator_labels.items()
    assert not operator_np["spec"]["podSelector"]["matchLabels"].items() <= broker_labels.items()

    brokers = policy(default, STS)
    ports = {
        p["name"]: p["containerPort"]
        for p in container(find(default, "StatefulSet", STS), "broker")["ports"]
    }
    assert set(brokers) == set(ports.values()), "every broker port has its rule, and no other"
    assert brokers[ports["kafka"]] is None, "Kafka clients from anywhere by default"
    assert brokers[ports["http"]] == [PROMETHEUS]
    (only,) = brokers[ports["control"]]  # type: ignore[misc]
    assert set(only) == {"podSelector"}, "the release's namespace only (no namespaceSelector)"
    assert only["podSelector"]["matchLabels"].items() <= operator_labels.items()
    assert not only["podSelector"]["matchLabels"].items() <= broker_labels.items()

    operator = policy(default, OPERATOR)
    ports = {
        p["name"]: p["containerPort"]
        for p in container(find(default, "Deployment", OPERATOR), "operator")["ports"]
    }
    assert set(operator) == set(ports.values())
    # the brokers, and a standby operator replica registering its feature levels with the
    # active one; both from the release's namespace only
    from_brokers, from_operators = operator[ports["controller"]]  # type: ignore[misc]
    assert set(from_brokers) == set(from_operators) == {"podSelector"}
    assert from_brokers["podSelector"]["matchLabels"].items() <= broker_labels.items()
    assert not from_brokers["podSelector"]["matchLabels"].items() <= operator_labels.items()
    assert from_operators["podSelector"]["matchLabels"].items() <= operator_labels.items()
    assert not from_operators["podSelector"]["matchLabels"].items() <= broker_labels.items()
    assert operator[ports["metrics"]] == [PROMETHEUS]


def test_network_policies_follow_values() -> None:
    kafka_from = [{"namespaceSelector": {"matchLabels": {"team": "payments"}}},
                  {"ipBlock": {"cidr": "10.20.0.0/16"}}]  # fmt: skip
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app": "prometheus"}}}  # fmt: skip
    docs = render({
        "networkPolicy": {"kafkaFrom": kafka_from, "metricsFrom": [prometheus]},
        "broker": {"ports": {"kafka": 19092, "http": 19644, "control": 19645}},
        "operator": {"ports": {"controller": 19690, "metrics": 19691}},
    })  # fmt: skip
    brokers, operator = policy(docs, STS), policy(docs, OPERATOR)
    assert set(brokers) == {19092, 19644, 19645} and set(operator) == {19690, 19691}
    assert brokers[19092] == kafka_from
    assert brokers[19644] == operator[19691] == [prometheus]
    assert not find_all(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_scrape_targets_are_the_ports_prometheus_may_reach() -> None:
    docs = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    allowed = {STS: policy(docs, STS), OPERATOR: policy(docs, OPERATOR)}
    for kind, name, c in (("StatefulSet", STS, "broker"), ("Deployment", OPERATOR, "operator")):
        annotations = find(docs, kind, name)["spec"]["template"]["metadata"]["annotations"]
        port = int(annotations["prometheus.io/port"])
        assert allowed[name][port] == [PROMETHEUS], name
        # the probes go to a port of the same container (the kubelet is always allowed)
        probe = container(find(docs, kind, name), c)["livenessProbe"]["httpGet"]
        assert probe["path"] == "/healthz"


# ------------------------------------------------------------------ finalized feature levels
@pytest.mark.parametrize("level", [0, 1, 2])
def test_the_transaction_version_reaches_the_operators_controller(level: int) -> None:
    """controlPlane.features.transactionVersion, as the operator's settings read it from the
    rendered env (0 too: not dropped as a false value), and only the operator gets it."""
    docs = render({"controlPlane": {"features": {"transactionVersion": level}}})
    env = env_of(container(find(docs, "Deployment", OPERATOR), "operator"))
    assert env["TIDALMQ_TRANSACTION_VERSION"] == str(level)
    settings = OperatorSettings.from_env(with_pod_ip(env))
    assert settings.transaction_version == level
    assert "TIDALMQ_TRANSACTION_VERSION" not in env_of(
        container(find(docs, "StatefulSet", STS), "broker")
    )


def test_the_transaction_version_is_unset_by_default(default: list[dict[str, Any]]) -> None:
    """Not set: the metadata's level stays (1 for a new cluster) and kafka-features manages
    it; a level set at start would undo every `kafka-features upgrade` at the next start."""
    env = env_of(container(find(default, "Deployment", OPERATOR), "operator"))
    assert "TIDALMQ_TRANSACTION_VERSION" not in env
    assert OperatorSettings.from_env(with_pod_ip(env)).transaction_version is None
