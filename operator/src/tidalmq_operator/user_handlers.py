"""Kopf handlers for User resources (users.py has the pure part): credentials and ACLs through
the controller the operator hosts, the same path the Topic handlers take (the controller's
AlterUserScramCredentials, CreateAcls and DeleteAcls, which validate and commit them to the
cluster metadata the brokers authenticate and authorize against).

- create / resume / spec update: the SCRAM credential (or, for tls, a client certificate signed
  by the clients CA) and the User's Secret; then the ACL diff. Each step looks before it writes
  (a credential whose stored key the password already gives, a certificate still good, a Secret
  with the same data, bindings already there are left alone), so a resume writes nothing.
  Ready=True when all is in place; Ready=False with a reason (InvalidSpec, PasswordSecretMissing,
  CredentialRefused, AclRefused) and a Warning Event when not, retried while it may heal.
- every 5 minutes (a timer): the same reconcile, so what changed outside the spec (bindings
  added with kafka-acls, a rotated password Secret, a certificate coming due, a deleted Secret)
  is put right.
- delete (finalizer): a tls User's certificates are revoked (the clients CA's CRL, below) before
  anything else, so that the finalizer is not removed before the CRL says so; then the user's
  SCRAM credentials and every ACL binding of its principal go, then its Secret (also owned by
  the User, so the garbage collector would take it too).
- the clients CA's CRL (with TIDALMQ_CLIENTS_CRL_SECRET; clients_crl.py has the pure part): a
  certificate issued is recorded there, the one it replaces revoked, a deleted User's revoked;
  a daemon on the ClusterState (the active replica only) makes the Secret at start, empty, and
  signs the CRL again every day (it is valid 7), looking every CRL_CHECK_S. Every write of the
  operator's own Secrets is a compare-and-swap on resourceVersion (another replica may write
  them too): the CRL Secret patched naming the version read and re-merged on Conflict
  (_update_crl), the clients CA and the CRL Secret created only if absent, a User's Secret
  patched naming the version read.

Registered by importing this module from `handlers.py`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
import random
import secrets
from collections.abc import Callable
from typing import Any

import kopf
from tidalmq_controller import ScramDeletion, ScramUpsertion
from tidalmq_core import scram
from tidalmq_core.acls import AclBinding

from tidalmq_operator import clients_crl, users
from tidalmq_operator.kube import Conflict, NotFound
from tidalmq_operator.models import SpecError
from tidalmq_operator.runtime import (
    ControllerInactive,
    OperatorRuntime,
    condition,
    merge_conditions,
)
from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)

PLURAL = "users"
RETRY_S = 2.0
RETRY_REFUSED_S = 15.0
RESYNC_S = 300.0
CRL_CHECK_S = 300.0
# compare-and-swap writes of the CRL Secret before giving up (_update_crl)
CRL_WRITE_ATTEMPTS = 5


class UserNotReady(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _runtime(memo: Any) -> OperatorRuntime:
    runtime: OperatorRuntime = memo["runtime"]
    return runtime


def _ref(name: str, uid: str | None) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "User",
        "metadata": {"name": name, "uid": uid},
    }


async def _set_status(
    rt: OperatorRuntime,
    name: str,
    gen: int | None,
    ready: bool,
    reason: str,
    message: str,
    current: Any = None,
    **fields: Any,
) -> None:
    """Patch the User's status; nothing when `current` (the status read with the resource)
    says the same already. lastTransitionTime moves only when Ready's status does."""
    new = condition("Ready", ready, reason, message, gen)
    old = list((current or {}).get("conditions") or [])
    status = {"observedGeneration": gen, "conditions": merge_conditions(old, [new]), **fields}
    if current and {k: current.get(k) for k in status} == status:
        return
    try:
        await rt.kube.patch_status(PLURAL, name, status)
    except NotFound:
        pass


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile_user(
    spec: Any, name: str, meta: Any, memo: Any, status: Any = None, **_: Any
) -> None:
    await _reconcile_user(spec, name, meta, memo, status)


async def _reconcile_user(spec: Any, name: str, meta: Any, memo: Any, status: Any) -> None:
    """The User's reconcile (the handlers above and the periodic resync below run it; Kopf's
    decorators type the handler as Kopf's callback, which the resync cannot call by type)."""
    rt = _runtime(memo)
    gen, uid = meta.get("generation"), meta.get("uid")
    ref = _ref(name, uid)
    try:
        user, desired = users.parse_user(name, dict(spec))
    except SpecError as exc:
        await _set_status(rt, name, gen, False, "InvalidSpec", str(exc), status)
        await rt.kube.event(ref, "InvalidSpec", str(exc), warning=True)
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    try:
        controller = rt.require_controller()
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
    async with rt.resource_lock(f"user/{name}"):
        try:
            changed = await _reconcile_credentials(rt, controller, name, uid, user)
            diff = await _reconcile_acls(controller, name, desired)
        except UserNotReady as exc:
            await _set_status(rt, name, gen, False, exc.reason, str(exc), status, secret=name)
            await rt.kube.event(ref, exc.reason, str(exc), warning=True)
            raise kopf.TemporaryError(f"{exc.reason}: {exc}", delay=RETRY_REFUSED_S) from exc
    how = user.mechanism or "TLS client certificate"
    message = f"{how} credentials in Secret {name}; {len(desired)} ACL bindings"
    await _set_status(
        rt,
        name,
        gen,
        True,
        "Ready",
        message,
        status,
        secret=name,
        username=name,
        principal=users.principal_of(name),
    )
    if changed:
        await rt.kube.event(ref, "CredentialsWritten", f"{how} credentials in Secret {name}")
    if not diff.empty:
        await rt.kube.event(
            ref, "AclsUpdated", f"{len(diff.create)} ACL bindings added, {len(diff.delete)} removed"
        )


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_S, initial_delay=RESYNC_S)
async def resync_user(
    spec: Any, name: str, meta: Any, memo: Any, status: Any = None, **_: Any
) -> None:
    """Level-based repair of drift, every RESYNC_S: bindings of the principal added or removed
    with kafka-acls, a password changed in the Secret spec.authentication.password names, a
    certificate coming due, the User's Secret deleted by hand. The same reconcile, which writes
    only what differs; a spec that does not parse, or a controller not active on this replica,
    is left to the handlers (which reported it)."""
    try:
        users.parse_user(name, dict(spec))
    except SpecError:
        return
    if _runtime(memo).controller is None:
        return
    try:
        await _reconcile_user(spec, name, meta, memo, status)
    except kopf.TemporaryError:
        pass  # in the status and an Event already; the next pass tries again


# ---------------------------------------------------------------------------- credentials
async def _read_secret(rt: OperatorRuntime, name: str) -> dict[str, Any] | None:
    try:
        return await rt.kube.get_secret(name)
    except NotFound:
        return None


def _owned_by(secret: dict[str, Any], uid: str | None) -> bool:
    refs = (secret.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


async def _write_secret(
    rt: OperatorRuntime,
    name: str,
    uid: str | None,
    existing: dict[str, Any] | None,
    data: dict[str, str],
) -> bool:
    """Create or update the User's Secret; False when it already holds exactly `data`."""
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "User", "name": name, "uid": uid}
    body = users.secret_body(name, rt.kube.namespace, owner, data)
    changed_meanwhile = UserNotReady(
        "SecretConflict",
        f"Secret {name} changed while the operator wrote it (another writer): read again",
    )
    if existing is None:
        try:  # create-if-absent: whoever made it first, the next reconcile reads theirs
            await rt.kube.create_secret(body)
        except Conflict as exc:
            raise changed_meanwhile from exc
        return True
    if not _owned_by(existing, uid):
        raise UserNotReady(
            "SecretExists",
            f"Secret {name} exists and does not belong to this User: delete or rename it",
        )
    if users.decoded(existing.get("data")) == data:
        return False
    # a strategic merge patch: keys of another authentication type are removed (null); it
    # names the resourceVersion read, so a write made since (another replica issuing its own
    # certificate) is not overwritten with what was decided from the older one
    stale = {k: None for k in (existing.get("data") or {}) if k not in data}
    version = (existing.get("metadata") or {}).get("resourceVersion")
    precondition = {"resourceVersion": version} if version else {}
    try:
        await rt.kube.patch_secret(
            name,
            {
                "data": {**body["data"], **stale},
                "metadata": {"labels": body["metadata"]["labels"], **precondition},
            },
        )
    except Conflict as exc:
        raise changed_meanwhile from exc
    return True


async def _password(rt: OperatorRuntime, user: users.UserSpec, existing: dict[str, str]) -> str:
    ref = user.password_ref()
    if ref is None:
        return existing.get("password") or users.new_password()
    secret = await _read_secret(rt, ref.name)
    data = users.decoded((secret or {}).get("data"))
    if ref.key not in data or not data[ref.key]:
        raise UserNotReady(
            "PasswordSecretMissing",
            f"spec.authentication.password: Secret {ref.name} has no key {ref.key!r}",
        )
    return data[ref.key]


async def _alter_scram(
    controller: Any, deletions: list[ScramDeletion], upsertions: list[ScramUpsertion]
) -> None:
    if not deletions and not upsertions:
        return
    results, _ = await controller.alter_scram_credentials(deletions, upsertions)
    refused = [r for r in results if r.error_code]
    if refused:
        raise UserNotReady(
            "CredentialRefused", "; ".join(f"{r.user}: {r.error_message}" for r in refused)
        )


async def _reconcile_credentials(
    rt: OperatorRuntime, controller: Any, name: str, uid: str | None, user: users.UserSpec
) -> bool:
    """The user's credential in the cluster and its Secret; True when anything was written."""
    secret = await _read_secret(rt, name)
    if secret is not None and not _owned_by(secret, uid):
        raise UserNotReady(
            "SecretExists",
            f"Secret {name} exists and does not belong to this User: delete or rename it",
        )
    existing = users.decoded((secret or {}).get("data"))
    stored = dict(controller.metadata.scram_credentials.get(name, {}))
    mech_name = user.mechanism
    deletions = [ScramDeletion(name, scram.mechanism(m).type) for m in stored if m != mech_name]
    upsertions: list[ScramUpsertion] = []
    if mech_name is not None:
        # a tls User now SCRAM: its certificate would still be User:<name>, so it is revoked
        # (the one its Secret holds and the one recorded, should the Secret be gone)
        await _revoke_certificates(rt, name, existing)
        mech = scram.mechanism(mech_name)
        password = await _password(rt, user, existing)
        credential = stored.get(mech_name)
        if credential is None or not await asyncio.to_thread(
            scram.password_matches, mech, credential, password
        ):
            salt = secrets.token_bytes(32)
            salted = await asyncio.to_thread(
                scram.hi, password.encode(), salt, scram.DEFAULT_ITERATIONS, mech.hash
            )
            upsertions.append(
                ScramUpsertion(name, mech.type, scram.DEFAULT_ITERATIONS, salt, salted)
            )
        data = users.scram_secret_data(name, mech_name, password)
    else:
        ca = await _clients_ca(rt)
        held = existing.get("user.crt", "")
        current = _held_ref(held, ca)
        if (
            users.cert_still_good(held, ca.cert_pem, name)
            and current is not None
            and await _keep_certificate(rt, ca, name, current)
        ):
            pair = users.KeyPair(existing["user.key"].encode(), held.encode())
        else:
            pair = await asyncio.to_thread(users.issue_client_cert, ca, name)
            new = clients_crl.cert_ref(pair.cert_pem.decode())
            assert new is not None
            # only coming due (CN=<name>, this CA's, not expired): the old one gets a grace
            renewal = users.coming_due(held, ca.cert_pem, name)
            # recorded (and the replaced one revoked) before the Secret is written: a crash
            # between leaves a certificate nobody holds, revoked at the next issue
            await _update_crl(
                rt,
                ca,
                lambda s, now: clients_crl.record_issued(s, name, new, current, renewal, now),
            )
        data = users.tls_secret_data(name, pair.key_pem, pair.cert_pem, ca.cert_pem)
    # one alteration per user and request (Kafka's rule): the new credential first, then the
    # other mechanism's goes, so a switch never leaves the user without one
    await _alter_scram(controller, [], upsertions)
    for deletion in deletions:
        await _alter_scram(controller, [deletion], [])
    wrote = await _write_secret(rt, name, uid, secret, data)
    return wrote or bool(deletions or upsertions)


async def _keep_certificate(
    rt: OperatorRuntime, ca: users.KeyPair, name: str, held: clients_crl.CertRef
) -> bool:
    """Record the certificate the User's Secret holds (still good) as the one issued; False
    when the CRL's bookkeeping has it revoked already, so that a new one is issued: another
    replica issued its own meanwhile and revoked this one as never delivered, but this
    replica's Secret write came first (a User left with a listed certificate otherwise)."""
    revoked: list[bool] = []  # what the last reading of the bookkeeping said

    def keep(state: clients_crl.CrlState, now: datetime.datetime) -> bool:
        revoked[:] = [held.serial in state.revoked]
        return not revoked[0] and clients_crl.record_issued(state, name, held, None, False, now)

    await _update_crl(rt, ca, keep)
    return not any(revoked)


async def _clients_ca(rt: OperatorRuntime) -> users.KeyPair:
    """The clients CA from its Secret (tls.crt, tls.key), generated when there is none."""
    name = rt.settings.clients_ca_secret
    for _ in range(3):
        secret = await _read_secret(rt, name)
        if secret is not None:
            data = users.decoded(secret.get("data"))
            if "tls.crt" not in data or "tls.key" not in data:
                raise UserNotReady("ClientsCaInvalid", f"Secret {name} needs tls.crt and tls.key")
            return users.KeyPair(data["tls.key"].encode(), data["tls.crt"].encode())
        ca = await asyncio.to_thread(users.new_clients_ca)
        data = {
            "tls.crt": base64.b64encode(ca.cert_pem).decode(),
            "tls.key": base64.b64encode(ca.key_pem).decode(),
            "ca.crt": base64.b64encode(ca.cert_pem).decode(),
        }
        body = users.operator_secret_body(name, rt.kube.namespace, data, "kubernetes.io/tls")
        try:
            await rt.kube.create_secret(body)
            log.info("generated the clients CA in Secret %s", name)
            return ca
        except Conflict:
            continue  # another reconcile made one first: use that
    raise UserNotReady("ClientsCaInvalid", f"Secret {name}: could not read or create it")


# ---------------------------------------------------------------------------- the CRL
CrlChange = Callable[[clients_crl.CrlState, datetime.datetime], bool]


async def _update_crl(rt: OperatorRuntime, ca: users.KeyPair, change: CrlChange) -> None:
    """Apply `change` to the CRL's bookkeeping and sign the CRL again when anything changed or
    it is due (clients_crl.refresh_due); nothing without TIDALMQ_CLIENTS_CRL_SECRET.

    Every write is a compare-and-swap on the Secret's resourceVersion (the lock below orders
    this replica's writers only; another replica, during a rollout or a peering handover,
    writes the same Secret): a patch naming the version read, which the API server applies to
    that version only, or a create if absent. On Conflict (another writer came first) it is
    read again and `change` applied to what that writer left, so its revocations and ours
    both stay (the revoked set only grows, but for entries past their notAfter); after
    CRL_WRITE_ATTEMPTS conflicts in a row UserNotReady (ClientsCrlConflict) says so, and the
    caller retries: a finalizer stays."""
    name = rt.settings.clients_crl_secret
    if not name:
        return
    async with rt.resource_lock("clients-crl"):
        for attempt in range(1, CRL_WRITE_ATTEMPTS + 1):
            secret = await _read_secret(rt, name)
            data = users.decoded((secret or {}).get("data"))
            state = clients_crl.loads(data.get(clients_crl.STATE_KEY, ""), ca.cert_pem)
            now = datetime.datetime.now(datetime.UTC)
            changed = change(state, now)
            changed = clients_crl.drop_expired(state, now) or changed
            crl_pem = data.get(clients_crl.CRL_KEY, "").encode()
            if not changed and not clients_crl.refresh_due(state, crl_pem, ca.cert_pem, now):
                return
            crl = await asyncio.to_thread(clients_crl.sign_crl, state, ca.cert_pem, ca.key_pem, now)
            new_data = {
                clients_crl.CRL_KEY: base64.b64encode(crl).decode(),
                clients_crl.STATE_KEY: base64.b64encode(clients_crl.dumps(state).encode()).decode(),
            }
            try:
                if secret is None:  # create-if-absent: 409 AlreadyExists when another made it
                    await rt.kube.create_secret(
                        users.operator_secret_body(name, rt.kube.namespace, new_data)
                    )
                else:  # the data keys set, naming the version read: 409 if it moved since
                    version = (secret.get("metadata") or {}).get("resourceVersion")
                    await rt.kube.patch_secret(
                        name, {"metadata": {"resourceVersion": version}, "data": new_data}
                    )
                break
            except Conflict:
                log.info(
                    "Secret %s changed since it was read (another writer): read again, "
                    "attempt %d of %d",
                    name,
                    attempt,
                    CRL_WRITE_ATTEMPTS,
                )
                if attempt < CRL_WRITE_ATTEMPTS:  # writers that collided: apart next time
                    await asyncio.sleep(random.uniform(0.05, 0.2) * attempt)
        else:
            raise UserNotReady(
                "ClientsCrlConflict",
                f"Secret {name} changed under each of {CRL_WRITE_ATTEMPTS} writes (another "
                "operator replica writing it?): the CRL is not updated yet, retried",
            )
    log.info(
        "clients CA's CRL in Secret %s signed: %d certificates listed",
        name,
        len(clients_crl.listed(state, now)),
    )


async def _revoke_certificates(rt: OperatorRuntime, name: str, existing: dict[str, str]) -> None:
    """Revoke a User's certificates at once: the one recorded as issued, the one its Secret
    (`existing`, decoded) holds if the clients CA issued it."""
    if not rt.settings.clients_crl_secret:
        return
    ca = await _clients_ca(rt)
    current = _held_ref(existing.get("user.crt", ""), ca)
    await _update_crl(rt, ca, lambda s, now: clients_crl.revoke_user(s, name, current, now))


def _held_ref(held: str, ca: users.KeyPair) -> clients_crl.CertRef | None:
    """The certificate a User's Secret holds (PEM, "" for none), if this CA issued it: another
    CA's is not trusted, and not this CRL's to list."""
    return clients_crl.cert_ref(held) if users.issued_by(held, ca.cert_pem) else None


@kopf.daemon(
    GROUP,
    VERSION,
    "clusterstates",
    cancellation_timeout=10.0,
    when=lambda name, memo, **_: (
        name == _runtime(memo).settings.cluster_state_name
        and bool(_runtime(memo).settings.clients_crl_secret)
    ),
)
async def clients_crl_daemon(stopped: Any, memo: Any, **_: Any) -> None:
    """The CRL Secret from the start (an empty CRL: brokers refuse the clients of a CA the CRL
    file has no CRL of, and wait for the Secret to mount it), signed again before it expires
    (every REFRESH_AFTER; valid CRL_DAYS) and when a grace ends or an entry expires. Kopf runs
    it on the active replica only, as the controller."""
    rt = _runtime(memo)
    while not stopped:
        try:
            ca = await _clients_ca(rt)
            await _update_crl(rt, ca, lambda s, now: False)
            delay = CRL_CHECK_S
        except UserNotReady as exc:  # a CA Secret without its key, a CRL Secret contended
            log.error("clients CA's CRL not maintained: %s", exc)
            involved = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ClusterState",
                "metadata": {"name": rt.settings.cluster_state_name},
            }
            await rt.kube.event(involved, exc.reason, str(exc), warning=True)
            delay = RETRY_REFUSED_S
        except Exception as exc:  # the API server: said, retried
            log.error("clients CA's CRL not maintained: %s", exc)
            delay = RETRY_REFUSED_S
        await stopped.wait(delay)


# ---------------------------------------------------------------------------- ACLs
async def _reconcile_acls(controller: Any, name: str, desired: list[AclBinding]) -> users.AclDiff:
    current = users.bindings_of_principal(controller.metadata.acls, users.principal_of(name))
    diff = users.acl_diff(desired, current)
    if diff.delete:
        results, _ = await controller.delete_acls([users.exact_filter(b) for b in diff.delete])
        refused = [r.error_message for r in results if r.error_code]
        if refused:
            raise UserNotReady("AclRefused", "; ".join(str(m) for m in refused))
    if diff.create:
        created, _ = await controller.create_acls(diff.create)
        refused = [
            f"{b}: {r.error_message}"
            for b, r in zip(diff.create, created, strict=True)
            if r.error_code
        ]
        if refused:
            raise UserNotReady("AclRefused", "; ".join(refused))
    return diff


# ---------------------------------------------------------------------------- delete
@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete_user(name: str, meta: Any, memo: Any, **_: Any) -> None:
    """The finalizer: the credentials and ACLs of the principal go, then the Secret."""
    rt = _runtime(memo)
    try:
        controller = rt.require_controller()
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
    async with rt.resource_lock(f"user/{name}"):
        secret = await _read_secret(rt, name)
        mine = secret is not None and _owned_by(secret, meta.get("uid"))
        try:  # first: the finalizer stays until the CRL lists the certificates
            await _revoke_certificates(
                rt, name, users.decoded((secret or {}).get("data")) if mine else {}
            )
        except (UserNotReady, NotFound, Conflict) as exc:
            raise kopf.TemporaryError(f"CRL not updated: {exc}", delay=RETRY_S) from exc
        stored = list(controller.metadata.scram_credentials.get(name, {}))
        try:
            for m in stored:  # one alteration per user and request
                await _alter_scram(controller, [ScramDeletion(name, scram.mechanism(m).type)], [])
        except UserNotReady as exc:
            raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
        principal = users.principal_of(name)
        if users.bindings_of_principal(controller.metadata.acls, principal):
            await controller.delete_acls([users.principal_filter(principal)])
        if mine:
            try:
                await rt.kube.delete_secret(name)
            except NotFound:
                pass
    log.info("User %s: credentials, ACLs and Secret removed", name)
