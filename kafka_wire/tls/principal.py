"""Kafka's `ssl.principal.mapping.rules` (KIP-371): from a client certificate's subject to the
name in its principal, `User:<name>`.

The rules are a comma-separated list, tried in order on the subject's RFC 2253 string
(`kafka_wire.tls.dn`); the first that applies gives the name:

- `RULE:<pattern>/<replacement>/[L|U]` applies when `pattern` matches the whole DN; the name is
  then the DN with every match of `pattern` replaced by `replacement` (`$1` is group 1, `\\x`
  is a literal x; a `$n` past the last group stays literal text), lower- or upper-cased after
  with `/L` or `/U`. `/` and `\\` inside the pattern or the replacement are escaped with `\\`;
  a comma needs no escape, the list is split where a comma cannot be inside a rule.
- `DEFAULT` gives the whole DN.

No applicable rule is an error (`NoMatchingRule`, whose message is Kafka's), and so an
authentication failure for the client; rules absent (None) mean `DEFAULT`, an empty string
means no rules at all. Parsing refuses what Kafka refuses ("default", "DEFAULT/L",
"RULE:.../L/U", ...).

Patterns are Python `re` in ASCII mode, which reads the syntax of Java's `Pattern` the same way
for everything Kafka documents (`\\w`, `(?i)` and the like are ASCII-only in both). A pattern
Python cannot compile (Java's `(?<name>...)`, `\\p{Lower}`) and a replacement that Java would
throw on when applied (`$1` with no group in the pattern, `$x`) are refused when parsing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from kafka_wire.tls.dn import subject_dn, subject_dn_der

__all__ = [
    "ANONYMOUS",
    "MappingRule",
    "NoMatchingRule",
    "PrincipalMappingError",
    "SslPrincipalMapper",
    "parse_rules",
    "ssl_principal",
    "subject_dn",
    "subject_dn_der",
]

ANONYMOUS = "User:ANONYMOUS"
DEFAULT_RULES = "DEFAULT"

# One rule: DEFAULT, RULE:pattern/replacement/flag (pattern and replacement made of escaped
# characters and anything but `\` and `/`), or anything else up to the next separator, which
# parsing then refuses. The splitter takes a rule and the comma after it; the catch-all is lazy
# so that a comma inside a RULE's pattern stays in it.
_RULE = (
    r"(?P<default>DEFAULT)"
    r"|RULE:(?P<pattern>(?:\\.|[^\\/])*)/(?P<replacement>(?:\\.|[^\\/])*)/(?P<case>[LU]?).*?"
    r"|(?P<other>.*?)"
)
_SPLITTER = re.compile(r"\s*(?P<rule>" + _RULE + r")\s*(?:,\s*|$)", re.ASCII)
_PARSER = re.compile(_RULE, re.ASCII)

Case = Literal["", "L", "U"]


class PrincipalMappingError(ValueError):
    """`ssl.principal.mapping.rules` that do not parse."""


class NoMatchingRule(LookupError):
    """No rule applies to a DN: the client's authentication fails."""


# A compiled replacement: literal text, or the number of a group to insert.
_Template = tuple[str | int, ...]


def _compile_replacement(replacement: str, pattern: re.Pattern[str], rule: str) -> _Template:
    """Java's replacement syntax (Matcher.appendReplacement), with Kafka's reading of a
    reference past the last group as literal text."""
    groups = pattern.groups
    parts: list[str | int] = []
    literal: list[str] = []

    def flush() -> None:
        if literal:
            parts.append("".join(literal))
            literal.clear()

    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        if c == "\\":
            if i + 1 == n:  # the rule grammar pairs every backslash, but be safe
                raise PrincipalMappingError(f"Invalid rule: `{rule}`, trailing backslash")
            literal.append(replacement[i + 1])
            i += 2
            continue
        if c != "$":
            literal.append(c)
            i += 1
            continue
        i += 1
        if i == n:
            raise PrincipalMappingError(f"Invalid rule: `{rule}`, `$` without a group")
        if replacement[i] == "{":
            close = replacement.find("}", i)
            name = replacement[i + 1 : close] if close > 0 else ""
            if name not in pattern.groupindex:
                raise PrincipalMappingError(f"Invalid rule: `{rule}`, no group named `{name}`")
            flush()
            parts.append(pattern.groupindex[name])
            i = close + 1
            continue
        if not "0" <= replacement[i] <= "9":
            raise PrincipalMappingError(f"Invalid rule: `{rule}`, illegal group reference")
        ref = ord(replacement[i]) - ord("0")
        if ref > groups:
            if groups == 0:
                raise PrincipalMappingError(f"Invalid rule: `{rule}`, no group {ref}")
            literal.append("$")  # Kafka keeps `$4` of a three-group pattern as text
            continue
        i += 1
        # Java takes more digits while the number still names a group: `$12` is group 12 if
        # there are twelve, else group 1 then "2".
        while i < n and "0" <= replacement[i] <= "9":
            longer = ref * 10 + ord(replacement[i]) - ord("0")
            if longer > groups:
                break
            ref = longer
            i += 1
        flush()
        parts.append(ref)
    flush()
    return tuple(parts)


@dataclass(frozen=True)
class MappingRule:
    """One rule: `DEFAULT` when `pattern` is None, else `RULE:pattern/replacement/case`."""

    pattern: re.Pattern[str] | None = None
    replacement: str = ""
    case: Case = ""
    _template: _Template = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.pattern is not None:
            template = _compile_replacement(self.replacement, self.pattern, str(self))
            object.__setattr__(self, "_template", template)

    def apply(self, distinguished_name: str) -> str | None:
        """The name this rule gives `distinguished_name`, or None if it does not apply."""
        if self.pattern is None:
            return distinguished_name
        if self.pattern.fullmatch(distinguished_name) is None:
            return None
        name = self._replace_all(self.pattern, distinguished_name)
        if self.case == "L":
            return name.lower()
        if self.case == "U":
            return name.upper()
        return name

    def _replace_all(self, pattern: re.Pattern[str], text: str) -> str:
        # Java's replaceAll, not re.sub: after an empty match Java resumes one character on,
        # where re.sub would try a non-empty match at the same place ("(.*?)" -> "-$1" on "ab"
        # is "-a-b-" in Java, "--a--b-" with re.sub).
        out: list[str] = []
        copied = pos = 0
        while pos <= len(text):
            m = pattern.search(text, pos)
            if m is None:
                break
            out.append(text[copied : m.start()])
            out.extend(p if isinstance(p, str) else (m.group(p) or "") for p in self._template)
            copied = m.end()
            pos = m.end() + 1 if m.end() == m.start() else m.end()
        out.append(text[copied:])
        return "".join(out)

    def __str__(self) -> str:
        # Kafka's Rule.toString, which its NoMatchingRule message is made of.
        if self.pattern is None:
            return "DEFAULT"
        flag = f"/{self.case}" if self.case else ""
        return f"RULE:{self.pattern.pattern}/{self.replacement}{flag}"


def _parse_rule(text: str) -> MappingRule | None:
    m = _PARSER.match(text)
    assert m is not None  # the catch-all matches the empty string
    if m.end() != len(text):
        raise PrincipalMappingError(
            f"Invalid rule: `{text}`, unmatched substring: `{text[m.end() :]}`"
        )
    if m.group("default") is not None:
        return MappingRule()
    if m.group("pattern") is None:
        return None  # an empty rule, as between two commas: ignored
    source = m.group("pattern")
    try:
        pattern = re.compile(source, re.ASCII)
    except re.error as e:
        raise PrincipalMappingError(f"Invalid rule: `{text}`, bad pattern: {e}") from e
    case: Case = "L" if m.group("case") == "L" else "U" if m.group("case") == "U" else ""
    return MappingRule(pattern, m.group("replacement"), case)


def parse_rules(rules: str | None) -> tuple[MappingRule, ...]:
    """The rules of an `ssl.principal.mapping.rules` value; None is `DEFAULT`."""
    text = (DEFAULT_RULES if rules is None else rules).strip()
    parsed = (_parse_rule(m.group("rule")) for m in _SPLITTER.finditer(text))
    return tuple(rule for rule in parsed if rule is not None)


class SslPrincipalMapper:
    """Kafka's SslPrincipalMapper: the first applicable rule names the principal."""

    def __init__(self, rules: Sequence[MappingRule]) -> None:
        self._rules = tuple(rules)

    @classmethod
    def from_rules(cls, rules: str | None = None) -> SslPrincipalMapper:
        """Parse an `ssl.principal.mapping.rules` value; raises PrincipalMappingError."""
        return cls(parse_rules(rules))

    @property
    def rules(self) -> tuple[MappingRule, ...]:
        return self._rules

    def name(self, distinguished_name: str) -> str:
        """The principal's name for `distinguished_name`; raises NoMatchingRule."""
        for rule in self._rules:
            name = rule.apply(distinguished_name)
            if name is not None:
                return name
        raise NoMatchingRule(f"No rules apply to {distinguished_name}, rules {self._rule_list()}")

    def _rule_list(self) -> str:
        return "[" + ", ".join(str(r) for r in self._rules) + "]"

    def __str__(self) -> str:
        return f"SslPrincipalMapper(rules = {self._rule_list()})"


def ssl_principal(mapper: SslPrincipalMapper, peer_cert_der: bytes | None) -> str:
    """The principal of a TLS client, as Kafka's DefaultKafkaPrincipalBuilder names it:
    `User:` and the mapped subject of its certificate (`getpeercert(binary_form=True)`), or
    `User:ANONYMOUS` when it presented none. Raises NoMatchingRule."""
    if not peer_cert_der:
        return ANONYMOUS
    return "User:" + mapper.name(subject_dn_der(peer_cert_der))
