"""Security of the Kafka listeners: listener configuration, TLS, SASL, principals.

- `listeners`: Kafka's `listeners`, `advertised.listeners` and `listener.security.protocol.map`.
- `tls`: server SSL contexts from PEM files, `ssl.client.auth`, and the principal of a client
  certificate (its subject DN as Java's X500Principal writes it).
- `principal`: Kafka's `ssl.principal.mapping.rules` (SslPrincipalMapper).
- `sasl`: one connection's SASL exchange (SaslHandshake v0/v1, SaslAuthenticate v0-2) with
  PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 against the SCRAM credentials of the cluster metadata.
- `endpoints`: a broker's settings turned into the listener's endpoints.
"""


class SecurityConfigError(ValueError):
    """Listener, TLS or SASL settings that cannot be used: the broker does not start."""
