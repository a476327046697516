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

Kafka's config providers (KIP-297, KIP-632, KIP-887) resolve `${provider:path:key}` references in
values, so a properties file can point at credentials mounted from a Secret instead of holding
them: `config.providers=dir` with `config.providers.dir.class=
org.apache.kafka.common.config.provider.DirectoryConfigProvider` reads the file `key` of the
directory `path` (`${dir:/etc/creds:password}`); FileConfigProvider reads the property `key` of
the properties file `path`; EnvVarConfigProvider the environment variable (`${env:NAME}`).
`config.providers.NAME.param.allowed.paths` (KIP-993) limits the paths a provider may read. A
reference to a provider that is not declared, a class we do not have, a missing file or key,
or a path outside the allowed ones is a one-line error naming the setting (Kafka leaves an
unresolved reference in place, and the setting then fails further on, less clearly).

Pure: stdlib only (ssl for the context), imports nothing of ours.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by ssl_context(): a plaintext client (the CLI's usual) needs no ssl
    import ssl

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
MAX_FILE_BYTES = 1 << 20
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
# Kafka's ConfigTransformer pattern: ${provider:[path:]key}
_REFERENCE = re.compile(r"\$\{([^}]*?):(?:([^}]*?):)?([^}]*?)\}")
_PROVIDER_CLASSES = {
    "org.apache.kafka.common.config.provider.DirectoryConfigProvider": "dir",
    "org.apache.kafka.common.config.provider.FileConfigProvider": "file",
    "org.apache.kafka.common.config.provider.EnvVarConfigProvider": "env",
}


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


def _read_text(path: str, what: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ClientConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise ClientConfigError(f"{path}: larger than 1 MiB, not {what}")
    return data.decode("utf-8", errors="replace")


def read_properties(path: str) -> dict[str, str]:
    """A properties file, its config provider references resolved (`resolve_providers`)."""
    return resolve_providers(parse_properties(_read_text(path, "a client properties file")))


@dataclass(frozen=True, slots=True)
class _Provider:
    name: str
    kind: str  # dir, file or env
    allowed: tuple[Path, ...] | None  # param.allowed.paths (None: any path)

    def lookup(self, setting: str, path: str, key: str) -> str:
        if self.kind == "env":
            if key not in os.environ:
                raise ClientConfigError(f"{setting}: environment variable {key} is not set")
            return os.environ[key]
        if not path:
            raise ClientConfigError(f"{setting}: ${{{self.name}:PATH:KEY}} needs a path")
        target = Path(path)
        if not target.is_absolute():
            raise ClientConfigError(f"{setting}: {path} is not an absolute path")
        if self.allowed is not None:
            real = Path(os.path.realpath(target))
            if not any(real == a or a in real.parents for a in self.allowed):
                raise ClientConfigError(
                    f"{setting}: {path} is not under config.providers.{self.name}"
                    ".param.allowed.paths"
                )
        if self.kind == "dir":
            if "/" in key or key in ("", ".", ".."):
                raise ClientConfigError(f"{setting}: {key!r} is not a file name")
            return _read_text(str(target / key), f"a value for {setting}")
        values = parse_properties(_read_text(path, "a properties file"))
        if key not in values:
            raise ClientConfigError(f"{setting}: {path} has no property {key}")
        return values[key]


def _providers(props: Mapping[str, str]) -> dict[str, _Provider]:
    out: dict[str, _Provider] = {}
    for name in filter(None, (n.strip() for n in props.get("config.providers", "").split(","))):
        cls = props.get(f"config.providers.{name}.class", "").strip()
        if cls not in _PROVIDER_CLASSES:
            raise ClientConfigError(
                f"config.providers.{name}.class={cls or '(not set)'}: one of "
                + ", ".join(sorted(_PROVIDER_CLASSES))
            )
        allowed_raw = props.get(f"config.providers.{name}.param.allowed.paths")
        allowed = None
        if allowed_raw is not None:
            allowed = tuple(
                Path(os.path.realpath(p.strip())) for p in allowed_raw.split(",") if p.strip()
            )
        out[name] = _Provider(name, _PROVIDER_CLASSES[cls], allowed)
    return out


def resolve_providers(props: Mapping[str, str]) -> dict[str, str]:
    """`props` with every `${provider:path:key}` reference replaced by what its declared config
    provider reads (Kafka's semantics; the `config.providers*` settings stay as they are)."""
    providers = _providers(props)
    out: dict[str, str] = {}
    for setting, value in props.items():
        if setting.startswith("config.providers"):
            out[setting] = value
            continue

        def replace(m: re.Match[str], setting: str = setting) -> str:
            name, path, key = m.group(1), m.group(2) or "", m.group(3)
            provider = providers.get(name)
            if provider is None:
                raise ClientConfigError(
                    f"{setting}: {m.group(0)} names config provider {name!r}, which "
                    "config.providers does not declare"
                )
            return provider.lookup(setting, path, key)

        out[setting] = _REFERENCE.sub(replace, value)
    return out


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
        import ssl

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
