"""A CustomResourceDefinition is applied and a small Kopf handler (e2e/operators/echo_handler.py),
running in a pod of the TidalMQ image, reconciles custom resources of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.kube import E2E_DIR, Cluster, CommandError, wait_until

CRD_NAME = "echoes.e2e.tidalmq.io"
HANDLER = (E2E_DIR / "operators" / "echo_handler.py").read_text()

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: echoes.e2e.tidalmq.io}
spec:
  group: e2e.tidalmq.io
  scope: Namespaced
  names: {plural: echoes, singular: echo, kind: Echo}
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      additionalPrinterColumns:
        - {name: Phase, type: string, jsonPath: .status.phase}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [message]
              properties:
                message: {type: string}
            status:
              type: object
              x-kubernetes-preserve-unknown-fields: true
"""


def operator(namespace: str, image: str) -> str:
    handler = "".join("    " + line for line in HANDLER.splitlines(keepends=True))
    return f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: echo-operator}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: echo-operator}}
rules:
  - apiGroups: [e2e.tidalmq.io]
    resources: [echoes, echoes/status]
    verbs: [get, list, watch, patch, update]
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get, create, patch]
  - apiGroups: ["", events.k8s.io]
    resources: [events]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: echo-operator}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: echo-operator}}
subjects: [{{kind: ServiceAccount, name: echo-operator, namespace: {namespace}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {namespace}-echo-operator}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-echo-operator-discovery}}
subjects: [{{kind: ServiceAccount, name: echo-operator, namespace: {namespace}}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: echo-handler}}
data:
  echo_handler.py: |
{handler}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo-operator}}
spec:
  replicas: 1
  strategy: {{type: Recreate}}
  selector:
    matchLabels: {{app: echo-operator}}
  template:
    metadata:
      labels: {{app: echo-operator}}
    spec:
      serviceAccountName: echo-operator
      terminationGracePeriodSeconds: 2
      containers:
        - name: kopf
          image: {image}
          imagePullPolicy: IfNotPresent
          command: [kopf, run, --standalone, --namespace, {namespace}, /handlers/echo_handler.py]
          resources:
            requests: {{cpu: 20m, memory: 64Mi}}
          volumeMounts: [{{name: handlers, mountPath: /handlers}}]
      volumes:
        - name: handlers
          configMap: {{name: echo-handler}}
"""


DISCOVERY_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: e2e-echo-operator-discovery}
rules:
  - apiGroups: [apiextensions.k8s.io]
    resources: [customresourcedefinitions]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [namespaces]
    verbs: [get, list, watch]
"""


@pytest.fixture
def echo_crd(cluster: Cluster) -> Iterator[None]:
    cluster.apply(CRD)
    cluster.apply(DISCOVERY_ROLE)
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    yield
    cluster.kubectl("delete", "crd", CRD_NAME, "--wait=false")
    cluster.kubectl("delete", "clusterrole", "e2e-echo-operator-discovery", "--wait=false")


def echo(name: str, message: str) -> str:
    return f"""
apiVersion: e2e.tidalmq.io/v1
kind: Echo
metadata: {{name: {name}}}
spec: {{message: {message!r}}}
"""


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("echo_crd")
def test_kopf_handler_reconciles_custom_resource(cluster: Cluster, namespace: str) -> None:
    # The API server validates against the CRD's schema before any handler runs.
    with pytest.raises(CommandError, match=r"spec\.message: Required value"):
        cluster.apply(
            "apiVersion: e2e.tidalmq.io/v1\nkind: Echo\nmetadata: {name: bad}\nspec: {}\n",
            namespace,
        )

    cluster.apply(operator(namespace, cluster.images["broker"]), namespace)
    try:
        cluster.wait_ready(namespace, "deployment/echo-operator", timeout=180)
        cluster.apply(echo("greeting", "hello from e2e"), namespace)

        def status(expected: str) -> dict[str, str] | None:
            st = cluster.kubectl_json("-n", namespace, "get", "echo", "greeting").get("status", {})
            return st if st.get("echoed") == expected else None

        st = wait_until(
            "the handler to reconcile the Echo", lambda: status("hello from e2e"), timeout=120
        )
        assert st["phase"] == "Reconciled"
        data = cluster.kubectl_json("-n", namespace, "get", "configmap", st["configMap"])["data"]
        assert data == {"message": "hello from e2e"}

        # An update of the spec is reconciled too.
        cluster.apply(echo("greeting", "updated"), namespace)
        wait_until("the handler to reconcile the update", lambda: status("updated"), timeout=120)
        data = cluster.kubectl_json("-n", namespace, "get", "configmap", "greeting-echo")["data"]
        assert data == {"message": "updated"}
        printed = cluster.kubectl("-n", namespace, "get", "echoes")
        assert "Reconciled" in printed, printed
    finally:
        cluster.kubectl(
            "delete", "clusterrolebinding", f"{namespace}-echo-operator", "--wait=false"
        )
