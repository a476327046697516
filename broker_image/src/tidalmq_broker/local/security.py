"""`tidalmq local up --security sasl_ssl`: a local cluster whose brokers listen with SASL_SSL only.

Everything is kept in `<data dir>/security/` and reused by the next `local up` on the same dir:
- `ca.pem` / `ca-key.pem`: a CA made for this data dir (clients trust `ca.pem`);
- `broker.pem`: the brokers' private key and certificate chain, issued again at each start for
  127.0.0.1, localhost and `--host` (so a new `--host` just works);
- `admin-password`: the password of the SCRAM-SHA-512 user `admin`, which the controller creates
  at start when it does not exist yet (`--scram-bootstrap` of a standalone broker; a password
  changed later with kafka-configs is kept);
- `client.properties`: what Kafka's CLI tools and Java clients need (`--command-config`):
  SASL_SSL, SCRAM-SHA-512 as admin, the CA as a PEM truststore.

The brokers enforce ACLs (a SASL_SSL listener turns authorization on) and `admin` is their super
user: every other user needs ACLs (`kafka-acls --command-config client.properties ...`).

Keys and the password are readable by their owner only.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from tidalmq_controller import BootstrapUser

from tidalmq_broker.security import certs

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
MECHANISMS = "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN"


@dataclass(frozen=True, slots=True)
class LocalSecurity:
    directory: Path
    password: str

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.directory / "broker.pem"

    @property
    def client_properties(self) -> Path:
        return self.directory / "client.properties"

    @property
    def password_file(self) -> Path:
        return self.directory / "admin-password"

    def bootstrap_users(self) -> list[BootstrapUser]:
        return [BootstrapUser(ADMIN, MECHANISM, self.password)]

    def broker_args(self, host: str, port: int) -> list[str]:
        """A broker's flags: one SASL_SSL listener on its port, ACLs enforced, admin their
        super user."""
        return [
            "--listeners",
            f"SASL_SSL://{host}:{port}",
            "--ssl-keystore-location",
            str(self.keystore),
            "--sasl-enabled-mechanisms",
            MECHANISMS,
            "--authorizer",
            "acl",
            "--super-users",
            f"User:{ADMIN}",
        ]

    def how_to_connect(self, bootstrap: str) -> str:
        first = bootstrap.split(",")[0]
        return "\n".join(
            [
                f"security: SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN), CA {self.ca}",
                f"  user {ADMIN}, password in {self.password_file}",
                f"  Kafka tools: kafka-topics --bootstrap-server {first} "
                f"--command-config {self.client_properties} --list",
                f"  confluent-kafka: {{'bootstrap.servers': '{bootstrap}', "
                "'security.protocol': 'SASL_SSL', 'sasl.mechanism': 'SCRAM-SHA-512', "
                f"'sasl.username': '{ADMIN}', 'sasl.password': open('{self.password_file}')"
                f".read().strip(), 'ssl.ca.location': '{self.ca}'}}",
                "  more users: kafka-configs --bootstrap-server ... --command-config ... --alter "
                "--add-config 'SCRAM-SHA-512=[password=...]' --entity-type users --entity-name NAME",
                f"  ACLs are enforced ({ADMIN} is the super user); grant others with kafka-acls "
                "--bootstrap-server ... --command-config ... --add --allow-principal User:NAME "
                "--producer --topic T (or --consumer --topic T --group G)",
            ]
        )


def prepare(data_dir: Path, host: str) -> LocalSecurity:
    """The data dir's CA, password and client.properties (made the first time), and broker
    certificates for `host`."""
    directory = data_dir / "security"
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert = directory / "ca.pem"
    ca = certs.ensure_ca(ca_cert, directory / "ca-key.pem", f"TidalMQ local CA ({data_dir.name})")
    password_file = directory / "admin-password"
    if password_file.exists():
        password = password_file.read_text().strip()
    else:
        password = secrets.token_urlsafe(18)
        certs.write_private(password_file, (password + "\n").encode())
    security = LocalSecurity(directory, password)
    hosts = ["127.0.0.1", "localhost", *([host] if host not in ("", "0.0.0.0", "::") else [])]
    certs.write_keystore(security.keystore, certs.issue(ca, "tidalmq-broker", hosts=hosts), ca)
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{password}";'
    )
    properties = "\n".join(
        [
            "# Kafka clients of this local cluster: kafka-topics ... --command-config THIS_FILE",
            "security.protocol=SASL_SSL",
            f"sasl.mechanism={MECHANISM}",
            f"sasl.jaas.config={jaas}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={ca_cert}",
            "",
        ]
    )
    certs.write_private(security.client_properties, properties.encode())
    return security
