"""The operator's controller takes the SCRAM bootstrap users from its environment."""

from __future__ import annotations

from tidalmq_controller import parse_bootstrap
from tidalmq_operator.settings import OperatorSettings


def test_scram_bootstrap_from_the_environment() -> None:
    s = OperatorSettings.from_env(
        {
            "TIDALMQ_SCRAM_BOOTSTRAP": "admin:SCRAM-SHA-512:s3cret",
            "TIDALMQ_SCRAM_BOOTSTRAP_FILE": "/etc/tidalmq/users",
        }
    )
    assert s.scram_bootstrap_file == "/etc/tidalmq/users"
    assert "s3cret" not in repr(s)
    users = parse_bootstrap(s.scram_bootstrap)
    assert [(u.user, u.mechanism) for u in users] == [("admin", "SCRAM-SHA-512")]
    assert OperatorSettings.from_env({}).scram_bootstrap == ""
