"""Broker settings: defaults, overridden by TIDALMQ_* environment variables, overridden by flags.

Every field of BrokerSettings is a flag (`--flush-interval-ms`) and an environment variable
(`TIDALMQ_FLUSH_INTERVAL_MS`); the flag wins. One table, so the CLI help, the container image and
the Helm chart all name the same knobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tidalmq_core.control_auth import BrokerCredentials, read_tokens
from tidalmq_core.control_tls import ControlTls

from tidalmq_broker.storage.api import StorageConfig

ENV_PREFIX = "TIDALMQ_"
_STORAGE = StorageConfig()  # the storage engine's defaults


@dataclass(slots=True)
class BrokerSettings:
    broker_id: int = field(default=0, metadata={"help": "this broker's id (node id)"})
    broker_id_from_hostname: bool = field(
        default=False,
        metadata={"help": "take the id from the hostname's trailing -N (a StatefulSet ordinal)"},
    )
    host: str = field(default="127.0.0.1", metadata={"help": "Kafka listener bind address"})
    port: int = field(default=9092, metadata={"help": "Kafka listener port (0: any free port)"})
    advertised_host: str = field(default="", metadata={"help": "host clients connect to"})
    advertised_port: int = field(default=0, metadata={"help": "port clients connect to"})
    rack: str = field(default="", metadata={"help": "rack / zone reported to clients"})
    # Kafka's listener settings (security/listeners.py); without `listeners`, the one
    # PLAINTEXT listener of host/port (advertised as advertised_host/advertised_port)
    listeners: str = field(
        default="",
        metadata={
            "help": "Kafka's listeners: NAME://host:port,... (e.g. PLAINTEXT://127.0.0.1:9092,"
            "SASL_SSL://127.0.0.1:9093); empty: one PLAINTEXT listener on --host/--port"
        },
    )
    advertised_listeners: str = field(
        default="",
        metadata={
            "help": "Kafka's advertised.listeners: NAME://host:port,... (default: listeners)"
        },
    )
    listener_security_protocol_map: str = field(
        default="",
        metadata={
            "help": "Kafka's listener.security.protocol.map: NAME:PROTOCOL,... (default: "
            "PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL map to themselves)"
        },
    )
    ssl_keystore_location: str = field(
        default="",
        metadata={"help": "PEM file with the broker's private key and certificate chain"},
    )
    ssl_keystore_key_location: str = field(
        default="",
        metadata={
            "help": "PEM file with the private key alone (e.g. a Kubernetes TLS Secret's "
            "tls.key); ssl.keystore.location then holds the certificate chain"
        },
    )
    ssl_key_password: str = field(
        default="",
        repr=False,  # secrets stay out of logs and tracebacks
        metadata={"help": "password of an encrypted private key (prefer the env)"},
    )
    ssl_truststore_location: str = field(
        default="", metadata={"help": "PEM file of the CA certificates client certs must chain to"}
    )
    ssl_crl_location: str = field(
        default="",
        metadata={
            "help": "PEM file of certificate revocation lists (one per client CA): revoked "
            "client certificates are refused; reloaded like the keystore"
        },
    )
    ssl_client_auth: str = field(
        default="none",
        metadata={"help": "none, requested or required: client certificates on SSL listeners"},
    )
    ssl_enabled_protocols: str = field(
        default="TLSv1.2,TLSv1.3", metadata={"help": "TLS versions offered (TLSv1.2, TLSv1.3)"}
    )
    ssl_cipher_suites: str = field(
        default="", metadata={"help": "OpenSSL cipher list for TLSv1.2 (empty: OpenSSL's)"}
    )
    ssl_reload_interval_ms: int = field(
        default=60_000,
        metadata={
            "help": "how often the listeners look for renewed keystore/truststore files "
            "(reloaded without a restart; 0: never)"
        },
    )
    ssl_principal_mapping_rules: str = field(
        default="DEFAULT",
        metadata={"help": "Kafka's ssl.principal.mapping.rules: RULE:pattern/replacement/[LU],..."},
    )
    sasl_enabled_mechanisms: str = field(
        default="SCRAM-SHA-256,SCRAM-SHA-512",
        metadata={"help": "SASL mechanisms of SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"},
    )
    connection_failed_authentication_delay_ms: int = field(
        default=100,
        metadata={
            "help": "Kafka's connection.failed.authentication.delay.ms: close a connection "
            "that failed to authenticate this long after its answer"
        },
    )
    authorizer: str = field(
        default="auto",
        metadata={
            "help": "ACL authorization (Kafka's authorizer.class.name): auto (on when any "
            "listener is SSL, SASL_PLAINTEXT or SASL_SSL, off on a PLAINTEXT-only broker), acl "
            "(always on) or none (off: every client may do anything)"
        },
    )
    super_users: str = field(
        default="",
        metadata={
            "help": "Kafka's super.users: principals allowed everything, separated by ';' "
            "(User:admin;User:ops); the SCRAM bootstrap users of this broker are added"
        },
    )
    allow_everyone_if_no_acl_found: bool = field(
        default=False,
        metadata={
            "help": "Kafka's allow.everyone.if.no.acl.found: a resource without any ACL is "
            "open to everyone (default: refused to all but super users)"
        },
    )
    scram_bootstrap: str = field(
        default="",
        repr=False,
        metadata={
            "help": "SCRAM users the embedded controller creates at start if absent: "
            "user:MECHANISM:password, one per line (prefer the env or --scram-bootstrap-file)"
        },
    )
    scram_bootstrap_file: str = field(
        default="", metadata={"help": "file of user:MECHANISM:password lines (as above)"}
    )
    http_host: str = field(
        default="127.0.0.1", metadata={"help": "bind address of the HTTP ports (health, control)"}
    )
    http_port: int = field(default=0, metadata={"help": "health, readiness, metrics port"})
    control_port: int = field(
        default=-1,
        metadata={
            "help": "port of the control endpoints the controller calls (metadata pushes, "
            "drain); -1: the HTTP port; 0: any free port"
        },
    )
    control_token: str = field(
        default="",
        repr=False,
        metadata={
            "help": "control-plane token (prefer the env or --control-token-file): this "
            "broker's own token, or a secret it derives its token from (docs/security.md)"
        },
    )
    control_token_file: str = field(
        default="", metadata={"help": "file holding the control-plane token (as above)"}
    )
    control_tls_cert_file: str = field(
        default="",
        metadata={
            "help": "control-plane mTLS: this broker's certificate (PEM chain; CN=broker-N or "
            "broker); with the key and CA files, the control endpoints serve HTTPS and the "
            "controller is called with it (docs/security.md)"
        },
    )
    control_tls_key_file: str = field(
        default="", metadata={"help": "control-plane mTLS: the certificate's private key (PEM)"}
    )
    control_tls_ca_file: str = field(
        default="",
        metadata={
            "help": "control-plane mTLS: the cluster CA's certificate (PEM), never the "
            "Kafka clients' CA"
        },
    )
    control_tls_crl_file: str = field(
        default="",
        metadata={
            "help": "control-plane mTLS: the cluster CA's certificate revocation list (PEM); "
            "a certificate it revokes is refused on either side, reloaded when it changes "
            "(docs/security.md)"
        },
    )
    storage_url: str = field(
        default="file://./.tidalmq/objects",
        metadata={"help": "object store: file:///dir or s3://bucket/prefix?endpoint_url=..."},
    )
    controller_url: str = field(
        default="", metadata={"help": "external controller (empty: run one in this process)"}
    )
    control_host: str = field(
        default="", metadata={"help": "address the controller uses to reach this broker"}
    )
    heartbeat_interval_s: float = field(default=1.0, metadata={"help": "controller heartbeat"})
    drain_on_stop: bool = field(
        default=True, metadata={"help": "on SIGTERM move partitions to other brokers first"}
    )
    produce_handover_wait_ms: float = field(
        default=1000.0,
        metadata={
            "help": "how long a produce request's partition is held while it is handed over "
            "(leaderless, or opening here) before it is answered with the error (0: at once)"
        },
    )
    # the storage engine's settings: every field of StorageConfig, by the same name
    flush_interval_ms: float = field(default=5.0, metadata={"help": "WAL flush window"})
    flush_bytes: int = field(default=_STORAGE.flush_bytes, metadata={"help": "flush at this size"})
    max_inflight_flushes: int = field(
        default=_STORAGE.max_inflight_flushes, metadata={"help": "WAL PUTs in flight at once"}
    )
    cache_bytes: int = field(default=_STORAGE.cache_bytes, metadata={"help": "tail cache size"})
    checkpoint_interval_s: float = field(
        default=_STORAGE.checkpoint_interval_s,
        metadata={"help": "how often a changed partition's checkpoint is written"},
    )
    read_ahead_bytes: int = field(
        default=_STORAGE.read_ahead_bytes,
        metadata={"help": "ranged GET size of sequential reads of older data"},
    )
    compaction_interval_s: float = field(
        default=_STORAGE.compaction_interval_s,
        metadata={"help": "how often partitions are checked for compaction"},
    )
    compaction_min_ranges: int = field(
        default=_STORAGE.compaction_min_ranges,
        metadata={"help": "compact a partition once it has this many WAL ranges"},
    )
    compaction_min_bytes: int = field(
        default=_STORAGE.compaction_min_bytes,
        metadata={"help": "... or this many bytes in WAL ranges"},
    )
    compaction_idle_s: float = field(
        default=_STORAGE.compaction_idle_s,
        metadata={"help": "... or once its oldest WAL range is this old"},
    )
    cleaner_backoff_ms: float = field(
        default=_STORAGE.cleaner_backoff_ms,
        metadata={"help": "how often the log cleaner looks for compacted partitions to clean"},
    )
    cleaner_threads: int = field(
        default=_STORAGE.cleaner_threads,
        metadata={"help": "log cleaner passes at a time (0: no cleaning)"},
    )
    index_granule_bytes: int = field(
        default=_STORAGE.index_granule_bytes,
        metadata={"help": "index entry size inside compacted segments"},
    )
    retention_check_interval_s: float = field(
        default=_STORAGE.retention_check_interval_s,
        metadata={"help": "how often retention.ms/retention.bytes are applied"},
    )
    garbage_grace_s: float = field(
        default=_STORAGE.garbage_grace_s,
        metadata={"help": "unreferenced WAL objects younger than this are kept"},
    )
    garbage_sweep_interval_s: float = field(
        default=_STORAGE.garbage_sweep_interval_s,
        metadata={"help": "how often a full sweep deletes objects no checkpoint needs"},
    )
    identity_check_interval_ms: float = field(
        default=_STORAGE.identity_check_interval_ms,
        metadata={
            "help": "how often the object store's identity marker is checked (a wiped or "
            "foreign store stops every read and write)"
        },
    )
    flush_timeout_ms: float = field(
        default=_STORAGE.flush_timeout_ms,
        metadata={
            "help": "a WAL flush not durable this long after it started fails (producers get "
            "KAFKA_STORAGE_ERROR, retriable) and the store counts as not taking writes"
        },
    )
    store_probe_interval_ms: float = field(
        default=_STORAGE.store_probe_interval_ms,
        metadata={
            "help": "without a successful write for this long, write a few bytes to see that the "
            "object store takes writes (every second while it does not); 0: never"
        },
    )
    max_request_bytes: int = field(
        default=100 * 1024 * 1024, metadata={"help": "largest request accepted"}
    )
    # The listener's bounds ([R1] item 2): docs/limits.md says why each default is what it is.
    max_connections: int = field(
        default=4096,
        metadata={"help": "Kafka's max.connections: client connections open at once (0: no cap)"},
    )
    max_connections_per_ip: int = field(
        default=1024,
        metadata={
            "help": "Kafka's max.connections.per.ip: connections from one client address "
            "(0: no cap)"
        },
    )
    max_connections_per_ip_overrides: str = field(
        default="",
        metadata={
            "help": "Kafka's max.connections.per.ip.overrides: host-or-address:count,... "
            "(e.g. 10.0.0.7:4000,batch.example.com:2000)"
        },
    )
    connections_max_idle_ms: int = field(
        default=600_000,
        metadata={
            "help": "Kafka's connections.max.idle.ms: close a connection that neither sent nor "
            "read a byte for this long (0: never)"
        },
    )
    max_inflight_requests_per_connection: int = field(
        default=256, metadata={"help": "requests of one connection handled at once"}
    )
    max_inflight_request_bytes_per_connection: int = field(
        default=16 * 1024 * 1024,
        metadata={"help": "request bytes of one connection read and not yet answered"},
    )
    max_response_bytes_per_connection: int = field(
        default=16 * 1024 * 1024,
        metadata={
            "help": "response bytes of one connection its client has not read yet: at this many "
            "the connection is muted (its requests are not read), and Fetch reads no more "
            "than what is left (0: no cap)"
        },
    )
    queued_max_request_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata={
            "help": "Kafka's queued.max.request.bytes: request bytes all connections together "
            "hold (being read or not yet answered); past it, connections stop reading (0: none)"
        },
    )
    queued_max_response_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata={
            "help": "response bytes all connections together hold (being built or not yet read "
            "by their clients); past it, Fetch waits for room or answers with less (0: none)"
        },
    )
    auto_create_topics: bool = field(
        default=True,
        metadata={
            "help": "Kafka's auto.create.topics.enable: a Metadata request naming an unknown "
            "topic (a producer's, or a consumer's with allow.auto.create.topics) creates it with "
            "num.partitions, given CREATE on the cluster or the topic; false: topics are "
            "created explicitly or as resources"
        },
    )
    default_partitions: int = field(default=1, metadata={"help": "num.partitions"})
    partition_traffic_metrics: bool = field(
        default=True,
        metadata={
            "help": "export tidalmq_partition_bytes_in_total, _records_in_total and "
            "_bytes_out_total per partition (3 series per partition led here); false bounds the "
            "series by topics, and the planner then spreads each topic's traffic evenly over its "
            "partitions (docs/metrics.md, Cardinality)"
        },
    )
    consumer_lag_partition_metrics: bool = field(
        default=False,
        metadata={
            "help": "export tidalmq_consumer_group_lag_records per group, topic and partition "
            "(the per-topic sums and ages are always exported; docs/metrics.md)"
        },
    )
    consumer_lag_partition_series_max: int = field(
        default=10_000,
        metadata={
            "help": "at most this many per-partition lag series per broker and scrape; the "
            "rest are counted in tidalmq_consumer_group_lag_partition_series_dropped_total"
        },
    )
    offsets_topic_partitions: int = field(
        default=16, metadata={"help": "partitions of __consumer_offsets"}
    )
    transaction_state_partitions: int = field(
        default=50,
        metadata={
            "help": "transaction.state.log.num.partitions: partitions of "
            "__transaction_state (created on first use; an embedded controller's setting)"
        },
    )
    transaction_version: int = field(
        default=-1,
        metadata={
            "help": "the cluster's finalized transaction.version feature, set at every start "
            "(an embedded controller's setting): 2 lets clients run KIP-890 part 2 "
            "transactions; -1 keeps the metadata's level (1 for a new cluster; kafka-features "
            "upgrade|downgrade changes it, docs/transactions-v2.md)"
        },
    )
    transaction_max_timeout_ms: int = field(
        default=900_000,
        metadata={
            "help": "transaction.max.timeout.ms: the longest transaction timeout a "
            "transactional producer may ask for (INVALID_TRANSACTION_TIMEOUT beyond)"
        },
    )
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = field(
        default=10_000,
        metadata={
            "help": "transaction.abort.timed.out.transaction.cleanup.interval.ms: how "
            "often the transaction coordinator aborts transactions past their timeout"
        },
    )
    transaction_partition_verification_enable: bool = field(
        default=True,
        metadata={
            "help": "transaction.partition.verification.enable: a partition leader asks the "
            "transaction coordinator whether a partition was added to the producer's "
            "transaction before taking its first transactional batch there (KIP-890)"
        },
    )
    transactional_id_expiration_ms: int = field(
        default=604_800_000,
        metadata={
            "help": "transactional.id.expiration.ms: a transactional id with no transaction "
            "open and no change for this long is forgotten"
        },
    )
    transaction_remove_expired_transaction_cleanup_interval_ms: int = field(
        default=3_600_000,
        metadata={
            "help": "transaction.remove.expired.transaction.cleanup.interval.ms: how often the "
            "transaction coordinator forgets expired transactional ids"
        },
    )
    group_initial_rebalance_delay_ms: int = field(
        default=3000, metadata={"help": "group.initial.rebalance.delay.ms"}
    )
    group_min_session_timeout_ms: int = field(
        default=6000, metadata={"help": "group.min.session.timeout.ms"}
    )
    group_consumer_session_timeout_ms: int = field(
        default=45_000,
        metadata={"help": "group.consumer.session.timeout.ms (consumer groups, KIP-848)"},
    )
    group_consumer_heartbeat_interval_ms: int = field(
        default=5_000,
        metadata={"help": "group.consumer.heartbeat.interval.ms (consumer groups, KIP-848)"},
    )
    group_consumer_assignors: str = field(
        default="uniform,range",
        metadata={"help": "group.consumer.assignors: server-side assignors, the first the default"},
    )
    shutdown_timeout_s: float = field(
        default=25.0, metadata={"help": "how long SIGTERM waits for in-flight requests"}
    )
    stop_deadline_s: float = field(
        default=30.0,
        metadata={
            "help": "SIGTERM/SIGINT: the process exits at the latest this long after the signal, "
            "whatever is still closing (acknowledged data is already in the object store; the "
            "next owner recovers the rest from the WAL); a second signal exits at once"
        },
    )
    parent_pid: int = field(
        default=0,
        metadata={
            "help": "stop (as on SIGTERM) when the process with this pid exits, even by SIGKILL "
            "(`tidalmq local up` sets it for its brokers); 0: off"
        },
    )
    event_loop: str = field(
        default="auto",
        metadata={"help": "asyncio, uvloop, or auto (uvloop when it is installed)"},
    )
    runtime_tuning: bool = field(
        default=True,
        metadata={
            "help": "collect garbage less often and freeze start-up objects; on glibc, serve "
            "blocks of 256 KiB and more by mmap and keep 2 malloc arenas (RSS follows live data)"
        },
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING, ERROR"})
    log_format: str = field(default="text", metadata={"help": "text or json"})

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    def control_credentials(self) -> BrokerCredentials | None:
        """This broker's control-plane credentials (None: no token given; raises TokenError)."""
        tokens = read_tokens(self.control_token, self.control_token_file)
        return BrokerCredentials(tokens, self.broker_id) if tokens else None

    def control_tls(self) -> ControlTls | None:
        """Control-plane mTLS (None: off; raises ControlTlsError for a partial or bad setting)."""
        return ControlTls.from_files(
            self.control_tls_cert_file,
            self.control_tls_key_file,
            self.control_tls_ca_file,
            self.control_tls_crl_file,
        )

    def control_url(self, bound_port: int = 0) -> str:
        """Where the control endpoints are reached: --control-host (else --http-host) and the
        control port (`bound_port`: the port taken when it was 0)."""
        host = self.control_host or self.http_host
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        port = bound_port or (self.control_port if self.control_port > 0 else self.http_port)
        tls = self.control_tls_cert_file or self.control_tls_key_file or self.control_tls_ca_file
        return f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"

    def connection_overrides(self) -> dict[str, int]:
        """max.connections.per.ip.overrides, each host resolved to its addresses (as Kafka
        does at start); a bad entry raises ValueError naming it."""
        out: dict[str, int] = {}
        for entry in filter(
            None, (e.strip() for e in self.max_connections_per_ip_overrides.split(","))
        ):
            host, sep, count = entry.rpartition(":")
            host = host.strip().strip("[]")
            if not sep or not host or not count.strip().isdigit():
                raise ValueError(f"max.connections.per.ip.overrides: {entry!r} is not host:count")
            try:
                infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            except OSError as exc:
                raise ValueError(
                    f"max.connections.per.ip.overrides: cannot resolve {host!r}: {exc}"
                ) from exc
            for info in infos:
                out[str(info[4][0])] = int(count)
        return out

    def storage_config(self) -> StorageConfig:
        """The storage engine's settings: the fields of StorageConfig, by name."""
        return StorageConfig(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(StorageConfig)}
        )

    def described(self, advertised: str = "") -> dict[str, str]:
        """Broker configs as DescribeConfigs reports them (Kafka names where one exists), all
        static: a restart changes them. `advertised`: the endpoints the broker registered
        (NAME://host:port,...), reported as advertised.listeners when that is not set.
        Passwords are here as set (empty: not set): DescribeConfigs masks them as Kafka does
        (apis/configs.py, SENSITIVE_CONFIGS); nothing else may report this dict."""
        legacy = "PLAINTEXT://{}:{}".format(*self.advertised)  # before the broker is bound
        return {
            "broker.id": str(self.broker_id),
            "node.id": str(self.broker_id),
            "num.partitions": str(self.default_partitions),
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            "offsets.topic.num.partitions": str(self.offsets_topic_partitions),
            "transaction.max.timeout.ms": str(self.transaction_max_timeout_ms),
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": str(
                self.transaction_abort_timed_out_transaction_cleanup_interval_ms
            ),
            "transactional.id.expiration.ms": str(self.transactional_id_expiration_ms),
            "transaction.partition.verification.enable": str(
                self.transaction_partition_verification_enable
            ).lower(),
            "transaction.remove.expired.transaction.cleanup.interval.ms": str(
                self.transaction_remove_expired_transaction_cleanup_interval_ms
            ),
            "transaction.state.log.num.partitions": str(self.transaction_state_partitions),
            "group.initial.rebalance.delay.ms": str(self.group_initial_rebalance_delay_ms),
            "group.min.session.timeout.ms": str(self.group_min_session_timeout_ms),
            "group.consumer.session.timeout.ms": str(self.group_consumer_session_timeout_ms),
            "group.consumer.heartbeat.interval.ms": str(self.group_consumer_heartbeat_interval_ms),
            "group.consumer.assignors": self.group_consumer_assignors,
            "socket.request.max.bytes": str(self.max_request_bytes),
            "max.connections": str(self.max_connections),
            "max.connections.per.ip": str(self.max_connections_per_ip),
            "max.connections.per.ip.overrides": self.max_connections_per_ip_overrides,
            "connections.max.idle.ms": str(self.connections_max_idle_ms),
            "queued.max.request.bytes": str(self.queued_max_request_bytes),
            "listeners": self.listeners or f"PLAINTEXT://{self.host}:{self.port}",
            "advertised.listeners": self.advertised_listeners or advertised or legacy,
            # the object store is the one log directory (as DescribeLogDirs reports it)
            "log.dirs": log_dir_name(self.storage_url),
            # an embedded controller makes this process a controller too (KRaft's roles)
            "process.roles": "broker" if self.controller_url else "broker,controller",
            "broker.rack": self.rack,
            "listener.security.protocol.map": self.listener_security_protocol_map
            or "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": self.sasl_enabled_mechanisms,
            "ssl.client.auth": self.ssl_client_auth,
            "ssl.enabled.protocols": self.ssl_enabled_protocols,
            "ssl.principal.mapping.rules": self.ssl_principal_mapping_rules,
            "ssl.cipher.suites": self.ssl_cipher_suites,
            # PEM files (Kafka's PEM store type, apis/configs.py): the key and its chain, the CAs
            "ssl.keystore.location": self.ssl_keystore_location,
            "ssl.key.password": self.ssl_key_password,
            "ssl.truststore.location": self.ssl_truststore_location,
            "connection.failed.authentication.delay.ms": str(
                self.connection_failed_authentication_delay_ms
            ),
            "super.users": self.super_users,
            "allow.everyone.if.no.acl.found": str(self.allow_everyone_if_no_acl_found).lower(),
            "tidalmq.flush.interval.ms": str(self.flush_interval_ms),
        }


def log_dir_name(storage_url: str) -> str:
    """The log directory a broker reports: its object store, without query or credentials."""
    parts = urlsplit(storage_url)
    if parts.scheme == "file":
        return parts.path or "/"
    host = parts.hostname or ""
    return urlunsplit((parts.scheme, host, parts.path, "", "")) or storage_url


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _converter(kind: Any) -> Any:
    return {int: int, float: float, bool: _parse_bool, str: str}.get(kind, str)


def add_arguments(parser: argparse.ArgumentParser, cls: type = BrokerSettings) -> None:
    for f in dataclasses.fields(cls):
        kind = {"int": int, "float": float, "bool": bool, "str": str}[str(f.type)]
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=_converter(kind),
            default=None,
            help=f"{f.metadata.get('help', '')} (env {ENV_PREFIX}{f.name.upper()}, "
            f"default {f.default!r})",
        )


def from_sources(
    args: argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
    cls: type = BrokerSettings,
    **overrides: Any,
) -> Any:
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = {"int": int, "float": float, "bool": bool, "str": str}[str(f.type)]
        name = ENV_PREFIX + f.name.upper()
        if name in env:
            try:
                values[f.name] = _converter(kind)(env[name])
            except ValueError as exc:
                raise SystemExit(f"invalid {name}={env[name]!r}: {exc}") from exc
        if args is not None and getattr(args, f.name, None) is not None:
            values[f.name] = getattr(args, f.name)
    values.update(overrides)
    settings = cls(**values)
    if getattr(settings, "broker_id_from_hostname", False):
        settings.broker_id = broker_id_from_hostname(socket.gethostname())
    return settings


def broker_id_from_hostname(hostname: str) -> int:
    """`tidalmq-broker-3` -> 3: a StatefulSet pod's ordinal is a stable broker id."""
    match = re.search(r"-(\d+)$", hostname.split(".")[0])
    if match is None:
        raise SystemExit(f"cannot take a broker id from hostname {hostname!r} (expected NAME-N)")
    return int(match.group(1))
