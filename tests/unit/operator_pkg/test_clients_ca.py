"""The operator's clients CA is built by tidalmq_core.certs (the one CA builder) and still signs
the tls Users' certificates the operator keeps."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.x509.oid import NameOID
from tidalmq_operator import users


def test_the_clients_ca_is_a_ca_that_signs_user_certificates() -> None:
    ca = users.new_clients_ca("clients CA")
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    assert cert.subject == cert.issuer
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [
        "clients CA"
    ]
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    lifetime = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert (
        datetime.timedelta(days=users.CA_DAYS - 1)
        < lifetime
        <= datetime.timedelta(days=users.CA_DAYS)
    )
    alice = users.issue_client_cert(ca, "alice")
    x509.load_pem_x509_certificate(alice.cert_pem).verify_directly_issued_by(cert)
    assert users.cert_still_good(alice.cert_pem.decode(), ca.cert_pem, "alice")
    assert not users.cert_still_good(alice.cert_pem.decode(), ca.cert_pem, "bob")
