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
- delete (finalizer): the user's SCRAM credentials and every ACL binding of its principal go,
  then its Secret (also owned by the User, so the garbage collector would take it too).

Registered by importing this module from `handlers.py`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from typing import Any

import kopf
from tidalmq_controller import ScramDeletion, ScramUpsertion
from tidalmq_core import scram
from tidalmq_core.acls import AclBinding

from tidalmq_operator import users
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
    if existing is None:
        await rt.kube.create_secret(body)
        return True
    if not _owned_by(existing, uid):
        raise UserNotReady(
            "SecretExists",
            f"Secret {name} exists and does not belong to this User: delete or rename it",
        )
    if users.decoded(existing.get("data")) == data:
        return False
    # a strategic merge patch: keys of another authentication type are removed (null)
    stale = {k: None for k in (existing.get("data") or {}) if k not in data}
    await rt.kube.patch_secret(
        name,
        {"data": {**body["data"], **stale}, "metadata": {"labels": body["metadata"]["labels"]}},
    )
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
        if users.cert_still_good(existing.get("user.crt", ""), ca.cert_pem, name):
            pair = users.KeyPair(existing["user.key"].encode(), existing["user.crt"].encode())
        else:
            pair = await asyncio.to_thread(users.issue_client_cert, ca, name)
        data = users.tls_secret_data(name, pair.key_pem, pair.cert_pem, ca.cert_pem)
    # one alteration per user and request (Kafka's rule): the new credential first, then the
    # other mechanism's goes, so a switch never leaves the user without one
    await _alter_scram(controller, [], upsertions)
    for deletion in deletions:
        await _alter_scram(controller, [deletion], [])
    wrote = await _write_secret(rt, name, uid, secret, data)
    return wrote or bool(deletions or upsertions)


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
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": name,
                "namespace": rt.kube.namespace,
                "labels": {"app.kubernetes.io/managed-by": "tidalmq-operator"},
            },
            "data": {
                "tls.crt": base64.b64encode(ca.cert_pem).decode(),
                "tls.key": base64.b64encode(ca.key_pem).decode(),
                "ca.crt": base64.b64encode(ca.cert_pem).decode(),
            },
        }
        try:
            await rt.kube.create_secret(body)
            log.info("generated the clients CA in Secret %s", name)
            return ca
        except Conflict:
            continue  # another reconcile made one first: use that
    raise UserNotReady("ClientsCaInvalid", f"Secret {name}: could not read or create it")


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
        stored = list(controller.metadata.scram_credentials.get(name, {}))
        try:
            for m in stored:  # one alteration per user and request
                await _alter_scram(controller, [ScramDeletion(name, scram.mechanism(m).type)], [])
        except UserNotReady as exc:
            raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
        principal = users.principal_of(name)
        if users.bindings_of_principal(controller.metadata.acls, principal):
            await controller.delete_acls([users.principal_filter(principal)])
        secret = await _read_secret(rt, name)
        if secret is not None and _owned_by(secret, meta.get("uid")):
            try:
                await rt.kube.delete_secret(name)
            except NotFound:
                pass
    log.info("User %s: credentials, ACLs and Secret removed", name)
