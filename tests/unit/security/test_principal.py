"""ssl.principal.mapping.rules: the cases of Kafka's own SslPrincipalMapperTest."""

from __future__ import annotations

import pytest
from tidalmq_broker.security.principal import NoMatchingRule, PrincipalMapper, split_rules


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,  RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
    ],
)
def test_valid_rules(rules: str) -> None:
    PrincipalMapper(rules)


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULTS",
        "RULE:",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/LU",
    ],
)
def test_invalid_rules(rules: str) -> None:
    with pytest.raises(ValueError, match="Invalid rule"):
        PrincipalMapper(rules)


def test_rules_in_order_first_that_applies() -> None:
    mapper = PrincipalMapper(
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, "
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L, "
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U, "
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U, "
        "DEFAULT"
    )
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert (
        mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"
    )


def test_rules_splitting_keeps_escaped_slashes_and_commas() -> None:
    assert split_rules("DEFAULT") == ["DEFAULT", ""]
    rules = split_rules(
        "RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT"
    )  # Kafka's testCommaWithWhitespace
    assert rules[:2] == ["RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/", "DEFAULT"]
    assert (
        PrincipalMapper("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT").name(
            "CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz"
        )
        == "Tkac\\, Adam"
    )
    # an escaped slash in the pattern and in the replacement
    mapper = PrincipalMapper("RULE:^CN=([^,\\/]*)\\/(.*?),.*$/$1\\/$2/")
    assert mapper.name("CN=team/alice,O=Acme") == "team/alice"


def test_replacement_syntax_of_java() -> None:
    # $n naming no group is literal (Kafka escapes it); \\$ is a literal dollar
    assert PrincipalMapper("RULE:^CN=(.*)$/$1-$2-\\$1/").name("CN=a") == "a-$2-$1"
    # the longest group number that exists: with one group, $10 is group 1 and a 0
    assert PrincipalMapper("RULE:^CN=(.*)$/$10/").name("CN=a") == "a0"
    assert PrincipalMapper("RULE:^CN=(?P<who>.*)$/${who}!/").name("CN=a") == "a!"


def test_no_rule_applies() -> None:
    with pytest.raises(NoMatchingRule, match="No rules apply to CN=x"):
        PrincipalMapper("RULE:^OU=(.*)$/$1/").name("CN=x")
