"""Kafka's listeners, advertised.listeners and listener.security.protocol.map."""

from __future__ import annotations

import pytest
from tidalmq_broker.security.listeners import (
    ListenerConfigError,
    ListenerSpec,
    parse_listeners,
    parse_protocol_map,
    resolve,
)


def settings(**kw: object) -> dict[str, object]:
    base: dict[str, object] = dict(
        listeners="",
        advertised_listeners="",
        protocol_map="",
        host="127.0.0.1",
        port=9092,
        advertised_host="",
        advertised_port=0,
    )
    return {**base, **kw}


def test_without_listeners_the_host_and_port_are_one_plaintext_listener() -> None:
    got = resolve(**settings(host="0.0.0.0", port=9092, advertised_host="b-0.svc"))  # type: ignore[arg-type]
    assert got.bind == [ListenerSpec("PLAINTEXT", "0.0.0.0", 9092, "PLAINTEXT")]
    assert got.advertised == [ListenerSpec("PLAINTEXT", "b-0.svc", 9092, "PLAINTEXT")]
    # as before listeners: the bind address is advertised when nothing else is said
    legacy = resolve(**settings(host="0.0.0.0", port=0))  # type: ignore[arg-type]
    assert legacy.advertised_for([ListenerSpec("PLAINTEXT", "0.0.0.0", 41234, "PLAINTEXT")]) == [
        ListenerSpec("PLAINTEXT", "0.0.0.0", 41234, "PLAINTEXT")
    ]


def test_several_listeners_with_the_default_protocol_map() -> None:
    got = resolve(
        **settings(  # type: ignore[arg-type]
            listeners="PLAINTEXT://127.0.0.1:9092, sasl_ssl://[::1]:9093,SSL://:0",
        )
    )
    assert got.bind == [
        ListenerSpec("PLAINTEXT", "127.0.0.1", 9092, "PLAINTEXT"),
        ListenerSpec("SASL_SSL", "::1", 9093, "SASL_SSL"),
        ListenerSpec("SSL", "", 0, "SSL"),
    ]
    assert [s.tls for s in got.bind] == [False, True, True]
    assert [s.sasl for s in got.bind] == [False, True, False]
    assert str(got.bind[1]) == "SASL_SSL://[::1]:9093"
    # port 0 and an empty host are what the socket took and the machine's name
    bound = [got.bind[0], got.bind[1], ListenerSpec("SSL", "", 40000, "SSL")]
    adv = got.advertised_for(bound)
    assert adv[2].port == 40000 and adv[2].host


def test_named_listeners_and_advertised_ones() -> None:
    got = resolve(
        **settings(  # type: ignore[arg-type]
            listeners="CLIENT://0.0.0.0:9093,INTERNAL://10.0.0.5:9094",
            advertised_listeners="CLIENT://kafka.example.com:443",
            protocol_map="CLIENT:SASL_SSL,INTERNAL:ssl",
        )
    )
    assert [(s.name, s.security_protocol) for s in got.bind] == [
        ("CLIENT", "SASL_SSL"),
        ("INTERNAL", "SSL"),
    ]
    # as in Kafka, a listener left out of advertised.listeners is not registered
    assert got.advertised == [ListenerSpec("CLIENT", "kafka.example.com", 443, "SASL_SSL")]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(listeners="PLAINTEXT://h:1,PLAINTEXT://h:2"), "different name"),
        (dict(listeners="PLAINTEXT://h:1,SSL://h:1"), "different port"),
        (dict(listeners="CLIENT://h:1"), "no security protocol defined for listener CLIENT"),
        (dict(listeners="PLAINTEXT:/h:1"), "not a listener"),
        (dict(listeners="PLAINTEXT://h:70000"), "outside 0..65535"),
        (dict(listeners="PLAINTEXT://0.0.0.0:9092"), "nonroutable meta-address 0.0.0.0"),
        (dict(listeners="SSL://h:1", advertised_listeners="PLAINTEXT://h:1"), "not one of"),
        (dict(listeners="X://h:1", protocol_map="X:TLS"), "unknown security protocol"),
        (dict(protocol_map="SSL:SSL"), "no PLAINTEXT entry"),
        (dict(listeners=" , "), "no listener given"),
    ],
)
def test_kafka_refuses_these_and_so_do_we(kw: dict[str, str], message: str) -> None:
    with pytest.raises(ListenerConfigError, match=message):
        resolve(**settings(**kw))  # type: ignore[arg-type]


def test_protocol_map_parsing() -> None:
    assert parse_protocol_map("") == {
        p: p for p in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
    }
    assert parse_protocol_map("a:sasl_plaintext, B:SSL") == {"A": "SASL_PLAINTEXT", "B": "SSL"}
    with pytest.raises(ListenerConfigError, match="given twice"):
        parse_protocol_map("A:SSL,a:SSL")
    assert parse_listeners("", {}, "listeners") == []
