"""The clients CA's CRL kept by the operator (clients_crl.py, the pure part): what a revocation,
a reissue, an expiry and the passing of time do to the bookkeeping, when the CRL is signed
again, that the bookkeeping reads back from the Secret, and that the signed CRL is one OpenSSL
takes: the broker's own TLS context refuses a revoked User's certificate and accepts the
others."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from tidalmq_broker.security import certs
from tidalmq_broker.security.tls import TlsSettings, server_context
from tidalmq_operator import clients_crl, users
from tidalmq_operator.clients_crl import CertRef, CrlState

NOW = datetime.datetime(2026, 11, 27, 12, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)


def ref(serial: int, days_left: float = 300) -> CertRef:
    return CertRef(serial, NOW + days_left * DAY)


def serials(state: CrlState, at: datetime.datetime = NOW) -> list[int]:
    return [r.serial for r in clients_crl.listed(state, at)]


@pytest.fixture(scope="module")
def ca() -> users.KeyPair:
    return users.new_clients_ca("CRL test clients CA")


def test_a_deleted_user_is_listed_at_once_and_forgotten_as_issued() -> None:
    state = CrlState()
    assert clients_crl.record_issued(state, "alice", ref(1), None, False, NOW)
    assert not clients_crl.record_issued(state, "alice", ref(1), None, False, NOW)  # known
    assert serials(state) == []
    assert clients_crl.revoke_user(state, "alice", ref(1), NOW)
    assert serials(state) == [1] and "alice" not in state.issued
    # again (a finalizer retried): nothing changes
    assert not clients_crl.revoke_user(state, "alice", ref(1), NOW)
    # the Secret gone before the finalizer ran: the recorded certificate is revoked all the same
    clients_crl.record_issued(state, "bob", ref(2), None, False, NOW)
    assert clients_crl.revoke_user(state, "bob", None, NOW)
    assert serials(state) == [1, 2]


def test_a_replaced_certificate_is_revoked_a_routine_renewal_after_a_grace() -> None:
    state = CrlState()
    clients_crl.record_issued(state, "alice", ref(1, days_left=20), None, False, NOW)
    # coming due: the old one stays valid RENEWAL_GRACE, time for clients to take the new one
    assert clients_crl.record_issued(state, "alice", ref(2), ref(1, 20), True, NOW)
    assert state.issued["alice"] == ref(2)
    assert serials(state) == []
    assert serials(state, NOW + clients_crl.RENEWAL_GRACE) == [1]
    # its Secret edited or lost: the certificate it held, and the one recorded, at once
    clients_crl.record_issued(state, "bob", ref(3), None, False, NOW)
    assert clients_crl.record_issued(state, "bob", ref(5), ref(4), False, NOW)
    assert serials(state) == [3, 4]
    # a renewal never delays a revocation already in force
    clients_crl.revoke(state, ref(6), "carol", NOW, NOW)
    assert not clients_crl.revoke(state, ref(6), "carol", NOW + DAY, NOW)
    assert serials(state) == [3, 4, 6]


def test_expired_certificates_are_dropped_so_the_list_stays_bounded() -> None:
    state = CrlState()
    clients_crl.revoke(state, ref(1, days_left=2), "alice", NOW, NOW)
    clients_crl.revoke(state, ref(2, days_left=200), "bob", NOW, NOW)
    clients_crl.record_issued(state, "carol", ref(3, days_left=1), None, False, NOW)
    assert not clients_crl.revoke(state, ref(4, days_left=-1), "dave", NOW, NOW)  # expired
    assert not clients_crl.drop_expired(state, NOW)
    later = NOW + 3 * DAY
    assert serials(state, later) == [2]  # not listed once expired, even before it is dropped
    assert clients_crl.drop_expired(state, later)
    assert list(state.revoked) == [2] and state.issued == {}


def test_the_bookkeeping_reads_back_and_a_new_ca_starts_afresh(ca: users.KeyPair) -> None:
    state = clients_crl.loads("", ca.cert_pem)
    assert state.ca == clients_crl.ca_fingerprint(ca.cert_pem) and not state.revoked
    clients_crl.record_issued(state, "alice", ref(2**150 + 7), None, False, NOW)
    clients_crl.record_issued(state, "alice", ref(9), ref(2**150 + 7), True, NOW)
    clients_crl.revoke_user(state, "bob", ref(5), NOW)
    state.number = 12
    back = clients_crl.loads(clients_crl.dumps(state), ca.cert_pem)
    assert back == state
    other = users.new_clients_ca("another CA")
    assert clients_crl.loads(clients_crl.dumps(state), other.cert_pem) == CrlState(
        ca=clients_crl.ca_fingerprint(other.cert_pem)
    )
    assert clients_crl.loads("{not json", ca.cert_pem) == CrlState(ca=state.ca)


def test_when_the_crl_is_signed_again(ca: users.KeyPair) -> None:
    state = CrlState()
    assert clients_crl.refresh_due(state, b"", ca.cert_pem, NOW)  # none yet: an empty one
    pem = clients_crl.sign_crl(state, ca.cert_pem, ca.key_pem, NOW)
    crl = x509.load_pem_x509_crl(pem)
    assert len(crl) == 0 and state.number == 1
    assert crl.next_update_utc - NOW == clients_crl.CRL_DAYS * DAY
    assert crl.last_update_utc < NOW  # backdated: a broker's clock a little behind accepts it
    assert crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number == 1
    assert not clients_crl.refresh_due(state, pem, ca.cert_pem, NOW + DAY / 2)
    # daily, well before its nextUpdate
    assert clients_crl.refresh_due(state, pem, ca.cert_pem, NOW + clients_crl.REFRESH_AFTER)
    # what it lists changed: a revocation, or a renewal's grace over
    clients_crl.record_issued(state, "alice", ref(1, 20), None, False, NOW)
    clients_crl.record_issued(state, "alice", ref(2), ref(1, 20), True, NOW)
    assert not clients_crl.refresh_due(state, pem, ca.cert_pem, NOW + DAY / 2)
    assert clients_crl.refresh_due(state, pem, ca.cert_pem, NOW + clients_crl.RENEWAL_GRACE)
    clients_crl.revoke(state, ref(3), "bob", NOW, NOW)
    assert clients_crl.refresh_due(state, pem, ca.cert_pem, NOW)
    pem = clients_crl.sign_crl(state, ca.cert_pem, ca.key_pem, NOW)
    assert clients_crl.crl_serials(pem, ca.cert_pem) is not None
    assert clients_crl.crl_serials(pem, ca.cert_pem)[1] == {3}  # type: ignore[index]
    assert not clients_crl.refresh_due(state, pem, ca.cert_pem, NOW)
    # another CA's CRL (the clients CA replaced) or garbage: signed anew
    other = users.new_clients_ca("another CA")
    assert clients_crl.crl_serials(pem, other.cert_pem) is None
    assert clients_crl.refresh_due(state, pem, other.cert_pem, NOW)
    assert clients_crl.refresh_due(state, b"junk", ca.cert_pem, NOW)


# ---------------------------------------------------------------------------- OpenSSL's view
def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> bool:
    """A TLS handshake in memory; True when both ends complete it and the server keeps it."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname="broker")
    done = {"s": False, "c": False}
    for _ in range(20):
        for side, obj in (("c", cli), ("s", srv)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    return False
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    # TLS 1.3: the client finishes before the server has checked its certificate
    try:
        cli.write(b"ping")
        s_in.write(c_out.read())
        return srv.read(4) == b"ping"
    except ssl.SSLError:
        return False


def test_the_broker_refuses_a_revoked_users_certificate(ca: users.KeyPair, tmp_path: Path) -> None:
    server_ca = certs.new_ca("server CA")
    certs.write_keystore(
        tmp_path / "broker.pem", certs.issue(server_ca, "broker", hosts=["broker"]), server_ca
    )
    (tmp_path / "clients-ca.pem").write_bytes(ca.cert_pem)
    alice, bob = users.issue_client_cert(ca, "alice"), users.issue_client_cert(ca, "bob")
    now = datetime.datetime.now(datetime.UTC)
    state = CrlState()
    for name, pair in (("alice", alice), ("bob", bob)):
        clients_crl.record_issued(
            state,
            name,
            clients_crl.cert_ref(pair.cert_pem.decode()),
            None,
            False,
            now,  # type: ignore[arg-type]
        )

    def connects(pair: users.KeyPair) -> bool:
        crl = tmp_path / "crl.pem"
        crl.write_bytes(clients_crl.sign_crl(state, ca.cert_pem, ca.key_pem, now))
        server = server_context(
            TlsSettings(
                keystore_location=str(tmp_path / "broker.pem"),
                truststore_location=str(tmp_path / "clients-ca.pem"),
                client_auth="required",
                crl_location=str(crl),
            )
        )
        (tmp_path / "me.crt").write_bytes(pair.cert_pem)
        (tmp_path / "me.key").write_bytes(pair.key_pem)
        client = ssl.create_default_context(cadata=server_ca.cert_pem().decode())
        client.load_cert_chain(str(tmp_path / "me.crt"), str(tmp_path / "me.key"))
        return _handshake(server, client)

    # the empty CRL the operator makes at its start lets every User's certificate in
    assert connects(alice) and connects(bob)
    clients_crl.revoke_user(state, "alice", None, now)
    assert not connects(alice)
    assert connects(bob)
