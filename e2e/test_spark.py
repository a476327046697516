"""`spark-submit --master k8s://...` runs a PySpark job in cluster mode from the project's Spark
image: the driver pod ends Succeeded after executor pods ran the tasks.

The submission itself runs in a pod of the same image (as the operator will launch the planner),
so client and cluster always share one Spark version and no JVM is needed on the test host.
"""

from __future__ import annotations

import json

import pytest

from e2e.kube import E2E_DIR, Cluster, wait_until

JOB = (E2E_DIR / "spark_jobs" / "pi.py").read_text()
EXECUTORS = 2


def indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line for line in text.splitlines(keepends=True))


def manifests(namespace: str, image: str) -> str:
    driver_template = """apiVersion: v1
kind: Pod
spec:
  containers:
    - name: spark-kubernetes-driver
      volumeMounts: [{name: job, mountPath: /job}]
  volumes:
    - name: job
      configMap: {name: spark-job}
"""
    submit = [
        "/opt/spark/entrypoint.sh",
        "spark-submit",
        "--master",
        "k8s://https://kubernetes.default.svc:443",
        "--deploy-mode",
        "cluster",
        "--name",
        "tidalmq-e2e-pi",
        "--conf",
        f"spark.kubernetes.namespace={namespace}",
        "--conf",
        f"spark.kubernetes.container.image={image}",
        "--conf",
        "spark.kubernetes.container.image.pullPolicy=IfNotPresent",
        "--conf",
        "spark.kubernetes.authenticate.driver.serviceAccountName=spark",
        "--conf",
        "spark.kubernetes.driver.podTemplateFile=/job/driver-template.yaml",
        "--conf",
        "spark.kubernetes.driver.podTemplateContainerName=spark-kubernetes-driver",
        "--conf",
        f"spark.executor.instances={EXECUTORS}",
        "--conf",
        "spark.executor.cores=1",
        "--conf",
        "spark.driver.memory=512m",
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.kubernetes.driver.request.cores=100m",
        "--conf",
        "spark.kubernetes.executor.request.cores=100m",
        "--conf",
        "spark.kubernetes.executor.deleteOnTermination=false",
        "--conf",
        "spark.kubernetes.submission.waitAppCompletion=true",
        "--conf",
        "spark.kubernetes.report.interval=5s",
        "--conf",
        "spark.ui.enabled=false",
        "local:///job/pi.py",
        "200000",
    ]
    return f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: spark}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: spark}}
rules:
  - apiGroups: [""]
    resources: [pods, pods/log, services, configmaps, persistentvolumeclaims]
    verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: spark}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: spark}}
subjects: [{{kind: ServiceAccount, name: spark, namespace: {namespace}}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: spark-job}}
data:
  pi.py: |
{indent(JOB, 4)}
  driver-template.yaml: |
{indent(driver_template, 4)}
---
apiVersion: batch/v1
kind: Job
metadata: {{name: spark-submit}}
spec:
  backoffLimit: 0
  activeDeadlineSeconds: 900
  template:
    spec:
      serviceAccountName: spark
      restartPolicy: Never
      containers:
        - name: submit
          image: {image}
          imagePullPolicy: IfNotPresent
          command: {json.dumps(submit)}
          resources:
            requests: {{cpu: 100m, memory: 256Mi}}
          volumeMounts: [{{name: job, mountPath: /job}}]
      volumes:
        - name: job
          configMap: {{name: spark-job}}
"""


@pytest.mark.timeout(1200)
def test_spark_submit_runs_pyspark_job_on_kubernetes(cluster: Cluster, namespace: str) -> None:
    cluster.apply(manifests(namespace, cluster.images["spark"]), namespace)

    def job_done() -> str | None:
        status = cluster.kubectl_json("-n", namespace, "get", "job", "spark-submit").get(
            "status", {}
        )
        if status.get("failed"):
            logs = cluster.kubectl("-n", namespace, "logs", "job/spark-submit", check=False)
            raise AssertionError(f"spark-submit failed:\n{logs[-6000:]}")
        return "done" if status.get("succeeded") else None

    wait_until("spark-submit to finish", job_done, timeout=900, interval=5)

    drivers = cluster.kubectl_json("-n", namespace, "get", "pods", "-l", "spark-role=driver")[
        "items"
    ]
    assert len(drivers) == 1, [p["metadata"]["name"] for p in drivers]
    driver = drivers[0]
    driver_log = cluster.kubectl("-n", namespace, "logs", driver["metadata"]["name"])
    assert driver["status"]["phase"] == "Succeeded", driver_log[-6000:]

    executors = cluster.kubectl_json("-n", namespace, "get", "pods", "-l", "spark-role=executor")[
        "items"
    ]
    assert len(executors) >= 1, "no executor pod was created"
    executor_names = {p["metadata"]["name"] for p in executors}

    lines = dict(
        line.split(" ", 1)
        for line in driver_log.splitlines()
        if line.startswith(("PI_", "DRIVER_", "EXECUTOR_"))
    )
    assert 3.0 < float(lines["PI_ESTIMATE"]) < 3.3, lines
    worked = set(lines["EXECUTOR_HOSTS"].split(","))
    assert worked and worked <= executor_names, (
        f"tasks ran on {worked}, executor pods: {executor_names}"
    )
    assert lines["DRIVER_HOST"] not in worked

    submit_log = wait_until(
        "the submission log",
        lambda: cluster.kubectl("-n", namespace, "logs", "job/spark-submit"),
        timeout=30,
    )
    assert "Succeeded" in submit_log, submit_log[-3000:]
