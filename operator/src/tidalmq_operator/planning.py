"""Launching the planner on Spark-on-Kubernetes and collecting its plan.

The contract, for the PartitionReassignment handler (a resource with `spec.generate`):

    job = PlannerJob.from_settings(
        name=run_name(resource_name, uid),          # unique per run, DNS-1123, <= 50 chars
        namespace=settings.namespace,
        image=os.environ["TIDALMQ_SPARK_IMAGE"],   # the chart sets these three
        service_account=os.environ["TIDALMQ_SPARK_SERVICE_ACCOUNT"],
        prometheus_url=os.environ["TIDALMQ_PROMETHEUS_URL"],
        bootstrap_servers=os.environ.get("TIDALMQ_BOOTSTRAP_SERVERS"),
        generate=spec.generate,                     # window, step, maxMoves, threshold, topics
        resource_name=resource_name,
    )
    outcome = await run_planner(job, kube.core, progress=callback)   # raises PlannerFailed

`run_planner`:
  1. deletes a leftover result ConfigMap `<name>-plan` and driver pod `<name>-driver` (a retried
     run starts clean; both names are derived from `name` only);
  2. runs `spark-submit --master k8s://... --deploy-mode cluster` (`submit_command`), with
     `spark.kubernetes.submission.waitAppCompletion=false`: it returns once the driver pod
     exists; a non-zero exit fails the run with spark-submit's output. With `spark_submit="pod"`
     (what the chart sets) it runs in a pod `<name>-submit` of the Spark image
     (`submitter_pod`), otherwise as a subprocess of the operator (`spark_submit` is then the
     executable, e.g. on a developer's machine);
  3. polls the driver pod `<name>-driver` until it Succeeded or Failed (or `timeout_s` passes:
     the driver is deleted and the run fails), calling `progress(phase, message)` on changes;
  4. reads the ConfigMap `<name>-plan` that the driver wrote with its ServiceAccount
     (tidalmq_planner.publish): `plan.json` (Kafka reassignment JSON of the moves; or
     binaryData `plan.json.gz` when larger than a ConfigMap holds), `summary.json`, `report.txt`;
  5. deletes the driver pod and the ConfigMap (unless `keep=True`; executor pods are owned by
     the driver pod and go with it) and returns a PlannerOutcome: the plan entries (ready for
     `status.plan` and, once approved, the controller), the summary and the report table.

With `attach=True`, a driver pod `<name>-driver` that exists already (an earlier launch of the
same run, e.g. before an operator restart) is watched instead of submitting again: a run name
derived from the resource only (`run_name(name, uid, when=0)`) makes a restarted operator resume
its planner instead of running it twice. `cleanup(job, core)` deletes the driver pod and the
result ConfigMap (after `keep=True`, once the plan is stored; or to stop a run).

On a secured Kafka listener (`security_protocol` other than PLAINTEXT) the driver reads the
current assignment as the planner's own User (`client_user_secret`, the User resource's Secret:
SCRAM credentials or a tls client certificate), trusting the brokers' CA (`broker_ca_secret`,
key ca.crt). Before submitting, the run writes a Secret `<name>-client` with those credentials
and a Kafka client properties file (`client_secret_data`) that reads them through Kafka's
DirectoryConfigProvider, and Spark mounts it in the driver only
(`spark.kubernetes.driver.secrets.*`): the driver gets `--command-config`, the executors (which
never talk to Kafka) get nothing. The Secret goes with the run's other objects.

A run that fails raises PlannerFailed with a message for the resource's conditions (the driver
pod's termination reason and exit code; the operator's Role has no pods/log, so logs are not
read). Requirements: the Spark image (`spark_submit="pod"`) or a local `spark-submit` (Java 17
and pyspark); the Role of the chart (pods, services, configmaps: create/get/list/watch/delete)
for the operator and for the Spark ServiceAccount.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidalmq_core.reassignment import PlanEntry, parse_plan

from tidalmq_operator.users import decoded

log = logging.getLogger(__name__)

JOB_FILE = "local:///opt/tidalmq/lib/python3.11/site-packages/tidalmq_planner/job.py"
API_SERVER = "https://kubernetes.default.svc:443"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RUN_LABEL = "tidalmq.io/planner-run"
SUBMIT_IN_POD = "pod"  # PlannerJob.spark_submit: run spark-submit in a pod of the Spark image
SUBMIT_TIMEOUT_S = 300
CLIENT_DIR = "/etc/tidalmq/planner-client"  # where the driver mounts the run's client Secret
DIRECTORY_PROVIDER = "org.apache.kafka.common.config.provider.DirectoryConfigProvider"
SECURE_PROTOCOLS = ("SSL", "SASL_PLAINTEXT", "SASL_SSL")

Progress = Callable[[str, str], Awaitable[None] | None]


class PlannerFailed(RuntimeError):
    """The planner run did not produce a plan; the message says why (for status conditions)."""


class PlannerNotReady(RuntimeError):
    """Something the run needs does not exist yet (the planner User's Secret right after an
    install): the operator tries the run again shortly instead of failing the resource."""


@dataclass(frozen=True, slots=True)
class PlannerJob:
    name: str  # the run: Spark app name, driver pod `<name>-driver`, ConfigMap `<name>-plan`
    namespace: str
    image: str
    service_account: str
    prometheus_url: str
    bootstrap_servers: str | None = None
    # the Kafka listener's protocol; other than PLAINTEXT, the driver connects as the planner's
    # User (its Secret's name) trusting the brokers' CA (a Secret with ca.crt)
    security_protocol: str = "PLAINTEXT"
    client_user_secret: str = ""
    broker_ca_secret: str = ""
    resource_name: str = ""  # the PartitionReassignment the plan is for (annotations only)
    window: str = "7d"
    step: str = "1m"
    threshold: float = 1.10
    max_moves: int | None = None
    topics: tuple[str, ...] = ()
    api_server: str = API_SERVER
    spark_submit: str = "spark-submit"
    job_file: str = JOB_FILE
    executors: int = 2
    executor_cores: int = 1
    executor_memory: str = "1g"
    driver_memory: str = "1g"
    driver_cpu_request: str = "250m"
    executor_cpu_request: str = "250m"
    pull_policy: str = "IfNotPresent"
    extra_conf: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, *, generate: Any | None = None, **kwargs: Any) -> PlannerJob:
        """Fill window/step/threshold/max_moves/topics from a GenerateSpec (models.py)."""
        if generate is not None:
            kwargs.setdefault("window", generate.window)
            kwargs.setdefault("step", generate.step)
            kwargs.setdefault("threshold", generate.threshold)
            kwargs.setdefault("max_moves", generate.max_moves)
            kwargs.setdefault("topics", tuple(generate.topics or ()))
        return cls(**kwargs)

    @property
    def driver_pod(self) -> str:
        return f"{self.name}-driver"

    @property
    def configmap(self) -> str:
        return f"{self.name}-plan"

    @property
    def submit_pod(self) -> str:
        return f"{self.name}-submit"

    @property
    def client_secret(self) -> str:
        """The run's Kafka client Secret (credentials and client.properties), secured only."""
        return f"{self.name}-client"

    @property
    def secured(self) -> bool:
        return self.security_protocol.upper() in SECURE_PROTOCOLS


def client_secret_data(
    protocol: str, user: Mapping[str, str], broker_ca: str | None, *, mount: str = CLIENT_DIR
) -> dict[str, str]:
    """The files of a run's client Secret: `client.properties` for `--command-config` (Kafka's
    names, the credentials read from the mounted files through DirectoryConfigProvider, so the
    file itself holds no secret) and the credentials of the planner's User Secret `user`
    (SCRAM: sasl.mechanism and sasl.jaas.config; tls: user.crt and user.key), plus the brokers'
    CA for TLS; `mount` is where the driver mounts the Secret. Raises PlannerFailed naming what
    is missing."""
    protocol = protocol.upper()
    if protocol not in SECURE_PROTOCOLS:
        raise PlannerFailed(f"no client Secret for the {protocol} protocol")
    lines = [
        "# Kafka client properties of a planner run, written by the operator",
        f"security.protocol={protocol}",
        "config.providers=dir",
        f"config.providers.dir.class={DIRECTORY_PROVIDER}",
        f"config.providers.dir.param.allowed.paths={mount}",
    ]
    data: dict[str, str] = {}
    if protocol.startswith("SASL_"):
        missing = [k for k in ("sasl.mechanism", "sasl.jaas.config") if not user.get(k)]
        if missing:
            raise PlannerFailed(
                f"the planner's User Secret has no {', '.join(missing)}: a SASL listener "
                "needs a scram-sha-512 or scram-sha-256 User"
            )
        data["sasl.jaas.config"] = user["sasl.jaas.config"]
        lines += [
            f"sasl.mechanism={user['sasl.mechanism']}",
            f"sasl.jaas.config=${{dir:{mount}:sasl.jaas.config}}",
        ]
    elif protocol == "SSL":
        missing = [k for k in ("user.crt", "user.key") if not user.get(k)]
        if missing:
            raise PlannerFailed(
                f"the planner's User Secret has no {', '.join(missing)}: an SSL listener with "
                "client authentication needs a tls User"
            )
        data["user.crt"], data["user.key"] = user["user.crt"], user["user.key"]
        lines += [
            f"ssl.certificate.location={mount}/user.crt",
            f"ssl.key.location={mount}/user.key",
        ]
    if protocol.endswith("SSL"):
        if not broker_ca:
            raise PlannerFailed("the brokers' TLS Secret has no ca.crt for the planner to trust")
        data["broker-ca.crt"] = broker_ca
        lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={mount}/broker-ca.crt"]
    data["client.properties"] = "\n".join(lines) + "\n"
    return data


@dataclass(slots=True)
class PlannerOutcome:
    entries: list[PlanEntry]
    plan_json: str
    summary: dict[str, Any]
    report: str
    driver_pod: str
    seconds: float


def run_name(resource_name: str, uid: str = "", when: float | None = None) -> str:
    """A name for one run of the planner for a resource: DNS-1123, unique per resource and start
    time, short enough for `-driver`/`-plan` suffixes and Spark's executor pod names."""
    base = re.sub(r"[^a-z0-9-]+", "-", resource_name.lower()).strip("-")[:30] or "plan"
    stamp = f"{uid}:{when if when is not None else time.time():.3f}"
    return f"tpr-{base}-{hashlib.sha256(stamp.encode()).hexdigest()[:8]}"


def planner_args(job: PlannerJob) -> list[str]:
    """The arguments of the planner job inside the driver (tidalmq_planner.job.main)."""
    args = [
        "--prometheus",
        job.prometheus_url,
        "--window",
        job.window,
        "--step",
        job.step,
        "--threshold",
        repr(float(job.threshold)),
        "--configmap",
        job.configmap,
        "--namespace",
        job.namespace,
    ]
    if job.resource_name:
        args += ["--name", job.resource_name]
    if job.bootstrap_servers:
        args += ["--bootstrap-server", job.bootstrap_servers]
        if job.secured:
            args += ["--command-config", f"{CLIENT_DIR}/client.properties"]
    if job.max_moves is not None:
        args += ["--max-moves", str(job.max_moves)]
    if job.topics:
        args += ["--topics", ",".join(job.topics)]
    return args


def submit_command(job: PlannerJob, *, in_cluster: bool | None = None) -> list[str]:
    """The spark-submit command line of a run (cluster mode; returns once the driver exists).

    In a pod (`in_cluster`, default: the ServiceAccount token exists), the submission
    authenticates with the pod's ServiceAccount token and CA."""
    if in_cluster is None:
        in_cluster = (SA_DIR / "token").exists()
    labels = {
        "app.kubernetes.io/part-of": "tidalmq",
        "app.kubernetes.io/component": "planner",
        RUN_LABEL: job.name,
    }
    conf: dict[str, str] = {
        "spark.kubernetes.namespace": job.namespace,
        "spark.kubernetes.container.image": job.image,
        "spark.kubernetes.container.image.pullPolicy": job.pull_policy,
        "spark.kubernetes.authenticate.driver.serviceAccountName": job.service_account,
        "spark.kubernetes.driver.pod.name": job.driver_pod,
        "spark.kubernetes.executor.podNamePrefix": job.name,
        "spark.kubernetes.submission.waitAppCompletion": "false",
        "spark.executor.instances": str(job.executors),
        "spark.executor.cores": str(job.executor_cores),
        "spark.executor.memory": job.executor_memory,
        "spark.driver.memory": job.driver_memory,
        "spark.kubernetes.driver.request.cores": job.driver_cpu_request,
        "spark.kubernetes.executor.request.cores": job.executor_cpu_request,
        "spark.kubernetes.executor.deleteOnTermination": "true",
        "spark.ui.enabled": "false",
        # the Python of the image runs the job on the driver and the executors
        "spark.pyspark.python": "/opt/tidalmq/bin/python3",
        "spark.pyspark.driver.python": "/opt/tidalmq/bin/python3",
    }
    for key, value in labels.items():
        conf[f"spark.kubernetes.driver.label.{key}"] = value
        conf[f"spark.kubernetes.executor.label.{key}"] = value
    if job.secured and job.bootstrap_servers:
        conf[f"spark.kubernetes.driver.secrets.{job.client_secret}"] = CLIENT_DIR
    if in_cluster:
        conf["spark.kubernetes.authenticate.submission.caCertFile"] = str(SA_DIR / "ca.crt")
        conf["spark.kubernetes.authenticate.submission.oauthTokenFile"] = str(SA_DIR / "token")
    conf.update(job.extra_conf)
    cmd = [
        job.spark_submit,
        "--master",
        f"k8s://{job.api_server}",
        "--deploy-mode",
        "cluster",
        "--name",
        job.name,
    ]
    for key in sorted(conf):
        cmd += ["--conf", f"{key}={conf[key]}"]
    return [*cmd, job.job_file, *planner_args(job)]


def submitter_pod(job: PlannerJob) -> dict[str, Any]:
    """The pod that runs spark-submit from the Spark image (`spark_submit = "pod"`): the
    operator's own image then needs neither Java nor pyspark, and the submission client always
    has the Spark version of the driver and executors. It authenticates with the Spark
    ServiceAccount (which may create the driver pod); the tail of its output becomes the
    container's termination message, which the operator reads on failure (it has no pods/log)."""
    cmd = submit_command(job, in_cluster=True)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": job.submit_pod,
            "labels": {
                "app.kubernetes.io/part-of": "tidalmq",
                "app.kubernetes.io/component": "planner-submit",
                RUN_LABEL: job.name,
            },
        },
        "spec": {
            "serviceAccountName": job.service_account,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": SUBMIT_TIMEOUT_S,
            "containers": [
                {
                    "name": "spark-submit",
                    "image": job.image,
                    "imagePullPolicy": job.pull_policy,
                    # the Spark image's entrypoint: `submit ARGS...` runs spark-submit ARGS and,
                    # if it fails, writes why to the termination message
                    "args": ["submit", *cmd[1:]],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "384Mi"},
                        "limits": {"memory": "768Mi"},
                    },
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
        },
    }


# ------------------------------------------------------------------------------- running
async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


def _status_code(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


async def _delete_quietly(fn: Any, name: str, namespace: str) -> None:
    try:
        await _call(fn, name, namespace)
    except Exception as exc:
        if _status_code(exc) != 404:
            log.warning("deleting %s/%s: %s", namespace, name, exc)


async def _notify(progress: Progress | None, phase: str, message: str) -> None:
    if progress is None:
        return
    result = progress(phase, message)
    if asyncio.iscoroutine(result):
        await result


def read_result(configmap: Any) -> tuple[str, dict[str, Any], str]:
    """(plan JSON, summary, report table) from the result ConfigMap (a V1ConfigMap or dict)."""
    data = _field(configmap, "data") or {}
    binary = _field(configmap, "binary_data") or _field(configmap, "binaryData") or {}
    if "plan.json" in data:
        plan = data["plan.json"]
    elif "plan.json.gz" in binary:
        plan = gzip.decompress(base64.b64decode(binary["plan.json.gz"])).decode()
    else:
        raise PlannerFailed("the planner's ConfigMap holds no plan.json")
    try:
        summary = json.loads(data.get("summary.json", "{}"))
    except json.JSONDecodeError as exc:
        raise PlannerFailed(f"the planner's summary is not JSON: {exc}") from exc
    return plan, summary, data.get("report.txt", "")


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _pod_failure(pod: Any) -> str:
    status = _field(pod, "status")
    reasons = []
    for cs in (_field(status, "container_statuses") or []) if status is not None else []:
        term = _field(_field(cs, "state"), "terminated")
        if term is not None:
            reasons.append(
                f"{_field(cs, 'name')}: {_field(term, 'reason')} (exit code {_field(term, 'exit_code')})"
                + (f": {_field(term, 'message')}" if _field(term, "message") else "")
            )
    message = _field(status, "message") if status is not None else None
    return "; ".join(reasons) or message or "no termination details"


async def _exists(fn: Any, name: str, namespace: str) -> bool:
    try:
        await _call(fn, name, namespace)
        return True
    except Exception as exc:
        if _status_code(exc) != 404:
            raise
        return False


async def cleanup(job: PlannerJob, core: Any) -> None:
    """Delete the run's submitter and driver pods (executors go with the driver) and result
    ConfigMap."""
    await _delete_quietly(core.delete_namespaced_pod, job.submit_pod, job.namespace)
    await _delete_quietly(core.delete_namespaced_pod, job.driver_pod, job.namespace)
    await _delete_quietly(core.delete_namespaced_config_map, job.configmap, job.namespace)
    if job.secured:
        await _delete_quietly(core.delete_namespaced_secret, job.client_secret, job.namespace)


async def _secret_data(core: Any, name: str, namespace: str, what: str) -> dict[str, str]:
    try:
        secret = await _call(core.read_namespaced_secret, name, namespace)
    except Exception as exc:
        if _status_code(exc) == 404:
            raise PlannerNotReady(f"{what} Secret {name} does not exist yet") from exc
        raise
    return decoded(_field(secret, "data"))


async def write_client_secret(job: PlannerJob, core: Any) -> None:
    """Create the run's client Secret from the planner's User Secret and the brokers' CA."""
    if not job.client_user_secret:
        raise PlannerFailed(
            f"the Kafka listener is {job.security_protocol} and the planner has no User "
            "(TIDALMQ_PLANNER_USER_SECRET)"
        )
    user = await _secret_data(core, job.client_user_secret, job.namespace, "the planner's User")
    ca = None
    if job.security_protocol.upper().endswith("SSL"):
        if not job.broker_ca_secret:
            raise PlannerFailed("TLS listener and no TIDALMQ_BROKER_CA_SECRET for the planner")
        ca = (
            await _secret_data(core, job.broker_ca_secret, job.namespace, "the brokers' TLS")
        ).get("ca.crt")
    data = client_secret_data(job.security_protocol, user, ca)
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": job.client_secret,
            "labels": {
                "app.kubernetes.io/part-of": "tidalmq",
                "app.kubernetes.io/component": "planner",
                RUN_LABEL: job.name,
            },
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    try:
        await _call(core.create_namespaced_secret, job.namespace, body)
    except Exception as exc:
        raise PlannerFailed(f"cannot create the planner's client Secret: {exc}") from exc


async def _submit(
    job: PlannerJob,
    core: Any,
    progress: Progress | None,
    timeout_s: float,
    command: Sequence[str] | None,
) -> None:
    """Start clean (no leftovers of an earlier run of this name) and spark-submit the driver."""
    await cleanup(job, core)
    if job.secured and job.bootstrap_servers:
        await write_client_secret(job, core)
    if command is None and job.spark_submit == SUBMIT_IN_POD:
        await _submit_in_pod(job, core, progress, min(timeout_s, SUBMIT_TIMEOUT_S))
        return
    cmd = list(command or submit_command(job))
    await _notify(progress, "Submitting", f"spark-submit of {job.name}")
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as exc:
        raise PlannerFailed(f"cannot run {cmd[0]}: {exc}") from exc
    submit_timeout_s = min(timeout_s, SUBMIT_TIMEOUT_S)
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=submit_timeout_s)
    except TimeoutError as exc:
        proc.kill()
        raise PlannerFailed(f"spark-submit did not return within {submit_timeout_s:.0f} s") from exc
    except asyncio.CancelledError:
        proc.kill()
        raise
    if proc.returncode != 0:
        tail = output.decode(errors="replace")[-2000:]
        raise PlannerFailed(f"spark-submit exited with {proc.returncode}: {tail}")


async def _submit_in_pod(
    job: PlannerJob, core: Any, progress: Progress | None, timeout_s: float
) -> None:
    """Run spark-submit in the pod `submitter_pod(job)` and wait until it exits."""
    await _notify(progress, "Submitting", f"spark-submit of {job.name} in pod {job.submit_pod}")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await _call(core.create_namespaced_pod, job.namespace, submitter_pod(job))
            break
        except Exception as exc:
            # 409: the submit pod of an earlier launch (an operator restarted while it ran) is
            # still being deleted by `cleanup`; wait for it to go
            if _status_code(exc) == 409 and time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                continue
            raise PlannerFailed(
                f"cannot create the spark-submit pod {job.submit_pod}: {exc}"
            ) from exc
    try:
        while True:
            pod = await _call(core.read_namespaced_pod, job.submit_pod, job.namespace)
            phase = _field(_field(pod, "status"), "phase") or "Pending"
            if phase == "Succeeded":
                return
            if phase == "Failed":
                raise PlannerFailed(f"spark-submit failed: {_pod_failure(pod)}"[:3000])
            if time.monotonic() > deadline:
                raise PlannerFailed(
                    f"spark-submit did not finish within {timeout_s:.0f} s (pod {job.submit_pod} "
                    f"is {phase}: {_pod_waiting(pod)})"
                )
            await asyncio.sleep(1.0)
    finally:
        await _delete_quietly(core.delete_namespaced_pod, job.submit_pod, job.namespace)


def _pod_waiting(pod: Any) -> str:
    """Why a pod's containers are not running yet (image missing, scheduling), if known."""
    status = _field(pod, "status")
    for cs in (_field(status, "container_statuses") or []) if status is not None else []:
        waiting = _field(_field(cs, "state"), "waiting")
        if waiting is not None:
            return f"{_field(waiting, 'reason')}: {_field(waiting, 'message') or ''}".strip()
    for cond in (_field(status, "conditions") or []) if status is not None else []:
        if _field(cond, "status") == "False" and _field(cond, "message"):
            return str(_field(cond, "message"))
    return "no details"


async def run_planner(
    job: PlannerJob,
    core: Any,
    *,
    progress: Progress | None = None,
    timeout_s: float = 1800.0,
    poll_s: float = 5.0,
    keep: bool = False,
    command: Sequence[str] | None = None,
    attach: bool = False,
) -> PlannerOutcome:
    """Run the planner for `job` with the CoreV1Api `core`; see the module docstring."""
    started = time.monotonic()
    ns = job.namespace
    if attach and await _exists(core.read_namespaced_pod, job.driver_pod, ns):
        await _notify(
            progress, "Attached", f"watching driver pod {job.driver_pod} of an earlier launch"
        )
    else:
        await _submit(job, core, progress, timeout_s, command)

    phase = ""
    try:
        while True:
            try:
                pod = await _call(core.read_namespaced_pod, job.driver_pod, ns)
            except Exception as exc:
                if _status_code(exc) != 404:
                    raise
                pod = None
            current = (_field(_field(pod, "status"), "phase") or "Pending") if pod else "Pending"
            if current != phase:
                phase = current
                await _notify(progress, phase, f"driver pod {job.driver_pod} is {phase}")
            if phase == "Succeeded":
                break
            if phase == "Failed":
                raise PlannerFailed(f"the planner's driver pod failed: {_pod_failure(pod)}")
            if time.monotonic() - started > timeout_s:
                raise PlannerFailed(f"the planner did not finish within {timeout_s:.0f} s")
            await asyncio.sleep(poll_s)

        try:
            cm = await _call(core.read_namespaced_config_map, job.configmap, ns)
        except Exception as exc:
            raise PlannerFailed(
                f"the driver finished but left no ConfigMap {job.configmap}: {exc}"
            ) from exc
        plan_json, summary, report = read_result(cm)
        try:
            entries = parse_plan(plan_json)
        except ValueError as exc:
            raise PlannerFailed(f"the planner's plan is invalid: {exc}") from exc
        await _notify(progress, "Planned", f"{len(entries)} moves proposed")
        return PlannerOutcome(
            entries, plan_json, summary, report, job.driver_pod, time.monotonic() - started
        )
    finally:
        if not keep:
            await cleanup(job, core)
