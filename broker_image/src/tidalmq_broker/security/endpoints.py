"""A broker's settings as the Kafka listener's endpoints (and what it registers), and as its
authorizer.

Every configuration error is found here, before the broker binds or opens anything, and is one
SecurityConfigError naming the setting (`tidalmq broker` prints it and exits 2).
"""

from __future__ import annotations

from dataclasses import replace

from tidalmq_core.metadata import BrokerInfo, Endpoint
from tidalmq_core.tls_reload import FollowingContext

from tidalmq_broker.security import SecurityConfigError
from tidalmq_broker.security.authorizer import Authorizer, parse_super_users
from tidalmq_broker.security.listeners import PLAINTEXT, Listeners, ListenerSpec, resolve
from tidalmq_broker.security.principal import PrincipalMapper
from tidalmq_broker.security.sasl import Credentials, SaslConfig, parse_mechanisms
from tidalmq_broker.security.tls import TlsSettings, listener_context
from tidalmq_broker.server.listener_config import ListenerEndpoint
from tidalmq_broker.settings import BrokerSettings


def listeners_of(s: BrokerSettings) -> Listeners:
    return resolve(
        listeners=s.listeners,
        advertised_listeners=s.advertised_listeners,
        protocol_map=s.listener_security_protocol_map,
        host=s.host,
        port=s.port,
        advertised_host=s.advertised_host,
        advertised_port=s.advertised_port,
    )


def tls_settings(s: BrokerSettings) -> TlsSettings:
    return TlsSettings(
        keystore_location=s.ssl_keystore_location,
        key_location=s.ssl_keystore_key_location,
        key_password=s.ssl_key_password,
        truststore_location=s.ssl_truststore_location,
        crl_location=s.ssl_crl_location,
        client_auth=s.ssl_client_auth,
        enabled_protocols=s.ssl_enabled_protocols,
        cipher_suites=s.ssl_cipher_suites,
    )


def build_endpoints(
    s: BrokerSettings,
    credentials: Credentials,
    tls_contexts: dict[str, FollowingContext] | None = None,
) -> tuple[Listeners, list[ListenerEndpoint]]:
    """The listeners of `s` and an endpoint to bind for each; the TLS listeners' contexts, which
    follow their files, are put in `tls_contexts` by listener name. Raises
    SecurityConfigError."""
    listeners = listeners_of(s)
    try:
        mapper = PrincipalMapper(s.ssl_principal_mapping_rules)
    except ValueError as exc:
        raise SecurityConfigError(f"ssl.principal.mapping.rules: {exc}") from exc
    mechanisms: tuple[str, ...] = ()
    if any(spec.sasl for spec in listeners.bind):
        try:
            mechanisms = parse_mechanisms(s.sasl_enabled_mechanisms)
        except ValueError as exc:
            raise SecurityConfigError(str(exc)) from exc
    tls = tls_settings(s)
    endpoints = []
    for spec in listeners.bind:
        # KIP-684: ssl.client.auth is for SSL listeners; SASL_SSL clients authenticate by SASL
        context = None
        if spec.tls:
            context = listener_context(spec.name, tls, client_auth="none" if spec.sasl else None)
            if tls_contexts is not None:
                tls_contexts[spec.name] = context
        endpoints.append(
            ListenerEndpoint(
                name=spec.name,
                host=spec.host,
                port=spec.port,
                security_protocol=spec.security_protocol,
                ssl_context=context,
                sasl=SaslConfig(mechanisms, credentials) if spec.sasl else None,
                principal_mapper=mapper,
            )
        )
    return listeners, endpoints


def advertised_endpoints(listeners: Listeners, ports: dict[str, int]) -> list[Endpoint]:
    """What the broker registers, once its sockets are bound (`ports`: name -> bound port)."""
    bound = [replace(b, port=ports[b.name]) for b in listeners.bind]
    return [
        Endpoint(a.name, a.host, a.port, a.security_protocol)
        for a in listeners.advertised_for(bound)
    ]


def broker_listeners(endpoints: list[Endpoint]) -> tuple[str, int, list[Endpoint]]:
    """BrokerInfo's host, port and listeners for these advertised endpoints."""
    first = endpoints[0]
    return first.host, first.port, BrokerInfo.normal_listeners(first.host, first.port, endpoints)


def describe(endpoints: list[Endpoint] | list[ListenerSpec]) -> str:
    return ",".join(
        f"{e.name}://{e.host}:{e.port}"
        + ("" if e.name == e.security_protocol else f" ({e.security_protocol})")
        for e in endpoints
    )


AUTHORIZERS = ("auto", "acl", "none")


def build_authorizer(
    s: BrokerSettings, listeners: Listeners, bootstrap_users: list[str]
) -> Authorizer:
    """The broker's authorizer: `authorizer` auto is on when any listener is not PLAINTEXT;
    the super users are `super.users` and the SCRAM bootstrap users (`User:<name>`). Raises
    SecurityConfigError."""
    mode = s.authorizer.strip().lower()
    if mode not in AUTHORIZERS:
        raise SecurityConfigError(
            f"authorizer: {s.authorizer!r} is not one of {', '.join(AUTHORIZERS)}"
        )
    try:
        super_users = parse_super_users(s.super_users)
    except ValueError as exc:
        raise SecurityConfigError(f"super.users: {exc}") from exc
    secured = any(spec.security_protocol != PLAINTEXT for spec in listeners.bind)
    enabled = mode == "acl" or (mode == "auto" and secured)
    return Authorizer(
        enabled=enabled,
        super_users=super_users | {f"User:{user}" for user in bootstrap_users},
        allow_everyone_if_no_acl_found=s.allow_everyone_if_no_acl_found,
    )


def describe_authorization(s: BrokerSettings, authorizer: Authorizer) -> str:
    """What the broker's start line says about authorization."""
    mode = s.authorizer.strip().lower()
    if authorizer.enabled:
        why = "authorizer=acl" if mode == "acl" else "authorizer=auto: a listener is not PLAINTEXT"
        return f"authorization {authorizer.describe()} [{why}]"
    why = "authorizer=none" if mode == "none" else "authorizer=auto: PLAINTEXT listeners only"
    return (
        f"authorization OFF [{why}]: every client may do anything; --authorizer acl enforces ACLs"
    )
