"""Kafka client properties as the project's own clients read them (`tidalmq reassign
--command-config`, the planner), and the SCRAM client they authenticate with."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidalmq_core import scram
from tidalmq_core.client_properties import (
    ClientConfigError,
    ClientSecurity,
    from_file,
    from_properties,
    parse_properties,
    resolve_providers,
)

JAVA = r"""
# what `tidalmq local up --security sasl_ssl` writes, and Kafka's docs show
security.protocol=SASL_SSL
sasl.mechanism = SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    username="admin" password="p\"w=d;x";
ssl.truststore.type: PEM
ssl.truststore.location /etc/ca.pem
! a comment
"""


def test_javas_properties_and_the_jaas_config() -> None:
    props = parse_properties(JAVA)
    assert props["ssl.truststore.location"] == "/etc/ca.pem"
    assert props["sasl.mechanism"] == "SCRAM-SHA-512"
    s = from_properties(props)
    assert s == ClientSecurity(
        protocol="SASL_SSL",
        mechanism="SCRAM-SHA-512",
        username="admin",
        password='p"w=d;x',
        ca_file="/etc/ca.pem",
    )
    assert s.tls and s.sasl
    assert s.librdkafka() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": 'p"w=d;x',
        "ssl.ca.location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_mtls_and_librdkafkas_names() -> None:
    s = from_properties(
        {
            "security.protocol": "ssl",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": "/k.pem",
            "ssl.truststore.location": "/ca.pem",
            "ssl.endpoint.identification.algorithm": "",
        }
    )
    assert (s.protocol, s.cert_file, s.key_file, s.ca_file) == (
        "SSL",
        "/k.pem",
        "/k.pem",
        "/ca.pem",
    )
    assert not s.check_hostname and not s.sasl
    rd = from_properties(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
        }
    )
    assert (rd.mechanism, rd.username, rd.password, rd.tls) == ("PLAIN", "u", "p", False)
    assert from_file(None) == ClientSecurity()


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"security.protocol": "SASL_SSL"}, "sasl.mechanism=GSSAPI"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "OAUTHBEARER"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "SASL needs a user"),
        ({"security.protocol": "TLS"}, "security.protocol=TLS"),
        ({"security.protocol": "SSL", "ssl.truststore.location": "/t.jks"}, "only PEM stores"),
        ({"ssl.keystore.location": "/k.p12", "ssl.keystore.type": "PKCS12"}, "PKCS12"),
    ],
)
def test_what_cannot_be_used_is_one_line(props: dict[str, str], message: str) -> None:
    with pytest.raises(ClientConfigError, match=message):
        from_properties(props)


def test_a_missing_or_huge_file(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match="cannot read"):
        from_file(str(tmp_path / "none.properties"))
    big = tmp_path / "big"
    big.write_bytes(b"#" * (2 << 20))
    with pytest.raises(ClientConfigError, match="larger than 1 MiB"):
        from_file(str(big))


def test_the_scram_client_against_rfc_7677() -> None:
    """RFC 7677's SCRAM-SHA-256 exchange, byte for byte."""
    client = scram.ScramClient(scram.SCRAM_SHA_256, "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert client.final(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    client.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(ValueError, match="signature is wrong"):
        client.verify(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(ValueError, match="not SCRAM's"):
        scram.ScramClient(scram.SCRAM_SHA_256, "u", "p", nonce="abc").final(b"r=xyz,s=AA==,i=4096")
    with pytest.raises(ValueError, match="iterations"):
        scram.ScramClient(scram.SCRAM_SHA_256, "u", "p", nonce="abc").final(b"r=abcd,s=AA==,i=1")


DIR = "org.apache.kafka.common.config.provider.DirectoryConfigProvider"
FILE = "org.apache.kafka.common.config.provider.FileConfigProvider"
ENV = "org.apache.kafka.common.config.provider.EnvVarConfigProvider"


def test_config_providers_read_credentials_from_mounted_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a User's Secret mounted as a directory (one file per key), as Kubernetes mounts it
    creds = tmp_path / "user"
    creds.mkdir()
    (creds / "sasl.jaas.config").write_text(
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="planner" '
        'password="s3cr=t";'
    )
    (tmp_path / "more.properties").write_text("mechanism=SCRAM-SHA-512\n")
    monkeypatch.setenv("CA_PATH", "/etc/ca.crt")
    path = tmp_path / "client.properties"
    path.write_text(
        "security.protocol=SASL_SSL\n"
        "config.providers=dir, file,env\n"
        f"config.providers.dir.class={DIR}\n"
        f"config.providers.file.class={FILE}\n"
        f"config.providers.env.class={ENV}\n"
        f"sasl.jaas.config=${{dir:{creds}:sasl.jaas.config}}\n"
        f"sasl.mechanism=${{file:{tmp_path}/more.properties:mechanism}}\n"
        "ssl.ca.location=${env:CA_PATH}\n"
    )
    s = from_file(str(path))
    assert (s.protocol, s.mechanism, s.username, s.password, s.ca_file) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "planner",
        "s3cr=t",
        "/etc/ca.crt",
    )


def test_allowed_paths_bound_what_a_provider_reads(tmp_path: Path) -> None:
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    for d in (allowed, other):
        d.mkdir()
        (d / "password").write_text("pw")
    base = {
        "config.providers": "dir",
        "config.providers.dir.class": DIR,
        "config.providers.dir.param.allowed.paths": str(allowed),
    }
    assert resolve_providers({**base, "x": f"${{dir:{allowed}:password}}"})["x"] == "pw"
    with pytest.raises(ClientConfigError, match=r"allowed\.paths"):
        resolve_providers({**base, "x": f"${{dir:{other}:password}}"})
    # a symlink out of the allowed directory is outside it too
    (allowed / "escape").symlink_to(other)
    with pytest.raises(ClientConfigError, match=r"allowed\.paths"):
        resolve_providers({**base, "x": f"${{dir:{allowed}/escape:password}}"})
    with pytest.raises(ClientConfigError, match="not a file name"):
        resolve_providers({**base, "x": f"${{dir:{allowed}:../other/password}}"})


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"x": "${dir:/etc:password}"}, "config.providers does not declare"),
        (
            {"config.providers": "vault", "config.providers.vault.class": "com.example.Vault"},
            "config.providers.vault.class=com.example.Vault: one of",
        ),
        ({"config.providers": "d"}, r"config.providers.d.class=\(not set\)"),
        (
            {
                "config.providers": "env",
                "config.providers.env.class": ENV,
                "x": "${env:TIDALMQ_SURELY_UNSET_VARIABLE}",
            },
            "TIDALMQ_SURELY_UNSET_VARIABLE is not set",
        ),
        (
            {"config.providers": "d", "config.providers.d.class": DIR, "x": "${d:relative:k}"},
            "not an absolute path",
        ),
        (
            {
                "config.providers": "f",
                "config.providers.f.class": FILE,
                "x": "${f:/nonexistent/p:k}",
            },
            "cannot read /nonexistent/p",
        ),
    ],
)
def test_provider_errors_are_one_line_naming_the_setting(
    props: dict[str, str], message: str
) -> None:
    with pytest.raises(ClientConfigError, match=message) as info:
        resolve_providers(props)
    assert "\n" not in str(info.value)


def test_values_without_references_are_untouched() -> None:
    props = {"a": "$notareference", "b": "${unterminated", "config.providers": ""}
    assert resolve_providers(props) == props
