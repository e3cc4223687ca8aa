"""The default bundle's Rego is split by concern, and the split holds.

One package per concern (access, routing, governance, pii, integrity) plus the
helpers they share (portcullis.lib) and the gateway's entry points (package
portcullis). Across packages only public rules are referenced, by full path and never
through `import` (which makes regorus evaluate the imported package whole); entry
points carry OPA's `# METADATA` annotations; no rule shares a path with bundle data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from portcullis.engine.activation import CONTEXT_FIT_RULE, DECISION_RULE, INDEX_RULE, INJECTION_SCAN_RULE, TOOL_CALL_RULE, VISIBLE_MODELS_RULE

ROOT = Path(__file__).resolve().parent.parent
MODULES = {path.name: path.read_text() for path in sorted((ROOT / "policies" / "portcullis").glob("*.rego"))}
CONCERNS = ["access", "routing", "governance", "pii", "integrity", "guardrails", "intent", "budget_tiers", "context_fit", "breakers", "lib"]
ENTRY_POINTS = {DECISION_RULE, VISIBLE_MODELS_RULE, INJECTION_SCAN_RULE, TOOL_CALL_RULE, CONTEXT_FIT_RULE, INDEX_RULE}
_RULE_HEAD = re.compile(r"^(?:default\s+)?([A-Za-z_][A-Za-z0-9_]*)\b(?=\s*(?:\(|:=|=|if\b|contains\b|\[|$))", re.M)
_REFERENCE = re.compile(r"\bdata\.portcullis((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def package_of(source: str) -> str:
    return re.search(r"^package\s+(\S+)", source, re.M).group(1)


def code_of(source: str) -> str:
    """The source without comments or string literals (neither holds a reference)."""
    return re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`|#[^\n]*', '""', source)


def rules_of(source: str) -> set[str]:
    body = code_of(source).split("\n", 1)[1] if source.startswith("package") else code_of(source)
    return {name for name in _RULE_HEAD.findall(re.sub(r"^package[^\n]*", "", body, flags=re.M)) if name not in ("import", "package")}


PACKAGES = {name: package_of(source) for name, source in MODULES.items()}
RULES: dict[str, set[str]] = {}
for _name, _source in MODULES.items():
    RULES.setdefault(PACKAGES[_name], set()).update(rules_of(_source))


def references(source: str) -> list[tuple[str, str]]:
    """(package, rule) of every reference into another package of the bundle."""
    found = []
    for match in _REFERENCE.finditer(code_of(source)):
        parts = match.group(1).strip(".").split(".")
        if len(parts) >= 2 and f"portcullis.{parts[0]}" in RULES:
            found.append((f"portcullis.{parts[0]}", parts[1]))
        elif parts[0] in RULES["portcullis"]:
            found.append(("portcullis", parts[0]))
    return found


def test_one_package_per_concern_and_the_entry_points_at_the_root() -> None:
    assert sorted(set(PACKAGES.values())) == sorted(["portcullis", *(f"portcullis.{c}" for c in CONCERNS)])
    for concern in CONCERNS:
        assert [name for name, package in PACKAGES.items() if package == f"portcullis.{concern}"] == [f"{concern}.rego"]
    assert sorted(name for name, package in PACKAGES.items() if package == "portcullis") == ["decision.rego", "index.rego"]
    assert {f"data.portcullis.{rule}" for rule in RULES["portcullis"] if not rule.startswith("_")} == ENTRY_POINTS


def test_packages_meet_only_by_full_path_and_only_at_public_rules() -> None:
    sections = json.loads((ROOT / "schemas" / "bundle-data.schema.json").read_text())["properties"]
    for name, source in MODULES.items():
        assert not re.search(r"^import\s+data\.", source, re.M), f"{name} imports a package"
        for package, rule in references(source):
            if package != PACKAGES[name]:
                assert not rule.startswith("_"), f"{name} reaches into {package}'s private {rule}"
                data_keys = sections.get(package.removeprefix("portcullis."), {}).get("properties", {})
                assert rule in RULES[package] or rule in data_keys, f"{name} names {package}.{rule}, which is neither a rule nor data"
    used_elsewhere = {(package, rule) for name, source in MODULES.items() for package, rule in references(source) if package != PACKAGES[name]}
    for package, rules in RULES.items():
        for rule in rules:
            if package != "portcullis" and not rule.startswith("_"):
                assert (package, rule) in used_elsewhere, f"{package}.{rule} is used only inside its package: name it _{rule}"


def metadata_blocks(source: str) -> dict[str, dict]:
    """Each `# METADATA` block's YAML, by the rule (or package) that follows it."""
    blocks = {}
    for match in re.finditer(r"^# METADATA\n((?:#[^\n]*\n)+)([^\n]+)", source, re.M):
        document = yaml.safe_load("\n".join(line[2:] for line in match.group(1).splitlines()))
        head = match.group(2)
        target = package_of(head) if head.startswith("package") else _RULE_HEAD.match(head).group(1)
        blocks[target] = document
    return blocks


def test_entry_points_and_only_they_are_annotated_as_such() -> None:
    annotated = set()
    for name, source in MODULES.items():
        for target, document in metadata_blocks(source).items():
            assert set(document) <= {"title", "description", "entrypoint", "scope", "related_resources", "authors", "custom"}, (name, target)
            assert document.get("title") and document.get("description"), f"{name}: {target} needs a title and a description"
            if document.get("entrypoint") is True:
                # OPA refuses `entrypoint` at any scope but a rule's or a package's
                assert document.get("scope", "rule") in ("rule", "package"), (name, target)
                annotated.add(f"data.{PACKAGES[name]}.{target}")
    assert annotated == ENTRY_POINTS


def test_no_rule_shares_a_path_with_bundle_data() -> None:
    """OPA refuses a bundle whose rule and data share a path; regorus silently reads the data."""
    schema = json.loads((ROOT / "schemas" / "bundle-data.schema.json").read_text())
    sections = schema["properties"]
    assert not RULES["portcullis"] & {*sections, "compiled", *CONCERNS}
    for section, spec in sections.items():
        assert not RULES.get(f"portcullis.{section}", set()) & set(spec.get("properties", {})), section
