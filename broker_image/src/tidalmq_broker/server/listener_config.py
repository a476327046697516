"""What a Kafka listener is built with: its endpoints, its bounds and its metrics hook.

Owns: `ListenerEndpoint` (one server socket: listener name, security protocol, TLS context, SASL
settings, principal mapping), `ListenerLimits` (the listener's bounds; their defaults and why
are in docs/limits.md), `RequestObserver` (called per request and per connection refused or
closed by a bound) and `client_address` (the address a per-IP cap counts).

Must not touch: connections or sockets; this module only describes (server/listener.py serves).
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from tidalmq_broker.security.listeners import PLAINTEXT
from tidalmq_broker.security.principal import PrincipalMapper
from tidalmq_broker.security.sasl import SaslConfig


@dataclass(frozen=True, slots=True)
class ListenerEndpoint:
    """One server socket of the Kafka listener."""

    name: str = PLAINTEXT
    host: str = "127.0.0.1"
    port: int = 9092
    security_protocol: str = PLAINTEXT
    ssl_context: ssl.SSLContext | None = None  # SSL and SASL_SSL
    sasl: SaslConfig | None = None  # SASL_PLAINTEXT and SASL_SSL
    principal_mapper: PrincipalMapper | None = None  # SSL: a certificate's DN -> principal


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """The listener's bounds; the broker's defaults and why are in docs/limits.md (these are
    the values tests and tools get without settings)."""

    max_request_bytes: int = 100 * 1024 * 1024  # socket.request.max.bytes
    # librdkafka pipelines one Produce request per partition: a producer writing to hundreds
    # of partitions of a broker has hundreds of requests waiting for their WAL flushes at once
    max_inflight_per_connection: int = 256
    # Requests pipelined on one connection are read only while those in flight add up to less
    # than this (one larger request is still read when nothing else is in flight): a produce
    # request stays in memory until its WAL object is durable, so with 32 in flight of 1 MiB
    # each, two producers alone held ~130 MB in the broker.
    max_inflight_bytes_per_connection: int = 16 * 1024 * 1024
    # responses not yet taken by the client, per connection (0: no cap): the connection is
    # muted at this many, and Fetch reads no more than what is left
    max_response_bytes_per_connection: int = 16 * 1024 * 1024
    queued_max_request_bytes: int = 0  # the broker-wide request budget (0: none)
    queued_max_response_bytes: int = 0  # the broker-wide response budget (0: none)
    max_connections: int = 0  # max.connections (0: no cap)
    max_connections_per_ip: int = 0  # max.connections.per.ip (0: no cap)
    # max.connections.per.ip.overrides: client address -> its own cap (resolved addresses)
    max_connections_per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    idle_timeout_s: float = 600.0  # connections.max.idle.ms
    tls_handshake_timeout_s: float = 10.0  # a client that has not finished it is dropped
    # connection.failed.authentication.delay.ms: a connection that failed to authenticate is
    # closed this long after its answer (which then reaches the client before the close, and
    # a password guesser waits)
    failed_authentication_delay_s: float = 0.1


class RequestObserver:
    """Hook for metrics: called once per handled request, and on connections refused or
    closed by a bound."""

    def observe(self, api_key: int, seconds: float, request_bytes: int, error: bool) -> None:
        pass

    def cpu(self, api_key: int, seconds: float) -> None:
        """A request took `seconds` of the event loop thread's CPU (its decoding and every
        step of its handler's task, encoding its response included: server/cpu.py)."""

    def queued(self, api_key: int, seconds: float) -> None:
        """A request waited `seconds` from being taken off its connection to its handler."""

    def connection_refused(self, reason: str) -> None:
        pass

    def connection_closed(self, reason: str) -> None:
        pass


def client_address(host: str) -> str:
    """The address a per-IP cap counts: IPv4 clients on a dual-stack socket count as IPv4."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)
