"""What a bundle may hold so that every Rego engine reads it the same way.

Security engineers review a bundle as Rego and may run it in OPA; the gateway runs it
in regorus. The two disagree on a few constructs, so a bundle that uses one is refused
at activation with an error that names the field, instead of meaning one thing in
review and another in production:

- globs: regorus compares ``?`` and ``[…]`` by byte where OPA compares by character,
  and a malformed glob (``{gpt``) is an error in regorus but evaluates in OPA. Bundle
  globs hold only ``*`` and literal text, on which both agree;
- numbers: regorus keeps integers beyond 2^53 inexactly once arithmetic touches them,
  saturates data integers beyond the 64-bit range and cannot evaluate float values
  beyond it, while OPA is exact. Numbers stay within ±(2^53 − 1);
- regular expressions: ``\\b``, ``\\w`` and ``\\d`` (and their negations) are ASCII in OPA
  and in the RE2 fast path but Unicode in regorus (``\\bid_rsa`` on ``éid_rsa``), so
  integrity patterns spell them as explicit ASCII classes;
- keys: YAML reads ``1:`` or ``yes:`` as a number or a boolean, which the gateway would
  hand regorus as such while OPA reads every key as a string; keys must be strings;
- budget limits (decimal strings the policy compares with ``to_number``) stay within
  15 significant digits, which a double orders exactly;
- paths: a package may share its path with data (``portcullis.pii`` beside
  ``data.portcullis.pii.policies``: both engines merge the two), but a rule at a path
  that also holds data is refused by OPA and silently loses to the data in regorus.

The bundle-data schema declares the same limits; these checks run first so the error
says why.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from portcullis.engine.schemas import field_path

MAX_SAFE_INTEGER = 2**53 - 1
GLOB_SPECIALS = "?[]{}\\"
UNICODE_SENSITIVE_ESCAPES = "bBwWdD"
_USD_LIMIT = re.compile(r"[0-9]{1,9}(\.[0-9]{1,6})?")


def portability_problems(data: Any, where: str = "data.portcullis") -> list[str]:
    """Every construct of ``data`` that OPA and regorus would read differently."""
    return [*_number_problems(data, [where]), *_glob_problems(data, where), *_pattern_problems(data, where), *_usd_limit_problems(data, where)]


def rule_path_problems(rule_paths: Iterable[tuple[str, ...]], data: Mapping[str, Any]) -> list[str]:
    """Every rule whose path also holds data (at it or below it)."""
    problems = []
    for path in sorted(rule_paths):
        node: Any = data
        for part in path:
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            name = ".".join(["data", *path])
            problems.append(f"rule {name} shares its path with bundle data: OPA refuses such a bundle and regorus reads the data, not the rule")
    return problems


def glob_problem(pattern: Any) -> str | None:
    """Why ``pattern`` is not a glob both engines agree on, or None."""
    if not isinstance(pattern, str):
        return None  # the schema reports the type
    used = sorted({char for char in pattern if char in GLOB_SPECIALS})
    if used:
        shown = " ".join(repr(char) for char in used)
        return f"glob {pattern!r} uses {shown}; bundle globs hold only '*' and literal text, which OPA and regorus match alike"
    return None


def pattern_problem(pattern: Any) -> str | None:
    """Why ``pattern`` would match differently in OPA and regorus, or None."""
    if not isinstance(pattern, str):
        return None
    used: list[str] = []
    in_class = False
    index = 0
    while index < len(pattern):
        char, following = pattern[index], pattern[index + 1 : index + 2]
        if char == "\\":
            if following in UNICODE_SENSITIVE_ESCAPES and f"\\{following}" not in used:
                used.append(f"\\{following}")
            index += 2
            continue
        if in_class:
            # Inside [...], regorus reads a nested [ and the operators && -- ~~ as set
            # operations; OPA (RE2) reads them as literal characters.
            if char == "[" and following != ":":
                return "its pattern nests a character class, which regorus reads as a union and OPA as a literal '['"
            if char in "&-~" and following == char:
                return f"its pattern has {char * 2} inside a character class, a set operation in regorus and literal text in OPA"
            if char == "[" and following == ":":
                index = max(pattern.find(":]", index + 2) + 2, index + 2)
                continue
            if char == "]":
                in_class = False
        elif char == "[":
            in_class = True
            if pattern[index + 1 : index + 2] == "^":
                index += 1
            if pattern[index + 1 : index + 2] == "]":  # a leading ] is literal
                index += 1
        index += 1
    if used:
        return (
            f"its pattern uses {' '.join(used)}, which OPA reads as ASCII and regorus as Unicode;"
            " write word boundaries and classes out in ASCII, e.g. (?:^|(?-i:[^0-9A-Za-z_])) for a leading \\b"
        )
    return None


def _number_problems(value: Any, path: list[str]) -> Iterator[str]:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            yield f"{''.join(path)}: {value} is beyond ±(2^53 − 1) = {MAX_SAFE_INTEGER}, the largest integer every Rego engine keeps exactly"
    elif isinstance(value, float):
        if not math.isfinite(value) or abs(value) > MAX_SAFE_INTEGER:
            yield f"{''.join(path)}: {value!r} is beyond ±(2^53 − 1), the range every Rego engine evaluates alike"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):  # YAML's `1:` or `yes:`; OPA reads every key as a string
                yield f"{''.join(path)}: key {key!r} is not a string; quote it, since OPA reads it as {str(key).lower()!r} text"
            yield from _number_problems(item, [*path, f".{key}"])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _number_problems(item, [*path, f"[{index}]"])


def _glob_problems(data: Any, where: str) -> Iterator[str]:
    for parts, pattern in _globs(data):
        problem = glob_problem(pattern)
        if problem:
            yield f"{field_path(where, parts)}: {problem}"


def _globs(data: Any) -> Iterator[tuple[list[Any], Any]]:
    """(path, pattern) of every glob the policies match with ``glob.match``."""
    teams = _get(data, "tenants", "teams")
    for team_id, team in _items(teams):
        yield from _listed(["tenants", "teams", team_id, "models"], _get(team, "models"))
        for user_id, user in _items(_get(team, "users")):
            yield from _listed(["tenants", "teams", team_id, "users", user_id, "models"], _get(user, "models"))
    for name, policy in _items(_get(data, "integrity", "policies")):
        yield from _listed(["integrity", "policies", name, "tools", "allow"], _get(policy, "tools", "allow"))
    rules = _get(data, "integrity", "tool_rules")
    for index, rule in enumerate(rules if isinstance(rules, list) else []):
        yield from _listed(["integrity", "tool_rules", index, "tools"], _get(rule, "tools"))


def _pattern_problems(data: Any, where: str) -> Iterator[str]:
    for kind in ("injection_rules", "tool_rules"):
        rules = _get(data, "integrity", kind)
        for index, rule in enumerate(rules if isinstance(rules, list) else []):
            problem = pattern_problem(_get(rule, "pattern"))
            if problem:
                yield f"{field_path(where, ['integrity', kind, index, 'pattern'])}: integrity rule {_get(rule, 'id')!r}: {problem}"


def _usd_limit_problems(data: Any, where: str) -> Iterator[str]:
    for name, rule in _items(_get(data, "governance", "rules")):
        limit = _get(rule, "budget", "limit_usd")
        if isinstance(limit, str) and not _USD_LIMIT.fullmatch(limit):
            path = field_path(where, ["governance", "rules", name, "budget", "limit_usd"])
            yield f"{path}: {limit!r} must be a decimal with at most 9 digits before the point and 6 after, so every Rego engine orders it exactly"


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _items(value: Any) -> Iterator[tuple[str, Any]]:
    return iter(value.items()) if isinstance(value, Mapping) else iter(())


def _listed(path: list[Any], values: Any) -> Iterator[tuple[list[Any], Any]]:
    for index, value in enumerate(values if isinstance(values, list) else []):
        yield [*path, index], value
