"""controlPlane.tls (docs/security.md, "mTLS on the control plane"): the chart generates the
control plane's own CA and the brokers' (CN=broker) and operator's (CN=operator) certificates in
FULLNAME-control-tls (or takes controlPlane.tls.existingSecret), each pod mounts its own key only,
and the controller URL is https. Checked against the code that reads them: the rendered Secret is
written as the kubelet projects its items, the rendered environment is fed to the broker's and the
operator's own settings, and their TLS contexts complete a real handshake in which each side sees
the other's role."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from tidalmq_broker.settings import from_sources
from tidalmq_core.control_tls import (
    ControlTls,
    permits,
    role_of,
    server_is_admin,
    server_is_broker,
)
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
    run_helm,
    template_args,
)

SECRET = f"{FULL}-control-tls"
TLS_ENV = ("TIDALMQ_CONTROL_TLS_CERT_FILE", "TIDALMQ_CONTROL_TLS_KEY_FILE",
           "TIDALMQ_CONTROL_TLS_CA_FILE")  # fmt: skip
ON = {"controlPlane": {"tls": {"enabled": True}}}
OFF = {"controlPlane": {"tls": {"enabled": False}}}

pytestmark = pytest.mark.usefixtures("helm")


def pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        "broker": find(docs, "StatefulSet", STS),
        "operator": find(docs, "Deployment", OPERATOR),
    }


def cn(pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(pem)
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_on_by_default_at_a_fresh_install() -> None:
    """controlPlane.tls.enabled auto (the default) at a fresh install (helm template finds no
    release in a cluster): what `true` renders, the generated Secret included."""
    default, on = render(), render(ON)
    generated = [find(docs, "Secret", SECRET)["data"].keys() for docs in (default, on)]
    assert generated[0] == generated[1]
    for role in ("broker", "operator"):
        containers = [container(pods(docs)[role], role) for docs in (default, on)]
        assert env_of(containers[0]) == env_of(containers[1])
        assert pod_spec(pods(default)[role])["volumes"] == pod_spec(pods(on)[role])["volumes"]


def test_false_renders_no_control_tls() -> None:
    docs = render(OFF)
    assert not [d for d in find_all(docs, "Secret") if d["metadata"]["name"] == SECRET]
    for role, obj in pods(docs).items():
        env = env_of(container(obj, role))
        assert not set(TLS_ENV) & set(env), role
        assert "control-tls" not in {v["name"] for v in pod_spec(obj)["volumes"]}
        assert "checksum/control-tls" not in obj["spec"]["template"]["metadata"]["annotations"]
    broker = env_of(container(pods(docs)["broker"], "broker"))
    assert broker["TIDALMQ_CONTROLLER_URL"].startswith("http://")


def test_each_pod_mounts_its_own_certificate_and_the_ca_only() -> None:
    docs = render(ON)
    secret = find(docs, "Secret", SECRET)
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert set(data) == {"ca.crt", "broker.crt", "broker.key", "operator.crt", "operator.key"}
    assert cn(data["broker.crt"]) == "broker" and cn(data["operator.crt"]) == "operator"
    assert cn(data["ca.crt"]) == f"{FULL} control plane CA"
    for role, obj in pods(docs).items():
        env = env_of(container(obj, role))
        assert [env[k] for k in TLS_ENV] == ["/etc/tidalmq/control-tls/tls.crt",
                                             "/etc/tidalmq/control-tls/tls.key",
                                             "/etc/tidalmq/control-tls/ca.crt"]  # fmt: skip
        volume = next(v for v in pod_spec(obj)["volumes"] if v["name"] == "control-tls")
        assert volume["secret"]["secretName"] == SECRET
        assert {i["key"]: i["path"] for i in volume["secret"]["items"]} == {
            "ca.crt": "ca.crt", f"{role}.crt": "tls.crt", f"{role}.key": "tls.key"}  # fmt: skip
        mounts = {m["name"]: m["mountPath"] for m in container(obj, role)["volumeMounts"]}
        assert mounts["control-tls"] == "/etc/tidalmq/control-tls"
        assert "checksum/control-tls" in obj["spec"]["template"]["metadata"]["annotations"]
    broker = env_of(container(pods(docs)["broker"], "broker"))
    assert broker["TIDALMQ_CONTROLLER_URL"] == (f"https://{OPERATOR}.{NAMESPACE}.svc:9690")


def test_an_existing_secret_is_mounted_and_none_is_generated() -> None:
    docs = render({"controlPlane": {"tls": {"enabled": True, "existingSecret": "my-control-pki"}}})
    assert not [d for d in find_all(docs, "Secret") if d["metadata"]["name"] == SECRET]
    for obj in pods(docs).values():
        volume = next(v for v in pod_spec(obj)["volumes"] if v["name"] == "control-tls")
        assert volume["secret"]["secretName"] == "my-control-pki"


def _projected(docs: list[dict[str, Any]], role: str, root: Path) -> dict[str, str]:
    """The role's pod's control-plane environment, its files written where the kubelet puts the
    Secret's items (under `root`)."""
    obj = pods(docs)[role]
    secret = find(docs, "Secret", SECRET)
    volume = next(v for v in pod_spec(obj)["volumes"] if v["name"] == "control-tls")
    directory = root / role
    directory.mkdir()
    for item in volume["secret"]["items"]:
        (directory / item["path"]).write_bytes(base64.b64decode(secret["data"][item["key"]]))
    env = env_of(container(obj, role))
    return {k: env[k].replace("/etc/tidalmq/control-tls", str(directory)) for k in TLS_ENV}


def test_the_rendered_certificates_work_in_the_processes_own_tls_setup(tmp_path: Path) -> None:
    docs = render(ON)
    broker_tls = from_sources(env={**_projected(docs, "broker", tmp_path),
                                   "TIDALMQ_CONTROLLER_URL": "https://x:1"}).control_tls()  # fmt: skip
    operator_tls = OperatorSettings.from_env(_projected(docs, "operator", tmp_path)).control_tls()
    assert isinstance(broker_tls, ControlTls) and isinstance(operator_tls, ControlTls)
    # a broker calls the controller: the operator's server sees the brokers' role
    seen = handshake(operator_tls.server_context(), broker_tls.client_context(server_is_admin))
    role, why = role_of(seen)
    assert role is not None and role.broker_id is None, why
    assert permits(role, 1) == "" and permits(role, None) != ""  # a broker, never the admin
    # the controller pushes to a broker: the broker's server sees the administrator
    role, why = role_of(
        handshake(broker_tls.server_context(), operator_tls.client_context(server_is_broker))
    )
    assert role is not None and role.admin, why


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> dict[str, Any] | None:
    """A real TLS handshake over loopback; the client certificate the server verified."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        result: dict[str, Any] = {}

        def serve() -> None:
            conn, _ = listener.accept()
            with server.wrap_socket(conn, server_side=True) as tls:
                result["peer"] = tls.getpeercert()
                tls.sendall(b"ok")

        thread = threading.Thread(target=serve)
        thread.start()
        with socket.create_connection(("127.0.0.1", port)) as raw, client.wrap_socket(raw) as tls:
            assert tls.recv(2) == b"ok"
        thread.join(10)
    return result.get("peer")


# ------------------------------------------------------------- controlPlane.tls.crlSecret (CRL)
CRL_ENV = "TIDALMQ_CONTROL_TLS_CRL_FILE"


def test_a_crl_secret_is_mounted_in_both_pods_and_named_to_them() -> None:
    docs = render({"controlPlane": {"tls": {"enabled": True, "crlSecret": "control-crl"}}})
    for role, obj in pods(docs).items():
        assert env_of(container(obj, role))[CRL_ENV] == "/etc/tidalmq/control-crl/crl.pem", role
        volume = next(v for v in pod_spec(obj)["volumes"] if v["name"] == "control-crl")
        assert volume["secret"]["secretName"] == "control-crl"
        assert volume["secret"]["items"] == [{"key": "crl.pem", "path": "crl.pem"}]
        assert "optional" not in volume["secret"]  # a pod waits for it: never no CRL at all
        mounts = {m["name"]: m for m in container(obj, role)["volumeMounts"]}
        # the whole Secret (no subPath): the kubelet updates the file, the processes reload it
        assert mounts["control-crl"]["mountPath"] == "/etc/tidalmq/control-crl"
        assert "subPath" not in mounts["control-crl"] and mounts["control-crl"]["readOnly"]


@pytest.mark.parametrize("values", [{}, ON], ids=["default", "tls-on"])
def test_no_crl_by_default(values: dict[str, Any]) -> None:
    for role, obj in pods(render(values)).items():
        assert CRL_ENV not in env_of(container(obj, role)), role
        assert "control-crl" not in {v["name"] for v in pod_spec(obj)["volumes"]}, role


def test_a_crl_secret_without_control_plane_tls_is_refused() -> None:
    values = {"controlPlane": {"tls": {"enabled": False, "crlSecret": "control-crl"}}}
    proc = run_helm(*template_args(values, ()), check=False)
    assert proc.returncode != 0 and "controlPlane.tls.crlSecret needs" in proc.stderr
    bad = {"controlPlane": {"tls": {"enabled": True, "crlSecret": "Bad_Name"}}}
    proc = run_helm(*template_args(bad, ()), check=False)
    assert proc.returncode != 0 and "crlSecret" in proc.stderr
