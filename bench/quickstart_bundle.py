"""The quickstart's bundle as the headline benchmark serves it: every policy of
``policies/`` on (PII, prompt integrity, budgets, budget tiers, the cache-domain pin …),
its rate limits, quotas and budgets multiplied so that load measures serving rather than
refusals, and its catalog's offline ``mock`` targets pointed at the fake provider.

Generated from ``policies/`` on every run, so the benchmark follows the quickstart as it
changes; nothing but numbers and provider names is rewritten. ``bare`` is the same
tenants and catalog with no team policies at all: the gateway's own cost."""

from __future__ import annotations

import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "policies"
LIFT = 1_000_000  # every limit times this: a 2-core machine cannot reach a lifted one in a run
TEAM, USER = "demo", "alice"
CHAT_MODEL = "gpt-4o-mini"  # what the quickstart grants alice over the OpenAI wire
MESSAGES_MODEL = "claude-sonnet-4-5"
# The quickstart's mock stands in for both providers; the fake answers each wire.
FAKE_PROVIDERS = {"claude": "fake-anthropic", "gpt": "fake-openai"}
# What the bare bundle empties: each team-policy section's list of policies, and the
# cache-domain pin (a routing layer) turned off.
NO_TEAM_POLICIES: dict[str, tuple[str, Any]] = {
    "pii": ("policies", {}),
    "integrity": ("policies", {}),
    "budget_tiers": ("teams", {}),
    "intent": ("routers", []),
    "cache_domains": ("pin", False),
}


def lift_rule(rule: dict[str, Any], factor: int = LIFT) -> dict[str, Any]:
    """One governance rule with each limit multiplied by ``factor``: the rule, its
    subject, thresholds, period and failure policy stay as written, so every admission
    and settlement still runs, only never refuses."""
    lifted = {**rule}
    if "rate" in rule:
        lifted["rate"] = {name: value * factor for name, value in rule["rate"].items()}
    if "quota" in rule:
        lifted["quota"] = {name: value * factor for name, value in rule["quota"].items()}
    if "budget" in rule:
        budget = {**rule["budget"]}
        budget["limit_usd"] = str(Decimal(str(budget["limit_usd"])) * factor)
        lifted["budget"] = budget
    return lifted


def lift_governance(document: dict[str, Any], factor: int = LIFT) -> dict[str, Any]:
    return {**document, "rules": {name: lift_rule(rule, factor) for name, rule in document.get("rules", {}).items()}}


def fake_provider(model: str) -> str:
    """The fake provider that serves a catalog model: Claude over the Anthropic wire,
    the rest over OpenAI's."""
    return FAKE_PROVIDERS["claude"] if model.startswith("claude") else FAKE_PROVIDERS["gpt"]


def point_at_fake(catalog: dict[str, Any]) -> dict[str, Any]:
    """The catalog with each ``mock`` target and price on the fake provider of its family."""
    models = {}
    for name, spec in catalog["models"].items():
        targets = [{**target, "provider": fake_provider(target["model"])} if target["provider"] == "mock" else target for target in spec["targets"]]
        models[name] = {**spec, "targets": targets}
    prices = [{**price, "provider": fake_provider(price["model"])} if price["provider"] == "mock" else price for price in catalog.get("prices", [])]
    return {**catalog, "models": models, "prices": prices}


def _read(directory: Path, section: str) -> dict[str, Any]:
    return yaml.safe_load((directory / "portcullis" / section / "data.yaml").read_text())


def _write(directory: Path, section: str, document: dict[str, Any]) -> None:
    (directory / "portcullis" / section / "data.yaml").write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


def write(directory: Path, source: Path = QUICKSTART, factor: int = LIFT) -> Path:
    """The lifted quickstart bundle in ``directory``: a copy of ``source`` with its
    governance lifted and its catalog on the fake."""
    if directory.exists():
        shutil.rmtree(directory)
    shutil.copytree(source, directory)
    _write(directory, "governance", lift_governance(_read(directory, "governance"), factor))
    _write(directory, "catalog", point_at_fake(_read(directory, "catalog")))
    return directory


def write_bare(directory: Path, source: Path = QUICKSTART) -> Path:
    """The quickstart's tenants and catalog (on the fake) with no team policies: no
    governance rules, PII, integrity, budget tier or intent policies."""
    write(directory, source)
    _write(directory, "governance", {"rules": {}})
    for section, (key, empty) in NO_TEAM_POLICIES.items():
        _write(directory, section, {**_read(directory, section), key: empty})
    return directory
