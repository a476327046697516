"""One connection's SASL exchange: SCRAM against an independent client implementation
(kafka-python's ScramClient), PLAIN, Kafka's error messages, the handshake states."""

from __future__ import annotations

import base64

import pytest
from kafka.net.sasl.scram import ScramClient
from tidalmq_broker.security.sasl import (
    SaslAuthenticator,
    SaslConfig,
    SaslFailure,
    SaslStateError,
    ScramServer,
    parse_mechanisms,
)
from tidalmq_core import scram

USERS = {
    ("alice", "SCRAM-SHA-512"): scram.new_credential(scram.SCRAM_SHA_512, "alice-secret"),
    ("alice", "SCRAM-SHA-256"): scram.new_credential(scram.SCRAM_SHA_256, "alice-secret", 8192),
    ("a,b=c", "SCRAM-SHA-256"): scram.new_credential(scram.SCRAM_SHA_256, "odd"),
    ("bob", "SCRAM-SHA-256"): scram.new_credential(scram.SCRAM_SHA_256, "bob-secret"),
}
ALL = SaslConfig(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), lambda u, m: USERS.get((u, m)))


def invalid(mech: str) -> str:
    return (
        "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mech}"
    )


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_with_an_independent_client(mech: str) -> None:
    sasl = SaslAuthenticator(ALL)
    assert sasl.handshake(mech, 1)
    client = ScramClient("alice", "alice-secret", mech)
    server_first = await sasl.authenticate(client.first_message())
    client.process_server_first_message(server_first)  # checks our nonce starts with its own
    assert f",i={USERS[('alice', mech)].iterations}".encode() in server_first
    server_final = await sasl.authenticate(client.final_message())
    client.process_server_final_message(server_final)  # raises unless our signature is right
    assert sasl.state == sasl.DONE
    assert sasl.principal == "User:alice"


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_wrong_password_and_unknown_user(mech: str) -> None:
    sasl = SaslAuthenticator(ALL)
    sasl.handshake(mech, 1)
    client = ScramClient("alice", "guess", mech)
    client.process_server_first_message(await sasl.authenticate(client.first_message()))
    with pytest.raises(SaslFailure) as failed:
        await sasl.authenticate(client.final_message())
    assert failed.value.client_message == invalid(mech)
    assert "wrong password" in failed.value.reason
    assert sasl.state == sasl.FAILED and sasl.principal is None
    with pytest.raises(SaslStateError):  # no second try on one connection
        await sasl.authenticate(client.final_message())
    nobody = SaslAuthenticator(ALL)
    nobody.handshake(mech, 1)
    with pytest.raises(SaslFailure, match="no SCRAM") as failed:
        await nobody.authenticate(ScramClient("mallory", "x", mech).first_message())
    assert failed.value.client_message == invalid(mech)


async def test_scram_escaped_names_authzid_and_protocol_errors() -> None:
    # "a,b=c" travels as a=2Cb=3Dc (RFC 5802 saslname)
    server = ScramServer(scram.SCRAM_SHA_256, ALL.credentials)
    first = await server.step(b"n,,n=a=2Cb=3Dc,r=abc")
    assert first.startswith(b"r=abc") and server.user == "a,b=c"
    other = ScramServer(scram.SCRAM_SHA_256, ALL.credentials)
    with pytest.raises(SaslFailure, match="authorization id") as failed:
        await other.step(b"n,a=root,n=bob,r=abc")
    assert "authorization id that is different" in failed.value.client_message
    same = ScramServer(scram.SCRAM_SHA_256, ALL.credentials)
    await same.step(b"n,a=bob,n=bob,r=abc")  # an authzid equal to the user is fine
    for bad in (
        b"p=tls-unique,,n=bob,r=abc",
        b"n,,n=bob",
        b"garbage",
        b"n,,n=bob,r=a,tokenauth=true",
        "n,,n=bob,r=\u00e9".encode(),
    ):
        with pytest.raises(SaslFailure):
            await ScramServer(scram.SCRAM_SHA_256, ALL.credentials).step(bad)
    # a client-final with another nonce, or channel data that is not its GS2 header
    s = ScramServer(scram.SCRAM_SHA_256, ALL.credentials)
    nonce = (await s.step(b"n,,n=bob,r=abc")).split(b",")[0][2:].decode()
    proof = base64.b64encode(b"\0" * 32).decode()
    with pytest.raises(SaslFailure, match="nonce"):
        await s.step(f"c=biws,r={nonce}x,p={proof}".encode())
    s = ScramServer(scram.SCRAM_SHA_256, ALL.credentials)
    nonce = (await s.step(b"n,,n=bob,r=abc")).split(b",")[0][2:].decode()
    with pytest.raises(SaslFailure, match="channel binding"):
        await s.step(f"c=eSws,r={nonce},p={proof}".encode())


async def test_plain_checks_the_password_against_the_scram_credentials() -> None:
    for user, password in (("alice", "alice-secret"), ("bob", "bob-secret")):
        sasl = SaslAuthenticator(ALL)
        assert sasl.handshake("PLAIN", 1)
        assert await sasl.authenticate(f"\0{user}\0{password}".encode()) == b""
        assert sasl.principal == f"User:{user}"
    cases = [
        (
            b"\0alice\0wrong",
            "Authentication failed: Invalid username or password",
            "wrong password",
        ),
        (b"\0nobody\0x", "Authentication failed: Invalid username or password", "unknown user"),
        (b"\0\0x", "Authentication failed: username not specified", "no username"),
        (b"\0alice\0", "Authentication failed: password not specified", "no password"),
        (b"root\0alice\0alice-secret", "authorization id that is different", "authorization"),
        (b"alice\0alice-secret", "expected 3 tokens", "malformed"),
    ]
    for token, client_message, reason in cases:
        sasl = SaslAuthenticator(ALL)
        sasl.handshake("PLAIN", 1)
        with pytest.raises(SaslFailure) as failed:
            await sasl.authenticate(token)
        assert client_message in failed.value.client_message
        assert reason in failed.value.reason
        assert "alice-secret" not in failed.value.reason


async def test_handshake_states() -> None:
    scram_only = SaslConfig(("SCRAM-SHA-512",), ALL.credentials)
    sasl = SaslAuthenticator(scram_only)
    with pytest.raises(SaslStateError):  # a token before the handshake
        await sasl.authenticate(b"n,,n=alice,r=x")
    assert not sasl.handshake("PLAIN", 1)  # not enabled
    assert sasl.state == sasl.FAILED
    v0 = SaslAuthenticator(scram_only)
    assert v0.handshake("SCRAM-SHA-512", 0)
    assert v0.state == v0.RAW  # tokens follow as raw frames
    with pytest.raises(SaslStateError):
        v0.handshake("SCRAM-SHA-512", 0)
    assert parse_mechanisms(" plain,SCRAM-SHA-256 ,PLAIN") == ("PLAIN", "SCRAM-SHA-256")
    for bad in ("GSSAPI", "", "OAUTHBEARER,PLAIN"):
        with pytest.raises(ValueError, match=r"sasl\.enabled\.mechanisms"):
            parse_mechanisms(bad)
