"""The control plane's tokens (tidalmq_core.control_auth): the cluster token, brokers' tokens
derived from the brokers' secret, what each side accepts, and how token files are read."""

from __future__ import annotations

import hmac
from pathlib import Path

import pytest
from tidalmq_core import control_auth
from tidalmq_core.control_auth import (
    ADMIN,
    BrokerCredentials,
    ControlAuth,
    Principal,
    TokenError,
    bearer,
    broker_id_of,
    broker_token,
    generate_token,
    parse_tokens,
    read_tokens,
    tokens_from_env,
)

CLUSTER = "cluster-token-" + "c" * 40
BROKERS = "brokers-secret-" + "b" * 40


def header(token: str) -> str:
    return f"Bearer {token}"


def test_generated_tokens_are_long_random_and_usable() -> None:
    tokens = {generate_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert len(token) >= 43 and parse_tokens(token) == [token]


def test_a_broker_token_names_its_broker_and_depends_on_the_secret() -> None:
    token = broker_token(CLUSTER, 3)
    assert token.startswith("broker-3.") and len(token) == len("broker-3.") + 64
    assert broker_id_of(token) == 3
    assert token == broker_token(CLUSTER, 3)
    assert token != broker_token(CLUSTER, 4) and token != broker_token(BROKERS, 3)
    assert broker_id_of(CLUSTER) is None and broker_id_of("broker-3.xyz") is None


@pytest.mark.parametrize(
    ("value", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("Basic abc", None),
        ("bearer abc", "abc"),
        ("Bearer  abc ", "abc"),
        ("Bearer " + "a" * 2000, None),
    ],
)
def test_bearer_header(value: str | None, token: str | None) -> None:
    assert bearer(value) == token


def test_the_controller_accepts_the_cluster_token_and_each_brokers_own_token() -> None:
    auth = ControlAuth([CLUSTER])
    assert auth.authenticate(header(CLUSTER)) == (ADMIN, "")
    assert auth.authenticate(header(broker_token(CLUSTER, 7))) == (Principal(7), "")
    assert auth.broker_token(7) == broker_token(CLUSTER, 7)
    assert auth.authenticate(None) == (None, "no bearer token")
    assert auth.authenticate("Basic " + CLUSTER) == (None, "not a bearer token")
    for wrong in (
        CLUSTER + "x",
        CLUSTER[:-1],
        BROKERS,
        broker_token(BROKERS, 7),
        broker_token(CLUSTER, 7).replace("broker-7.", "broker-8."),
        broker_token(CLUSTER, 7)[:-1] + "0",
    ):
        assert auth.authenticate(header(wrong)) == (None, "wrong token"), wrong


def test_with_a_brokers_secret_broker_tokens_derive_from_it_only() -> None:
    """The chart's setup: brokers hold the brokers' secret, never the cluster token."""
    auth = ControlAuth([CLUSTER], [BROKERS])
    assert auth.authenticate(header(broker_token(BROKERS, 2))) == (Principal(2), "")
    assert auth.authenticate(header(broker_token(CLUSTER, 2)))[0] is None
    assert auth.authenticate(header(BROKERS))[0] is None, "the brokers' secret is not admin"
    assert auth.authenticate(header(CLUSTER))[0] == ADMIN
    assert auth.broker_token(2) == broker_token(BROKERS, 2)


def test_rotation_every_line_is_accepted_the_first_is_used() -> None:
    old, new = "old-" + "o" * 40, "new-" + "n" * 40
    auth = ControlAuth([new, old], [BROKERS + "2", BROKERS])
    for token in (old, new):
        assert auth.authenticate(header(token))[0] == ADMIN
    for secret in (BROKERS, BROKERS + "2"):
        assert auth.authenticate(header(broker_token(secret, 1)))[0] == Principal(1)
    assert auth.token == new and auth.broker_token(1) == broker_token(BROKERS + "2", 1)


def test_tokens_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every candidate is compared with hmac.compare_digest, with no early exit (the time does
    not tell which line matched, nor how much of a wrong token was right)."""
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(control_auth.hmac, "compare_digest", compare)
    auth = ControlAuth(["a" * 40, "b" * 40])
    assert auth.authenticate(header("a" * 40))[0] == ADMIN
    assert len(calls) == 2, "the second line is compared too"
    calls.clear()
    assert auth.authenticate(header(broker_token("b" * 40, 1)))[0] == Principal(1)
    assert len(calls) == 4  # two cluster tokens, then the token derived from each secret
    calls.clear()
    assert auth.authenticate(header("c" * 40))[0] is None
    assert len(calls) == 2


def test_a_broker_token_is_never_a_cluster_token() -> None:
    with pytest.raises(TokenError):
        ControlAuth([broker_token(CLUSTER, 0)])
    with pytest.raises(TokenError):
        ControlAuth([])


def test_broker_credentials_from_a_secret() -> None:
    creds = BrokerCredentials([BROKERS], 4)
    assert creds.token == broker_token(BROKERS, 4)
    # the controller's pushes (its own token) and its preStop drain (the secret itself)
    assert creds.authenticate(header(broker_token(BROKERS, 4))) == (True, "")
    assert creds.authenticate(header(BROKERS)) == (True, "")
    assert creds.authenticate(header(broker_token(BROKERS, 5))) == (False, "wrong token")
    assert creds.authenticate(header(CLUSTER)) == (False, "wrong token")
    assert creds.authenticate(None) == (False, "no bearer token")


def test_broker_credentials_from_its_own_token_accept_nothing_else() -> None:
    """The local cluster's brokers: each holds its own token only."""
    own = broker_token(CLUSTER, 1)
    creds = BrokerCredentials([own], 1)
    assert creds.token == own
    assert creds.authenticate(header(own)) == (True, "")
    for other in (CLUSTER, broker_token(CLUSTER, 0), own[:-1] + "f"):
        assert creds.authenticate(header(other))[0] is False
    with pytest.raises(TokenError, match="broker 1's token, and this is broker 2"):
        BrokerCredentials([own], 2)


def test_token_files(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"# rotated 2026-01-01\n\n  {CLUSTER}  \n{BROKERS}\n")
    assert read_tokens(file=str(path)) == [CLUSTER, BROKERS]
    assert read_tokens(CLUSTER) == [CLUSTER]
    assert read_tokens() == []
    with pytest.raises(TokenError, match="not both"):
        read_tokens(CLUSTER, str(path))
    with pytest.raises(TokenError, match="cannot read"):
        read_tokens(file=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n# nothing\n")
    with pytest.raises(TokenError, match="holds no token"):
        read_tokens(file=str(tmp_path / "empty"))
    with pytest.raises(TokenError, match="too short"):
        parse_tokens("short")
    with pytest.raises(TokenError, match="without spaces"):
        parse_tokens("a" * 20 + " " + "b" * 20)
    assert parse_tokens(broker_token(CLUSTER, 0)) == [broker_token(CLUSTER, 0)]


def test_tokens_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text(CLUSTER)
    assert tokens_from_env({"TIDALMQ_CONTROL_TOKEN_FILE": str(path)}) == [CLUSTER]
    assert tokens_from_env({"TIDALMQ_CONTROL_TOKEN": BROKERS}) == [BROKERS]
    assert tokens_from_env({}) == []
