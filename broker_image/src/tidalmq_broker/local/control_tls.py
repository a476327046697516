"""The local cluster's control-plane mTLS (tidalmq_core.control_tls): its CA and certificates.

`tidalmq local up` runs its control plane with mTLS unless `--control-tls off`. Everything is in
`<data dir>/control-tls/`, made at the first start and kept (the CA) or issued again at each
start (the others, so a new `--host` just works):
- `ca.pem` / `ca-key.pem`: the cluster CA, for the control plane only (never the Kafka clients');
- `controller.pem`: the controller's key and certificate (CN=controller, for 127.0.0.1,
  localhost and `--host`): it serves the brokers and the CLI and presents it when it pushes;
- `broker-N.pem`: broker N's (CN=broker-N), issued when the broker starts: it can act for no
  other broker, and not as the administrator;
- `admin.pem`: the CLI's (CN=admin): `tidalmq local status | add-broker | ...`, `recover` and
  `static-topic` present it, found through the data dir like the control token;
- `crl.pem`, yours: when it exists at start (a CRL of `ca.pem`'s CA, PEM), every process of the
  cluster (the controller, each broker, the CLI) checks the peer's certificate against it and
  reloads it when it changes: writing a CRL that lists a broker's serial number refuses that
  broker's certificate from the next connection on, without a restart. None: no revocation.

Each `.pem` holds the private key then the certificate (readable by its owner only): it is both
the certificate and the key file of a ControlTls.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tidalmq_core.control_tls import ControlTls

if TYPE_CHECKING:  # the CLI finds the admin's certificate without loading cryptography
    from tidalmq_broker.security import certs

DIR_NAME = "control-tls"


def directory(data_dir: Path) -> Path:
    return data_dir / DIR_NAME


def _tls(path: Path, ca: Path) -> ControlTls:
    crl = ca.parent / "crl.pem"  # checked when it exists (the module's docstring)
    return ControlTls(str(path), str(path), str(ca), str(crl) if crl.exists() else "")


def data_dir_tls(data_dir: Path) -> ControlTls | None:
    """The CLI's certificate (CN=admin) of a local cluster's data dir, None when there is none
    (a cluster run with `--control-tls off`)."""
    d = directory(data_dir)
    admin, ca = d / "admin.pem", d / "ca.pem"
    return _tls(admin, ca) if admin.exists() and ca.exists() else None


@dataclass(slots=True)
class LocalControlTls:
    """The CA of a data dir, and the certificates it issues for the local cluster's processes."""

    directory: Path
    ca: certs.Issued
    hosts: list[str]

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    def _issue(self, name: str, *, server: bool) -> ControlTls:
        from tidalmq_broker.security import certs

        path = self.directory / f"{name}.pem"
        issued = certs.issue(
            self.ca, name, hosts=self.hosts if server else None, server=server, client=True
        )
        certs.write_keystore(path, issued)
        return _tls(path, self.ca_file)

    def controller(self) -> ControlTls:
        return self._issue("controller", server=True)

    def broker(self, broker_id: int) -> ControlTls:
        return self._issue(f"broker-{broker_id}", server=True)

    def admin(self) -> ControlTls:
        return self._issue("admin", server=False)


def prepare(data_dir: Path, host: str) -> LocalControlTls:
    """The data dir's control-plane CA (made the first time) and the CLI's certificate."""
    from tidalmq_broker.security import certs

    d = directory(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    ca = certs.ensure_ca(d / "ca.pem", d / "ca-key.pem", f"TidalMQ control plane ({data_dir.name})")
    hosts = ["127.0.0.1", "localhost", *([host] if host not in ("", "0.0.0.0", "::") else [])]
    local = LocalControlTls(d, ca, hosts)
    local.admin()
    return local
