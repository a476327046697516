"""Kafka's `ssl.principal.mapping.rules` (SslPrincipalMapper): a client certificate's subject DN
to a principal name.

The setting is a comma-separated list of rules, tried in order; the first that applies names the
principal (`User:<name>`):

- `DEFAULT`: the DN itself (RFC 2253, as Java's X500Principal writes it);
- `RULE:pattern/replacement/[LU]`: applies when the Java regular expression `pattern` matches
  the whole DN; the DN is then rewritten with `replacement` (`$1` refers to a group, `\\x` is a
  literal x), and turned lower case (`L`) or upper case (`U`) if asked. A `/` inside the pattern
  or the replacement is written `\\/`.

No rule applying is an error (the connection is refused), as in Kafka. The splitting and parsing
regular expressions are Kafka's own, so a rule list that Kafka accepts means the same here (the
patterns run on Python's `re`, which reads the usual Java syntax the same way).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RULE_PATTERN = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE_PATTERN + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE_PATTERN)


class NoMatchingRule(ValueError):
    """No mapping rule applies to a DN."""


@dataclass(frozen=True, slots=True)
class _Part:
    literal: str | None = None
    group: int | str | None = None


class Rule:
    def __init__(
        self,
        pattern: str | None = None,
        replacement: str = "",
        lower: bool = False,
        upper: bool = False,
    ) -> None:
        self.is_default = pattern is None
        self.source = "DEFAULT" if pattern is None else f"RULE:{pattern}/{replacement}/"
        self.pattern = None if pattern is None else re.compile(pattern)
        self.lower = lower
        self.upper = upper
        groups = self.pattern.groups if self.pattern is not None else 0
        self._parts = _java_replacement(replacement, groups) if self.pattern is not None else []

    def apply(self, dn: str) -> str | None:
        if self.is_default:
            return dn
        assert self.pattern is not None
        if self.pattern.fullmatch(dn) is None:
            return None
        # Java's String.replaceAll: every match, as Python's re.sub replaces them
        result = self.pattern.sub(self._expand, dn)
        if self.lower:
            return result.lower()
        if self.upper:
            return result.upper()
        return result

    def _expand(self, m: re.Match[str]) -> str:
        out = []
        for part in self._parts:
            if part.literal is not None:
                out.append(part.literal)
            else:
                assert part.group is not None
                out.append(m.group(part.group) or "")  # an unmatched group adds nothing
        return "".join(out)

    def __repr__(self) -> str:
        return self.source


def _java_replacement(text: str, groups: int) -> list[_Part]:
    """A java.util.regex replacement string as literal text and group references, with
    Kafka's escaping of `$n` that names no group (taken literally)."""
    parts: list[_Part] = []
    literal: list[str] = []

    def flush() -> None:
        if literal:
            parts.append(_Part(literal="".join(literal)))
            literal.clear()

    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text):
                raise ValueError("character to be escaped is missing")
            literal.append(text[i + 1])
            i += 2
            continue
        if ch != "$":
            literal.append(ch)
            i += 1
            continue
        if i + 1 >= len(text):
            raise ValueError("Illegal group reference: group index is missing")
        nxt = text[i + 1]
        if nxt == "{":
            end = text.find("}", i + 2)
            if end < 0:
                raise ValueError("named capturing group is missing trailing '}'")
            flush()
            parts.append(_Part(group=text[i + 2 : end]))
            i = end + 1
            continue
        if not nxt.isdigit():
            raise ValueError("Illegal group reference")
        j = i + 1
        while j < len(text) and text[j].isdigit():
            j += 1
        digits = text[i + 1 : j]
        # Kafka's escapeLiteralBackReferences: $n naming no group (even shortened) is literal
        if not digits.startswith("0"):
            number = int(digits)
            while number > groups and number >= 10:
                number //= 10
            if number > groups:
                literal.append("$" + digits)
                i = j
                continue
        # java.util.regex: the first digit is a group; more digits while the number exists
        ref = int(digits[0])
        k = 1
        while k < len(digits) and ref * 10 + int(digits[k]) <= groups:
            ref = ref * 10 + int(digits[k])
            k += 1
        flush()
        parts.append(_Part(group=ref))
        literal.extend(digits[k:])
        i = j
    flush()
    return parts


def split_rules(text: str | None) -> list[str]:
    if text is None:
        return ["DEFAULT"]
    return [m.group(1) for m in _RULE_SPLITTER.finditer(text.strip()) if m.group(1) is not None]


def parse_rules(rules: list[str]) -> list[Rule]:
    out: list[Rule] = []
    for rule in rules:
        m = _RULE_PARSER.match(rule)
        if m is None:
            raise ValueError(f"Invalid rule: {rule}")
        if len(rule) != m.end():
            raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{rule[m.end() :]}`")
        if m.group(1) is not None:
            out.append(Rule())
        elif m.group(2) is not None:
            out.append(Rule(m.group(2), m.group(4), m.group(6) == "L", m.group(6) == "U"))
        # anything else is an empty rule: ignored
    return out


class PrincipalMapper:
    """ssl.principal.mapping.rules. Raises ValueError for rules Kafka would refuse."""

    def __init__(self, rules: str | None = "DEFAULT") -> None:
        self.rules = parse_rules(split_rules(rules))

    def name(self, dn: str) -> str:
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise NoMatchingRule(f"No rules apply to {dn}, rules {self.rules}")
