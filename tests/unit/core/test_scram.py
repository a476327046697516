"""SCRAM math against the RFC test vectors (RFC 5802 for SHA-1, RFC 7677 for SHA-256)."""

from __future__ import annotations

import base64

import pytest
from tidalmq_core import scram


def _exchange(
    hash_name: str,
    password: str,
    salt_b64: str,
    iterations: int,
    client_first_bare: str,
    server_first: str,
    client_final_without_proof: str,
) -> tuple[str, str]:
    """(client proof, server signature), base64, computed as RFC 5802 section 3 says."""
    salted = scram.hi(password.encode(), base64.b64decode(salt_b64), iterations, hash_name)
    client_key = scram.client_key(salted, hash_name)
    stored = scram.stored_key(client_key, hash_name)
    auth = f"{client_first_bare},{server_first},{client_final_without_proof}".encode()
    proof = scram.xor(client_key, scram.hmac_digest(stored, auth, hash_name))
    signature = scram.hmac_digest(scram.server_key(salted, hash_name), auth, hash_name)
    return base64.b64encode(proof).decode(), base64.b64encode(signature).decode()


def test_rfc_7677_scram_sha_256_vector() -> None:
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    proof, signature = _exchange(
        "sha256",
        "pencil",
        "W22ZaJ0SNY7soEsUEjb6gQ==",
        4096,
        "n=user,r=rOprNGfwEbeRWgbNEkqO",
        f"r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
        f"c=biws,r={nonce}",
    )
    assert proof == "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    assert signature == "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_rfc_5802_scram_sha_1_vector() -> None:
    # the same math with SHA-1 (not a mechanism TidalMQ offers): RFC 5802 section 5
    nonce = "fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j"
    proof, signature = _exchange(
        "sha1",
        "pencil",
        "QSXCR+Q6sek8bf92",
        4096,
        "n=user,r=fyko+d2lbbFgONRv9qkxdawL",
        f"r={nonce},s=QSXCR+Q6sek8bf92,i=4096",
        f"c=biws,r={nonce}",
    )
    assert proof == "v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    assert signature == "rmF9pqV8S7suAoZWja4dJRkFsKQ="


@pytest.mark.parametrize("mech", [scram.SCRAM_SHA_256, scram.SCRAM_SHA_512])
def test_a_credential_checks_its_password_only(mech: scram.Mechanism) -> None:
    cred = scram.new_credential(mech, "s3cret", iterations=4096)
    assert scram.password_matches(mech, cred, "s3cret")
    assert not scram.password_matches(mech, cred, "s3cret ")
    assert not scram.password_matches(mech, cred, "")
    # what AlterUserScramCredentials carries (the salted password) gives the same credential
    salted = scram.hi(b"s3cret", cred.salt, cred.iterations, mech.hash)
    assert scram.credential_from_salted(mech, cred.salt, salted, cred.iterations) == cred
    # two credentials of one password differ: random salts
    assert scram.new_credential(mech, "s3cret").salt != cred.salt


def test_credential_json_round_trip_and_no_key_material_in_repr() -> None:
    cred = scram.new_credential(scram.SCRAM_SHA_512, "pw", iterations=8192, salt=b"salt")
    doc = cred.to_json()
    assert set(doc) == {"salt", "stored_key", "server_key", "iterations"}
    assert scram.ScramCredential.from_json(doc) == cred
    assert len(cred.stored_key) == len(cred.server_key) == 64  # SHA-512
    assert repr(cred) == "ScramCredential(iterations=8192)"
    assert doc["stored_key"] not in repr(cred)


def test_mechanisms_by_kafka_name_and_type_byte() -> None:
    assert scram.mechanism("SCRAM-SHA-256").type == 1
    assert scram.BY_TYPE[2].name == "SCRAM-SHA-512"
    with pytest.raises(KeyError):
        scram.mechanism("SCRAM-SHA-1")
