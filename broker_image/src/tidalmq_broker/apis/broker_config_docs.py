"""The documentation DescribeConfigs returns for a broker's configs when asked
(IncludeDocumentation, v3+): a sentence or two per config a broker describes, saying what it
does on TidalMQ, and where TidalMQ takes a Kafka config but it changes nothing, that it does
not. The topic configs' documentation is in their table (tidalmq_core.topics.TOPIC_CONFIG_DEFS);
a unit test keeps a documentation here for every broker config DescribeConfigs lists.

A default is stated only as "Default: <value>" (where TidalMQ's differs from Kafka's, so a
reader comparing with Kafka is not misled), and tests/unit/test_config_documentation.py checks
each one against what a fresh broker describes; a config named in milliseconds or bytes says
its unit."""

from __future__ import annotations

_RESTART = "Static: a restart with another setting changes it."
_NO_EFFECT_THROTTLE = (
    "Recorded (kafka-reassign-partitions --throttle sets it, --verify clears it), limits "
    "nothing: a partition move copies no data, its records stay in object storage."
)

BROKER_CONFIG_DOCS: dict[str, str] = {
    "broker.id": f"This broker's id. {_RESTART}",
    "node.id": f"This broker's id (KRaft's name for broker.id). {_RESTART}",
    "num.partitions": "Partitions of a topic created without a partition count (automatic "
    f"creation, or CreateTopics with -1). {_RESTART}",
    "auto.create.topics.enable": "Whether a Metadata request naming an unknown topic creates "
    f"it, with num.partitions partitions (needs CREATE). {_RESTART}",
    "offsets.topic.num.partitions": "Partitions of __consumer_offsets, fixed when it is "
    "created. Default: 16 (Kafka's is 50). Read by the controller that creates the topic: this "
    "process's own (embedded) controller; with an external controller (--controller-url) the "
    f"controller's setting decides and this value is not used. {_RESTART}",
    "offsets.topic.replication.factor": "Replication factor of __consumer_offsets: always 1, "
    "its one copy is the object store's. Read-only.",
    "offset.metadata.max.bytes": "Largest metadata string an offset commit may carry, in "
    "bytes. Fixed by TidalMQ: no setting changes it.",
    "transaction.max.timeout.ms": "Longest transaction timeout a transactional producer may "
    f"ask for, in milliseconds (INVALID_TRANSACTION_TIMEOUT beyond it). {_RESTART}",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "How often the transaction "
    f"coordinator aborts transactions past their timeout, in milliseconds. {_RESTART}",
    "transactional.id.expiration.ms": "How long a transactional id with no open transaction "
    f"and no change is kept before it is forgotten, in milliseconds. {_RESTART}",
    "transaction.partition.verification.enable": "Whether a partition leader asks the "
    "transaction coordinator that a partition is in the producer's transaction before "
    f"taking its first transactional batch there (KIP-890). {_RESTART}",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "How often the transaction "
    f"coordinator forgets expired transactional ids, in milliseconds. {_RESTART}",
    "transaction.state.log.num.partitions": "Partitions of __transaction_state, created on "
    "first use. Read by the controller that creates the topic: this process's own (embedded) "
    "controller; with an external controller (--controller-url) the controller's setting "
    f"decides and this value is not used. {_RESTART}",
    "transaction.state.log.replication.factor": "Replication factor of __transaction_state: "
    "always 1, its one copy is the object store's. Read-only.",
    "transaction.state.log.min.isr": "Kafka: least in-sync replicas of __transaction_state. "
    "Always 1 here: one durable copy, in object storage. Read-only.",
    "group.initial.rebalance.delay.ms": "How long a classic group's first rebalance waits for "
    f"more members to join, in milliseconds. {_RESTART}",
    "group.min.session.timeout.ms": "Shortest session timeout a classic group member may ask "
    f"for, in milliseconds. {_RESTART}",
    "group.max.session.timeout.ms": "Longest session timeout a classic group member may ask "
    "for, in milliseconds. Fixed by TidalMQ: no setting changes it.",
    "group.consumer.session.timeout.ms": "Session timeout of members of consumer groups "
    f"(KIP-848, group.protocol=consumer), in milliseconds. {_RESTART}",
    "group.consumer.heartbeat.interval.ms": "Heartbeat interval given to members of consumer "
    f"groups (KIP-848), in milliseconds. {_RESTART}",
    "group.consumer.assignors": "Server-side assignors of consumer groups (KIP-848), by name; "
    f"the first is used when no member names one. {_RESTART}",
    "socket.request.max.bytes": "Largest request a connection may send, in bytes (a larger one "
    f"closes the connection). {_RESTART}",
    "max.connections": "Client connections open at once on this broker, past which new ones "
    "are closed as they are accepted (0: no cap; on Kafka 0 admits none). Default: 4096 "
    f"(Kafka's is 2147483647). {_RESTART}",
    "max.connections.per.ip": "Connections open at once from one client address (0: no cap; "
    "on Kafka 0 admits none but the overrides). Default: 1024 (Kafka's is 2147483647). " + _RESTART,
    "max.connections.per.ip.overrides": "Per-address exceptions to max.connections.per.ip, as "
    f"host-or-address:count pairs. {_RESTART}",
    "connections.max.idle.ms": "A connection that neither sent nor read a byte for this many "
    f"milliseconds is closed (0: never). {_RESTART}",
    "queued.max.request.bytes": "Request bytes all connections together may hold (read and "
    "not yet answered); past it, connections stop reading (0: no cap). Default: 134217728 "
    f"(128 MiB; Kafka's is -1, no cap). {_RESTART}",
    "listeners": f"The listeners this broker binds, as NAME://host:port pairs. {_RESTART}",
    "advertised.listeners": "The listeners clients are told to connect to, as NAME://host:port "
    f"pairs. {_RESTART}",
    "listener.security.protocol.map": "Each listener name's security protocol, as NAME:PROTOCOL "
    f"pairs. {_RESTART}",
    "log.dirs": "Where this broker's partitions are: the object store (TidalMQ has no local "
    "log directories). Static.",
    "process.roles": "broker, or broker,controller when this process runs the controller "
    "itself (embedded). Static.",
    "broker.rack": f"Rack or zone of this broker, given to clients (null: none). {_RESTART}",
    "sasl.enabled.mechanisms": "SASL mechanisms the SASL listeners offer (PLAIN, SCRAM-SHA-256, "
    "SCRAM-SHA-512; no GSSAPI or OAUTHBEARER). Default: SCRAM-SHA-256,SCRAM-SHA-512 (Kafka's "
    f"is GSSAPI). {_RESTART}",
    "ssl.client.auth": "Client certificates on SSL listeners: none, requested or required. "
    + _RESTART,
    "ssl.enabled.protocols": f"TLS versions offered (TLSv1.2, TLSv1.3). {_RESTART}",
    "ssl.principal.mapping.rules": "How a client certificate's distinguished name becomes a "
    f"principal (Kafka's RULE: syntax). {_RESTART}",
    "ssl.cipher.suites": "Cipher suites for TLSv1.2, as an OpenSSL cipher list (empty: "
    f"OpenSSL's own list). {_RESTART}",
    "ssl.keystore.location": "PEM file of the broker's private key and certificate chain; "
    "reloaded when it changes (looked at every --ssl-reload-interval-ms), or at once by "
    "altering this config to the same path. Another path takes a restart.",
    "ssl.keystore.type": "Always PEM: the key and trust stores are PEM files. Read-only.",
    "ssl.key.password": f"Password of an encrypted private key (sensitive). {_RESTART}",
    "ssl.truststore.location": "PEM file of the CA certificates client certificates must chain "
    "to; reloaded as ssl.keystore.location.",
    "ssl.truststore.type": "Always PEM (as ssl.keystore.type). Read-only.",
    "connection.failed.authentication.delay.ms": "How long after answering a failed "
    f"authentication the connection is closed, in milliseconds. {_RESTART}",
    "super.users": "Principals allowed everything, separated by ';' (User:admin;User:ops). "
    + _RESTART,
    "allow.everyone.if.no.acl.found": "Whether a resource without any ACL is open to everyone "
    f"(false: to super users only). {_RESTART}",
    "authorizer.class.name": "The ACL authorizer (Kafka's StandardAuthorizer name) when ACLs "
    f"are checked, empty when every client may do anything. {_RESTART}",
    "default.replication.factor": "Replication factor of new topics: always 1, a partition's "
    "one durable copy is in object storage. Read-only.",
    "delete.topic.enable": "Topics can always be deleted. Read-only.",
    "tidalmq.flush.interval.ms": "TidalMQ's write window: the longest an append waits for "
    "others before they are written to object storage together, in milliseconds (sooner once "
    f"--flush-bytes are waiting); a Produce is answered after that write. Default: 5.0. {_RESTART}",
    "leader.replication.throttled.rate": "Kafka: replication bytes per second a leader may "
    f"send for throttled replicas. {_NO_EFFECT_THROTTLE}",
    "follower.replication.throttled.rate": "Kafka: replication bytes per second a follower may "
    f"fetch for throttled replicas. {_NO_EFFECT_THROTTLE}",
    "replica.alter.log.dirs.io.max.bytes.per.second": "Kafka: bytes per second a move between "
    "log directories may copy. Recorded, limits nothing: TidalMQ's one log directory is the "
    "object store.",
}
