"""Kafka's listener settings: `listeners`, `advertised.listeners`, `listener.security.protocol.map`.

`listeners` is a comma-separated list of `NAME://host:port` (IPv6 hosts in brackets, an empty
host binds every interface, port 0 takes any free port). Each NAME is a listener name whose
security protocol the map gives; by default the four protocol names map to themselves, so
`SASL_SSL://:9093` is a SASL_SSL listener. `advertised.listeners` says what clients are told
for each listener (by default what `listeners` says; a listener bound to every interface is
advertised under the machine's host name; one left out of it is not registered, as in Kafka).
Names and ports must be unique, as Kafka requires.

A broker without `listeners` has the one PLAINTEXT listener of its `--host`/`--port`
(advertised as `--advertised-host`/`--advertised-port`), as before listeners existed.

`inter.broker.listener.name` has no counterpart: TidalMQ's brokers never send each other Kafka
requests (partition data is in object storage; the controller talks HTTP).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, replace

from tidalmq_broker.security import SecurityConfigError

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
DEFAULT_PROTOCOL_MAP = {p: p for p in SECURITY_PROTOCOLS}

# Kafka's listener pattern (CoreUtils.listenerListToEndPoints): NAME://host:port
_LISTENER = re.compile(r"^(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)$")


class ListenerConfigError(SecurityConfigError):
    """A listener setting that cannot be used (the broker does not start)."""


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    name: str  # upper case, as Kafka normalises listener names
    host: str  # "" binds every interface
    port: int
    security_protocol: str

    @property
    def tls(self) -> bool:
        return self.security_protocol in (SSL, SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self.security_protocol in (SASL_PLAINTEXT, SASL_SSL)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_protocol_map(text: str) -> dict[str, str]:
    """`listener.security.protocol.map`: `NAME:PROTOCOL,...` (empty: the default map)."""
    if not text.strip():
        return dict(DEFAULT_PROTOCOL_MAP)
    out: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name:
            raise ListenerConfigError(f"listener.security.protocol.map: bad entry {item!r}")
        if protocol not in SECURITY_PROTOCOLS:
            raise ListenerConfigError(
                f"listener.security.protocol.map: {name} has unknown security protocol "
                f"{protocol!r} (known: {', '.join(SECURITY_PROTOCOLS)})"
            )
        if name in out:
            raise ListenerConfigError(f"listener.security.protocol.map: {name} given twice")
        out[name] = protocol
    return out


def parse_listeners(text: str, protocols: dict[str, str], setting: str) -> list[ListenerSpec]:
    """A `listeners`-style list; `setting` names it in errors."""
    specs: list[ListenerSpec] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        m = _LISTENER.match(item)
        if m is None:
            raise ListenerConfigError(
                f"{setting}: {item!r} is not a listener (expected NAME://host:port)"
            )
        name, host, port = m.group(1).upper(), m.group(2), int(m.group(3))
        if not 0 <= port <= 65535:
            raise ListenerConfigError(f"{setting}: {item!r} has port {port} outside 0..65535")
        protocol = protocols.get(name)
        if protocol is None:
            raise ListenerConfigError(
                f"{setting}: no security protocol defined for listener {name} (add it to "
                "listener.security.protocol.map)"
            )
        specs.append(ListenerSpec(name, host, port, protocol))
    names = [s.name for s in specs]
    for name in names:
        if names.count(name) > 1:
            raise ListenerConfigError(
                f"{setting}: each listener must have a different name "
                f"({name} is given {names.count(name)} times)"
            )
    return specs


@dataclass(frozen=True, slots=True)
class Listeners:
    """What to bind and what to advertise, listener by listener (same names, same order)."""

    bind: list[ListenerSpec]
    advertised: list[ListenerSpec]

    def advertised_for(self, bound: list[ListenerSpec]) -> list[ListenerSpec]:
        """The advertised endpoints once bound: port 0 becomes the port the socket took (for
        an advertised listener that left it 0 too), an empty host the machine's name."""
        ports = {b.name: b.port for b in bound}
        out = []
        for adv in self.advertised:
            port = adv.port or ports[adv.name]
            host = adv.host or socket.getfqdn()
            out.append(replace(adv, host=host, port=port))
        return out


def resolve(
    *,
    listeners: str,
    advertised_listeners: str,
    protocol_map: str,
    host: str,
    port: int,
    advertised_host: str,
    advertised_port: int,
) -> Listeners:
    """The listeners of a broker's settings. Raises ListenerConfigError."""
    protocols = parse_protocol_map(protocol_map)
    if not listeners.strip():
        bind = [ListenerSpec(PLAINTEXT, host, port, PLAINTEXT)]
        if PLAINTEXT not in protocols:
            raise ListenerConfigError(
                "listener.security.protocol.map has no PLAINTEXT entry, but --listeners is not "
                "given (the one listener of --host/--port is PLAINTEXT)"
            )
        if advertised_listeners.strip():
            advertised = parse_listeners(advertised_listeners, protocols, "advertised.listeners")
        else:
            # as before listeners: the bind host is advertised, 0.0.0.0 included
            legacy_host = advertised_host or host
            advertised = [ListenerSpec(PLAINTEXT, legacy_host, advertised_port or port, PLAINTEXT)]
    else:
        bind = parse_listeners(listeners, protocols, "listeners")
        if not bind:
            raise ListenerConfigError("listeners: no listener given")
        ports = [b.port for b in bind if b.port]
        for p in ports:
            if ports.count(p) > 1:
                raise ListenerConfigError(
                    f"listeners: each listener must have a different port "
                    f"({p} is given {ports.count(p)} times)"
                )
        if advertised_listeners.strip():
            advertised = parse_listeners(advertised_listeners, protocols, "advertised.listeners")
        else:
            advertised = list(bind)
        for adv in advertised:
            if adv.host in ("0.0.0.0", "::"):
                raise ListenerConfigError(
                    f"advertised.listeners cannot use the nonroutable meta-address {adv.host} "
                    f"({adv}): give --advertised-listeners with a routable address"
                )
    bound_names = {b.name for b in bind}
    for adv in advertised:
        if adv.name not in bound_names:
            raise ListenerConfigError(
                f"advertised.listeners: {adv.name} is not one of the listeners "
                f"({', '.join(b.name for b in bind)})"
            )
    # in the order of `listeners`; as in Kafka, a listener left out of advertised.listeners
    # is not registered: clients connected to it are told of no broker
    by_name = {a.name: a for a in advertised}
    ordered = [by_name[b.name] for b in bind if b.name in by_name]
    if not ordered:
        raise ListenerConfigError("advertised.listeners: no listener given")
    return Listeners(bind=bind, advertised=ordered)
