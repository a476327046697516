"""mTLS on the control plane: the TLS contexts of its servers and clients, and the role a
certificate names (docs/security.md, "mTLS on the control plane").

The control plane's calls (brokers -> controller: register, heartbeat, reports, forwarded admin
requests; controller -> broker: metadata pushes; the CLI and the preStop drain) go over TLS with a
client certificate when the process is given the three files of `ControlTls`: its certificate
(chain), its private key and the cluster CA's certificate. The cluster CA is the control plane's
own: never the Kafka clients' CA, whose certificates are then refused in the handshake.

A certificate names its role in its subject's common name:

| CN | role |
| --- | --- |
| `broker-N` | broker N (the local cluster gives each broker its own) |
| `broker` | a broker of any id (the chart: a StatefulSet's pods share one Secret) |
| `controller`, `operator`, `admin` | the cluster's administrator (the controller pushing, the operator, the CLI) |

Anything else names no role and is refused. The bearer tokens stay (defense in depth): a control
call needs a certificate AND a token, and the certificate must allow what the token claims
(`permits`): the cluster token only with an administrator's certificate, broker N's token only
with broker N's (or a generic broker's) certificate. So a broker that took the admin token still
cannot remove or kill brokers, and a stolen certificate without the token does nothing.

Servers ask for a client certificate without requiring one (CERT_OPTIONAL): a certificate that
is presented must verify against the cluster CA or the handshake fails, and the open paths
(health, metrics: probes and Prometheus have no certificate) are served over TLS without one;
every other path is refused without a verified certificate. Clients verify the server's chain
against the cluster CA and, instead of its host name (brokers are reached at pod IPs, which a
certificate made before the pod cannot name), the role its certificate names: a broker and the
CLI talk only to an administrator's certificate (the controller), the controller pushes only to
a broker's; anything else fails the handshake (`expect_server`).

Renewed certificates are used without a restart: every context handed out is a
`tidalmq_core.tls_reload.FollowingContext` (the mechanism the Kafka listeners reload by too),
which makes each new connection's TLS object from the newest context built from the files, and
looks at the files (a stat of the three) at most every `RELOAD_CHECK_INTERVAL_S` when a
connection is made. cert-manager renewing the Secret that a pod mounts, or a CA rotation (the CA
file then holding the old and the new CA), therefore needs no restart of the operator or the
brokers; connections open at the renewal keep their session. A file that cannot be loaded (half
written) keeps the previous context until the next check.

Revocation: with a CRL file (`--control-tls-crl-file`, TIDALMQ_CONTROL_TLS_CRL_FILE; PEM, the
cluster CA's CRL) every context, server and client, checks the peer's certificate against it
(tidalmq_core.revocation, the Kafka listeners' `ssl.crl.location` code): a revoked broker,
operator or admin certificate fails the handshake, whichever side presents it. The CRL file is
followed with the other three, so a reissued CRL applies from the next connection on, without a
restart; connections already open (a broker's kept-alive heartbeat connection) keep their
session until they close. Missing or unloadable at start: the process does not start.

Stdlib only (ssl), and tidalmq_core.tls_reload (the contexts that follow their files).
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tidalmq_core.revocation import RevocationListError, check_revocation
from tidalmq_core.tls_reload import FollowingContext

RELOAD_CHECK_INTERVAL_S = 10.0  # how often, at most, a connection looks at the files

ENV_CERT_FILE = "TIDALMQ_CONTROL_TLS_CERT_FILE"
ENV_KEY_FILE = "TIDALMQ_CONTROL_TLS_KEY_FILE"
ENV_CA_FILE = "TIDALMQ_CONTROL_TLS_CA_FILE"
ENV_CRL_FILE = "TIDALMQ_CONTROL_TLS_CRL_FILE"

NO_CERTIFICATE = "no client certificate"
ADMIN_NAMES = frozenset({"controller", "operator", "admin"})
_BROKER_CN = re.compile(r"broker(?:-(\d{1,9}))?")


class ControlTlsError(ValueError):
    """Control-plane TLS settings that cannot be used (one line naming them)."""


@dataclass(frozen=True, slots=True)
class Role:
    """What a control-plane certificate may act as: the administrator, or a broker (`broker_id`
    None: any broker)."""

    name: str  # the certificate's common name
    admin: bool = False
    broker_id: int | None = None

    def __str__(self) -> str:
        return f"the certificate CN={self.name}"


def role_of_name(common_name: str) -> Role | None:
    """The role a certificate's common name gives (None: no role)."""
    if common_name in ADMIN_NAMES:
        return Role(common_name, admin=True)
    match = _BROKER_CN.fullmatch(common_name)
    if match is None:
        return None
    return Role(common_name, broker_id=int(match.group(1)) if match.group(1) else None)


def common_name(peercert: Mapping[str, Any] | None) -> str | None:
    """The subject's (last) common name of a verified peer certificate, as
    SSLObject.getpeercert() gives it; None without one."""
    if not peercert:
        return None
    found = None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                found = str(value)
    return found


def role_of(peercert: Mapping[str, Any] | None) -> tuple[Role | None, str]:
    """(role, "") of a verified peer certificate, else (None, why it has none)."""
    name = common_name(peercert)
    if name is None:
        return None, NO_CERTIFICATE if not peercert else "a certificate without a CN"
    role = role_of_name(name)
    if role is None:
        return None, f"the certificate CN={name} names no control-plane role"
    return role, ""


def permits(role: Role, broker_id: int | None) -> str:
    """ "" when a caller with `role` may present a token of `broker_id`'s (None: the cluster
    token), else why not."""
    if broker_id is None:
        return "" if role.admin else f"{role} may not make the administrator's calls"
    if role.admin or role.broker_id not in (None, broker_id):
        return f"{role} may not act for broker {broker_id}"
    return ""


def may_call_broker(role: Role, broker_id: int) -> str:
    """ "" when a caller with `role` may call broker `broker_id`'s control endpoints (the
    controller's pushes, that broker's own drain), else why not."""
    if role.admin or role.broker_id in (None, broker_id):
        return ""
    return f"{role} may not call broker {broker_id}"


ServerCheck = Callable[[Role], str]  # the server's role -> why it is not the one expected


def server_is_admin(role: Role) -> str:
    """What a broker and the CLI expect of the server: the controller (an administrator)."""
    return "" if role.admin else f"the server's {role} is not the controller's"


def server_is_broker(role: Role) -> str:
    """What the controller expects of a broker's control endpoint: a broker's certificate."""
    return "" if not role.admin else f"the server's {role} is not a broker's"


def _checked(peercert: dict[str, Any] | None, check: ServerCheck) -> None:
    role, why = role_of(peercert)
    if role is not None:
        why = check(role)
    if why:
        raise ssl.SSLCertVerificationError(f"control-plane TLS: {why}")


def expect_server(ctx: ssl.SSLContext, check: ServerCheck) -> ssl.SSLContext:
    """`ctx` with the server's role checked by `check` at the end of every handshake: a server
    whose certificate (of the cluster CA) names another role fails it."""

    class CheckedObject(ssl.SSLObject):  # asyncio's and aiohttp's connections
        def do_handshake(self) -> None:
            super().do_handshake()
            _checked(self.getpeercert(), check)

    class CheckedSocket(ssl.SSLSocket):  # blocking sockets: http.client, urllib
        def do_handshake(self, block: bool = False) -> None:
            super().do_handshake(block)
            _checked(self.getpeercert(), check)

    ctx.sslobject_class = CheckedObject
    ctx.sslsocket_class = CheckedSocket
    return ctx


def peercert_of(transport: Any) -> dict[str, Any] | None:
    """The verified peer certificate of an asyncio transport (None: none, or not TLS)."""
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    return cert or None


@dataclass(frozen=True, slots=True)
class ControlTls:
    """A process's control-plane TLS files: its certificate chain, its key, the cluster CA and,
    optionally, the cluster CA's certificate revocation list (PEM): a peer certificate it revokes
    fails the handshake, on either side."""

    cert_file: str
    key_file: str
    ca_file: str
    crl_file: str = ""

    @classmethod
    def from_files(
        cls, cert_file: str = "", key_file: str = "", ca_file: str = "", crl_file: str = ""
    ) -> ControlTls | None:
        """The setting, or None when none of the files is given (control plane without TLS);
        raises ControlTlsError when only some of the three are, or a CRL without them."""
        given = {"cert": cert_file, "key": key_file, "ca": ca_file}
        if not any(given.values()):
            if crl_file:
                raise ControlTlsError(
                    "--control-tls-crl-file is given but control-plane TLS is not (its "
                    "certificate, key and CA files)"
                )
            return None
        missing = [k for k, v in given.items() if not v]
        if missing:
            raise ControlTlsError(
                "control-plane TLS needs its certificate, key and CA files: "
                + ", ".join(f"--control-tls-{k}-file" for k in missing)
                + " not given"
            )
        tls = cls(cert_file, key_file, ca_file, crl_file)
        tls.client_context()  # the files are read now: a bad one stops the process at start
        return tls

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ControlTls | None:
        env = os.environ if env is None else env
        return cls.from_files(
            env.get(ENV_CERT_FILE, ""),
            env.get(ENV_KEY_FILE, ""),
            env.get(ENV_CA_FILE, ""),
            env.get(ENV_CRL_FILE, ""),
        )

    def _load(self, ctx: ssl.SSLContext) -> ssl.SSLContext:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ControlTlsError(
                f"control-plane TLS: cannot load the certificate {self.cert_file} and key "
                f"{self.key_file}: {exc}"
            ) from exc
        try:
            ctx.load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ControlTlsError(
                f"control-plane TLS: cannot load the CA certificate {self.ca_file}: {exc}"
            ) from exc
        if self.crl_file:  # the Kafka listeners' ssl.crl.location loads by the same code
            try:
                check_revocation(ctx, self.crl_file, "--control-tls-crl-file")
            except RevocationListError as exc:
                raise ControlTlsError(f"control-plane TLS: {exc}") from exc
        return ctx

    def _server(self) -> ssl.SSLContext:
        ctx = self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def _client(self, server: ServerCheck | None) -> ssl.SSLContext:
        ctx = self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        return expect_server(ctx, server) if server is not None else ctx

    def _following(self, protocol: int, build: Callable[[], ssl.SSLContext]) -> FollowingContext:
        return FollowingContext(
            protocol,
            "control-plane TLS",
            (self.cert_file, self.key_file, self.ca_file, self.crl_file),
            build,
            certificate_file=self.cert_file,
            look_every_s=RELOAD_CHECK_INTERVAL_S,
        )

    def server_context(self) -> FollowingContext:
        """A server's context: asks for a client certificate, which must verify against the
        cluster CA when given; the middleware requires one on every control path. Follows the
        files (FollowingContext)."""
        return self._following(ssl.PROTOCOL_TLS_SERVER, self._server)

    def client_context(self, server: ServerCheck | None = None) -> FollowingContext:
        """A client's context: presents this process's certificate, verifies the server's chain
        against the cluster CA and, with `server`, the role its certificate names (not its host
        name: see the module's docstring). Follows the files (FollowingContext)."""
        return self._following(ssl.PROTOCOL_TLS_CLIENT, lambda: self._client(server))

    def env(self) -> dict[str, str]:
        """The environment that hands this setting to a child process (the CRL's variable set
        empty when there is none, so that the parent's own does not leak through)."""
        return {
            ENV_CERT_FILE: self.cert_file,
            ENV_KEY_FILE: self.key_file,
            ENV_CA_FILE: self.ca_file,
            ENV_CRL_FILE: self.crl_file,
        }


def scheme(tls: ControlTls | None) -> str:
    return "https" if tls is not None else "http"
