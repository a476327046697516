"""How the project's own Kafka clients (`tidalmq reassign`, the planner's `--bootstrap-server`)
reach a secured listener: Kafka's client properties, as Kafka's tools take them with
`--command-config FILE` (docs/security.md, "The project's own Kafka clients").

Read: `security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), `sasl.mechanism` (PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512) with `sasl.jaas.config` (`... required username="u"
password="p";`), and PEM stores: `ssl.truststore.location` (the CA certificates; with
`ssl.truststore.type=PEM`), `ssl.keystore.location` (the client's key and certificate chain, for
mTLS; `ssl.keystore.type=PEM`), `ssl.key.password`, `ssl.endpoint.identification.algorithm`
(empty: no host-name check). librdkafka's names are read too (`sasl.mechanisms`,
`sasl.username`, `sasl.password`, `ssl.ca.location`, `ssl.certificate.location`,
`ssl.key.location`), so one file serves both kinds of client. JKS and PKCS12 stores, GSSAPI and
OAUTHBEARER are refused with one line naming the setting.

Pure: stdlib only (ssl for the context), imports nothing of ours.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
MAX_FILE_BYTES = 1 << 20
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class ClientConfigError(ValueError):
    """Client properties that cannot be used (one line naming the setting)."""


def parse_properties(text: str) -> dict[str, str]:
    """A Java properties file's keys and values: `key=value`, `key: value` or `key value`,
    `#` and `!` comments, a trailing backslash continues the line."""
    out: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        match = re.match(r"((?:[^\\:=\s]|\\.)+)\s*[:=\s]\s*(.*)$", logical)
        if match:
            out[match.group(1).replace("\\", "")] = match.group(2).strip()
        elif logical.strip():
            out[logical.strip()] = ""
        logical = ""
    return out


def read_properties(path: str) -> dict[str, str]:
    try:
        data = Path(path).read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise ClientConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise ClientConfigError(f"{path}: larger than 1 MiB, not a client properties file")
    return parse_properties(data.decode("utf-8", errors="replace"))


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """What a client needs to connect to a listener of `protocol`."""

    protocol: str = "PLAINTEXT"
    mechanism: str = ""
    username: str = ""
    password: str = ""
    ca_file: str = ""  # PEM CA certificates (empty: the system's)
    cert_file: str = ""  # PEM client certificate chain (mTLS)
    key_file: str = ""  # PEM private key (may be the same file)
    key_password: str = ""
    check_hostname: bool = True

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context of an SSL or SASL_SSL connection."""
        ctx = ssl.create_default_context(cafile=self.ca_file or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = self.check_hostname
        if self.cert_file:
            try:
                ctx.load_cert_chain(
                    self.cert_file, self.key_file or None, self.key_password or None
                )
            except (OSError, ssl.SSLError) as exc:
                raise ClientConfigError(
                    f"ssl.keystore.location {self.cert_file}: cannot load a key and certificate "
                    f"from it ({exc})"
                ) from exc
        return ctx

    def librdkafka(self) -> dict[str, str]:
        """The same settings in librdkafka's names (confluent-kafka)."""
        out = {"security.protocol": self.protocol}
        if self.sasl:
            out |= {
                "sasl.mechanism": self.mechanism,
                "sasl.username": self.username,
                "sasl.password": self.password,
            }
        if self.tls:
            if self.ca_file:
                out["ssl.ca.location"] = self.ca_file
            if self.cert_file:
                out["ssl.certificate.location"] = self.cert_file
                out["ssl.key.location"] = self.key_file or self.cert_file
            if self.key_password:
                out["ssl.key.password"] = self.key_password
            out["ssl.endpoint.identification.algorithm"] = (
                "https" if self.check_hostname else "none"
            )
        return out


def _store(props: Mapping[str, str], kind: str) -> str:
    location = props.get(f"ssl.{kind}.location", "")
    store_type = props.get(f"ssl.{kind}.type", "PEM" if location.endswith(".pem") else "")
    if location and store_type.upper() != "PEM":
        raise ClientConfigError(
            f"ssl.{kind}.type={store_type or 'JKS (the default)'}: only PEM stores are read "
            f"(set ssl.{kind}.type=PEM and give a PEM file)"
        )
    return location


def from_properties(props: Mapping[str, str]) -> ClientSecurity:
    """The connection settings of Kafka (or librdkafka) client properties."""
    protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise ClientConfigError(f"security.protocol={protocol}: one of {', '.join(PROTOCOLS)}")
    mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "").strip().upper()
    username, password = props.get("sasl.username", ""), props.get("sasl.password", "")
    jaas = props.get("sasl.jaas.config", "")
    if jaas:
        options = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _JAAS_OPTION.findall(jaas)}
        username, password = options.get("username", username), options.get("password", password)
    if protocol.startswith("SASL_"):
        if mechanism not in MECHANISMS:
            raise ClientConfigError(
                f"sasl.mechanism={mechanism or 'GSSAPI (the default)'}: one of {', '.join(MECHANISMS)}"
            )
        if not username:
            raise ClientConfigError(
                'SASL needs a user: sasl.jaas.config=... required username="..." password="...";'
            )
    ca = props.get("ssl.ca.location", "") or _store(props, "truststore")
    cert = props.get("ssl.certificate.location", "") or _store(props, "keystore")
    key = props.get("ssl.key.location", "") or cert
    algorithm = props.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    return ClientSecurity(
        protocol=protocol,
        mechanism=mechanism,
        username=username,
        password=password,
        ca_file=ca,
        cert_file=cert,
        key_file=key if cert else "",
        key_password=props.get("ssl.key.password", ""),
        check_hostname=algorithm not in ("", "none"),
    )


def from_file(path: str | None) -> ClientSecurity:
    """`--command-config FILE` (None or empty: PLAINTEXT)."""
    return from_properties(read_properties(path)) if path else ClientSecurity()
