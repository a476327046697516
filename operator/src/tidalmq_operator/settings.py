"""Operator settings from TIDALMQ_* environment variables (the Helm chart sets them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tidalmq_core.control_auth import ControlAuth, TokenError, read_tokens
from tidalmq_core.control_tls import ControlTls

GROUP = "tidalmq.io"
VERSION = "v1alpha1"


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    namespace: str = "default"
    cluster_state_name: str = "tidalmq"  # the ClusterState resource holding the metadata
    broker_statefulset: str = "tidalmq-broker"
    broker_selector: str = "app.kubernetes.io/component=broker"
    storage_url: str = ""
    # where the metadata log lives (objects under cluster/); empty: the partition store
    metadata_url: str = ""
    controller_host: str = "0.0.0.0"
    controller_port: int = 9690
    http_host: str = "0.0.0.0"
    http_port: int = 9691
    peering_name: str = "tidalmq"
    # a peer silent this long is considered gone: how long a successor waits for a replica that
    # died without cleaning up (kill -9, a lost node) when its random priority is lower. Kopf
    # then renews every 1-3 s (one small PATCH). Short is safe: one controller at a time is
    # guaranteed by the controller epoch in the ClusterState, not by peering
    peering_lifetime_s: int = 8
    pod_name: str = ""  # this replica's pod (it labels itself while it is the active controller)
    heartbeat_interval_s: float = 1.0
    lease_s: float = 4.0
    session_timeout_s: float = 6.0
    election_timeout_s: float = 10.0
    offsets_topic_partitions: int = 16
    transaction_state_partitions: int = 50
    # the cluster's finalized transaction.version feature, set at every start; None keeps the
    # metadata's level (1 for a new cluster; `kafka-features upgrade|downgrade` changes it)
    transaction_version: int | None = None
    # the controller's name in the metadata (the feature levels it supports are registered
    # under it): one for all replicas, which run the same image (the Deployment is Recreate)
    controller_id: str = "operator"
    # the controller Service (it reaches whichever replica leads): a standby replica registers
    # its id and supported feature levels there at start and every interval_s (docs/
    # transactions-v2.md, "Which levels the controllers support"); empty: it does not
    controller_url: str = ""
    standby_registration_interval_s: float = 30.0
    # moves in flight per broker (as source or target): a rebalance runs in waves of this many
    max_moves_per_broker: int = 4000
    status_interval_s: float = 0.5
    # a partition without a leader this long makes its topic Degraded (Leaderless); a move or an
    # election normally leaves it leaderless for well under a second, a stuck source until the
    # controller fences it (election timeout)
    leaderless_grace_s: float = 15.0
    # a controller whose metadata log is missing or unreadable looks again this often
    metadata_retry_s: float = 30.0
    # the planner (PartitionReassignment spec.generate) on Spark-on-Kubernetes; the chart sets these
    spark_image: str = ""
    spark_service_account: str = ""
    prometheus_url: str = ""
    bootstrap_servers: str = ""
    # the brokers' Kafka listener protocol; secured, the planner's driver connects as the User
    # whose Secret is planner_user_secret, trusting the CA in broker_ca_secret (key ca.crt)
    kafka_security_protocol: str = "PLAINTEXT"
    planner_user_secret: str = ""
    broker_ca_secret: str = ""
    spark_submit: str = "spark-submit"
    planner_timeout_s: float = 1800.0
    planner_poll_s: float = 5.0
    # SCRAM users the controller creates at start if absent (user:MECHANISM:password lines,
    # as the broker's --scram-bootstrap); the file form suits a mounted Secret
    scram_bootstrap: str = field(default="", repr=False)
    scram_bootstrap_file: str = ""
    # the control plane's tokens (docs/security.md): the cluster's control token (admin), and the
    # secret the brokers' tokens derive from (default: the control token); the chart mounts both
    control_token: str = field(default="", repr=False)
    control_token_file: str = ""
    control_broker_secret: str = field(default="", repr=False)
    control_broker_secret_file: str = ""
    # control-plane mTLS (tidalmq_core.control_tls): the controller's certificate (CN=operator or
    # controller), its key, the cluster CA; all three or none
    control_tls_cert_file: str = ""
    control_tls_key_file: str = ""
    control_tls_ca_file: str = ""
    # and the cluster CA's CRL (PEM): a revoked broker certificate is refused on both sides
    control_tls_crl_file: str = ""
    # the Secret holding the CA that signs tls Users' certificates (tls.crt, tls.key); the
    # operator generates it when it does not exist (the chart generates it with listeners.tls)
    clients_ca_secret: str = "tidalmq-clients-ca"
    # the Secret the operator keeps the clients CA's CRL in (crl.pem, revoked.json: clients_crl);
    # empty: no CRL is kept (the chart sets it unless listeners.tls.crlSecret is the user's own)
    clients_crl_secret: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorSettings:
        env = dict(os.environ if env is None else env)

        def get(name: str, default: str) -> str:
            return env.get(f"TIDALMQ_{name}", default)

        return cls(
            namespace=get("OPERATOR_NAMESPACE", "default"),
            cluster_state_name=get("CLUSTER_STATE_NAME", "tidalmq"),
            broker_statefulset=get("BROKER_STATEFULSET", "tidalmq-broker"),
            broker_selector=get("BROKER_SELECTOR", "app.kubernetes.io/component=broker"),
            storage_url=get("STORAGE_URL", ""),
            metadata_url=get("METADATA_URL", ""),
            # the chart binds both to the pod's IP (downward API)
            controller_host=get("CONTROLLER_HOST", "0.0.0.0"),
            controller_port=int(get("CONTROLLER_PORT", "9690")),
            http_host=get("OPERATOR_HTTP_HOST", "0.0.0.0"),
            http_port=int(get("OPERATOR_HTTP_PORT", "9691")),
            peering_name=get("PEERING_NAME", "tidalmq"),
            peering_lifetime_s=int(get("PEERING_LIFETIME_S", "8")),
            pod_name=get("POD_NAME", ""),
            heartbeat_interval_s=float(get("HEARTBEAT_INTERVAL_S", "1.0")),
            lease_s=float(get("LEASE_S", "4.0")),
            session_timeout_s=float(get("SESSION_TIMEOUT_S", "6.0")),
            election_timeout_s=float(get("ELECTION_TIMEOUT_S", "10.0")),
            offsets_topic_partitions=int(get("OFFSETS_TOPIC_PARTITIONS", "16")),
            transaction_state_partitions=int(get("TRANSACTION_STATE_PARTITIONS", "50")),
            transaction_version=int(v) if (v := get("TRANSACTION_VERSION", "")) else None,
            controller_id=get("CONTROLLER_ID", "operator"),
            controller_url=get("CONTROLLER_URL", ""),
            standby_registration_interval_s=float(get("STANDBY_REGISTRATION_INTERVAL_S", "30")),
            max_moves_per_broker=int(get("MAX_MOVES_PER_BROKER", "4000")),
            leaderless_grace_s=float(get("LEADERLESS_GRACE_S", "15")),
            metadata_retry_s=float(get("METADATA_RETRY_S", "30")),
            spark_image=get("SPARK_IMAGE", ""),
            spark_service_account=get("SPARK_SERVICE_ACCOUNT", ""),
            prometheus_url=get("PROMETHEUS_URL", ""),
            bootstrap_servers=get("BOOTSTRAP_SERVERS", ""),
            kafka_security_protocol=get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),
            planner_user_secret=get("PLANNER_USER_SECRET", ""),
            broker_ca_secret=get("BROKER_CA_SECRET", ""),
            spark_submit=get("SPARK_SUBMIT", "spark-submit"),
            planner_timeout_s=float(get("PLANNER_TIMEOUT_S", "1800")),
            planner_poll_s=float(get("PLANNER_POLL_S", "5")),
            scram_bootstrap=get("SCRAM_BOOTSTRAP", ""),
            scram_bootstrap_file=get("SCRAM_BOOTSTRAP_FILE", ""),
            control_token=get("CONTROL_TOKEN", ""),
            control_token_file=get("CONTROL_TOKEN_FILE", ""),
            control_broker_secret=get("CONTROL_BROKER_SECRET", ""),
            control_broker_secret_file=get("CONTROL_BROKER_SECRET_FILE", ""),
            control_tls_cert_file=get("CONTROL_TLS_CERT_FILE", ""),
            control_tls_key_file=get("CONTROL_TLS_KEY_FILE", ""),
            control_tls_ca_file=get("CONTROL_TLS_CA_FILE", ""),
            control_tls_crl_file=get("CONTROL_TLS_CRL_FILE", ""),
            clients_ca_secret=get("CLIENTS_CA_SECRET", "tidalmq-clients-ca"),
            clients_crl_secret=get("CLIENTS_CRL_SECRET", ""),
        )

    def control_auth(self) -> ControlAuth:
        """The controller's check of control calls; raises TokenError without a control token
        (the controller never serves unauthenticated)."""
        tokens = read_tokens(self.control_token, self.control_token_file)
        if not tokens:
            raise TokenError(
                "the controller needs the cluster's control token: TIDALMQ_CONTROL_TOKEN_FILE "
                "(or TIDALMQ_CONTROL_TOKEN); the Helm chart mounts it from its Secret"
            )
        brokers = read_tokens(
            self.control_broker_secret, self.control_broker_secret_file, "brokers' secret"
        )
        return ControlAuth(tokens, brokers)

    def control_tls(self) -> ControlTls | None:
        """The controller's control-plane mTLS (None: off); raises ControlTlsError for a partial
        setting or files it cannot load."""
        return ControlTls.from_files(
            self.control_tls_cert_file,
            self.control_tls_key_file,
            self.control_tls_ca_file,
            self.control_tls_crl_file,
        )

    def selector_dict(self) -> dict[str, str]:
        out = {}
        for part in self.broker_selector.split(","):
            if "=" in part:
                k, v = part.split("=", 1)
                out[k.strip()] = v.strip()
        return out
