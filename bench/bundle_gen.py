"""A generated bundle of realistic shape for benchmarks: 50 teams, 500 users, 40 models,
201 governance rules.

Models have one to three targets across regions and a quarter of them a fallback;
teams grant a mix of globs and exact IDs, most with a region lock; about a third of
users narrow their team's models or regions.

``write(..., routing=True)`` adds every routing layer's data to the same bundle
(``routing_layers``): budget tiers on each team's monthly budget, intent routers over
the Claude and GPT models teams use, and the product's breaker, context-fit and
endpoint settings. The default generation does not change.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ["claude", "gpt", "glm", "llama"]
REGIONS = ["us-east-1", "eu-west-1", "ap-northeast-2"]
# glm models are served over the OpenAI Responses wire, so every client protocol has a passthrough scenario.
PROVIDERS = {"claude": "fake-anthropic", "gpt": "fake-openai", "glm": "fake-responses", "llama": "fake-openai"}
# One Claude model on Bedrock Runtime (SigV4, InvokeModel and Converse, event streams), for
# its ingress and egress rows; every team's grant (claude-* or *) covers it.
BEDROCK = "fake-bedrock"
BEDROCK_MODEL = "claude-bedrock"
BEDROCK_UPSTREAM = "anthropic.claude-bedrock-v1:0"


def provider_names() -> set[str]:
    return {*PROVIDERS.values(), BEDROCK}


def generate(teams: int = 50, users_per_team: int = 10, models: int = 40, seed: int = 7) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    rng = random.Random(seed)
    names = [f"{FAMILIES[i % 4]}-m{i}" for i in range(models)]
    catalog: dict[str, Any] = {"aliases": {}, "models": {}, "prices": []}
    for i, name in enumerate(names):
        family = FAMILIES[i % 4]
        targets = []
        for j in range(rng.choice([1, 2, 2, 3])):
            upstream = f"{name}-upstream"
            targets.append(
                {
                    "provider": PROVIDERS[family],
                    "model": upstream,
                    "region": REGIONS[(i + j) % 3],
                    "priority": j + 1,
                    "context_window": 128000,
                    "max_output_tokens": 8192,
                    "capabilities": ["streaming", "tools"],
                }
            )
        spec: dict[str, Any] = {"targets": targets}
        if i % 4 == 0:
            spec["fallbacks"] = [names[(i + 4) % models]]
        catalog["models"][name] = spec
        catalog["aliases"][f"{name}-latest"] = name
        catalog["prices"].append(
            {"provider": PROVIDERS[family], "model": f"{name}-upstream", "effective_from": "2025-01-01", "usd_per_mtok": {"input": "3", "output": "15"}}
        )
    bedrock = {"provider": BEDROCK, "model": BEDROCK_UPSTREAM, "region": REGIONS[0], "priority": 1, "context_window": 200000, "max_output_tokens": 8192}
    catalog["models"][BEDROCK_MODEL] = {"targets": [{**bedrock, "capabilities": ["streaming", "tools"]}]}
    catalog["prices"].append({"provider": BEDROCK, "model": BEDROCK_UPSTREAM, "effective_from": "2025-01-01", "usd_per_mtok": {"input": "3", "output": "15"}})
    tenants: dict[str, Any] = {"teams": {}}
    rules: dict[str, Any] = {"org-rate": {"subject": {}, "rate": {"rpm": 100_000_000}}}
    for t in range(teams):
        grants = ["claude-*", "gpt-*"] if t % 3 else ["*"]
        team: dict[str, Any] = {"models": [*grants, f"glm-m{(t * 4 + 2) % models}"], "users": {}}
        if t % 5:
            team["regions"] = REGIONS[:2]
        for u in range(users_per_team):
            user: dict[str, Any] = {}
            if u % 3 == 1:
                user["models"] = ["claude-*"]
            if u % 7 == 3:
                user["regions"] = [REGIONS[0]]
            team["users"][f"user{t}-{u}"] = user
        tenants["teams"][f"team{t}"] = team
        rules[f"team{t}-month"] = {"subject": {"team": f"team{t}"}, "budget": {"limit_usd": "5000", "period": "CalendarMonth"}}
        rules[f"team{t}-day"] = {"subject": {"team": f"team{t}"}, "budget": {"limit_usd": "400", "period": "CalendarDay"}, "failure_policy": "Warn"}
        rules[f"team{t}-users"] = {"subject": {"team": f"team{t}", "per": "user"}, "rate": {"rpm": 10_000_000, "tpm": 10**12}}
        rules[f"team{t}-lead"] = {"subject": {"team": f"team{t}", "user": f"user{t}-0"}, "quota": {"tokens_per_day": 20000000}}
    return tenants, catalog, {"rules": rules}


ROUTED_PER_FAMILY = 5  # intent routers per family (claude, gpt), each over two requested models
# the product's own settings for the layers whose defaults are fine here
SHIPPED_SETTINGS = ("breakers", "context_fit", "endpoints", "cache_domains")


def _first_region(catalog: dict[str, Any], model: str) -> str:
    return catalog["models"][model]["targets"][0]["region"]


def routing_layers(tenants: dict[str, Any], catalog: dict[str, Any]) -> dict[str, Any]:
    """Bundle data sections that turn on L3 (budget tiers), L4 (intent routers), and L5-L7
    (the shipped settings), over the generated teams and models.

    Every team gets two tiers on its ``<team>-month`` budget: at 80 % each Claude / GPT
    model is replaced by the next model of its family, at 95 % by the one after. Each
    intent router covers two requested models of a family: its ``standard`` tier keeps
    the first, ``light`` and ``frontier`` name other models of the family whose first
    target is in a region every region-locked team may use (so a substitution is usually
    taken; a few are refused, as in life). Routers alternate between every team and a
    third of them; rules are the reference router's (examples/intent/router.yaml)."""
    shipped = ROOT / "policies" / "portcullis"
    intent = yaml.safe_load((shipped / "intent" / "data.yaml").read_text())
    reference = yaml.safe_load((ROOT / "examples" / "intent" / "router.yaml").read_text())
    names = [name for name in catalog["models"] if name != BEDROCK_MODEL]
    teams = list(tenants["teams"])
    routers = []
    tiers_of: dict[str, dict[str, str]] = {"yellow": {}, "red": {}}
    for family in ("claude", "gpt"):
        members = [name for name in names if name.startswith(f"{family}-")]
        unlocked = [name for name in members if _first_region(catalog, name) != REGIONS[2]]
        for n, name in enumerate(members):
            tiers_of["yellow"][name] = members[(n + 1) % len(members)]
            tiers_of["red"][name] = members[(n + 2) % len(members)]
        for r in range(ROUTED_PER_FAMILY):
            requested = members[2 * r : 2 * r + 2]
            light, frontier = _two_others(unlocked, requested[0], r)
            routers.append(
                {
                    "name": f"{family}-{r}",
                    "teams": ["*"] if r % 2 == 0 else teams[r::3],
                    "models": requested,
                    "tiers": {"light": light, "standard": requested[0], "frontier": frontier},
                    "default_tier": "standard",
                    "rules": [{"tier": rule["tier"], "when": rule["when"]} for rule in reference["rules"]],
                }
            )
    budget_tiers = {
        team: {
            "budget": f"{team}-month",
            "tiers": [
                {"name": "yellow", "threshold_percent": 80, "substitutions": dict(tiers_of["yellow"])},
                {"name": "red", "threshold_percent": 95, "substitutions": dict(tiers_of["red"])},
            ],
        }
        for team in teams
    }
    sections = {
        "budget_tiers": {"teams": budget_tiers},
        "intent": {"pin_ttl_seconds": intent["pin_ttl_seconds"], "keyword_sets": intent["keyword_sets"], "routers": routers},
    }
    for section in SHIPPED_SETTINGS:
        if (shipped / section / "data.yaml").exists():
            sections[section] = yaml.safe_load((shipped / section / "data.yaml").read_text())
    return sections


def _two_others(candidates: list[str], requested: str, offset: int) -> tuple[str, str]:
    others = [name for name in candidates if name != requested]
    return others[offset % len(others)], others[(offset + 3) % len(others)]


class _NoAliases(yaml.SafeDumper):
    """Bundle documents may not use YAML aliases: shared objects are written out each time."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write(
    directory: Path,
    revision: str = "bench-1",
    rules: bool = True,
    pii: dict[str, Any] | None = None,
    integrity: dict[str, Any] | None = None,
    modules: Path = ROOT / "policies" / "portcullis",
    routing: bool = False,
) -> Path:
    """``pii``, ``integrity``: PII and prompt-integrity policies to include (none by
    default); integrity policies come with the product's scanner and tool rules.
    ``routing``: every routing layer's data too (``routing_layers``).
    ``modules``: the directory whose Rego the bundle carries (another version of the
    default bundle's, to compare two in one run)."""
    tenants, catalog, governance = generate()
    if not rules:
        governance = {"rules": {}}
    if directory.exists():
        shutil.rmtree(directory)
    sections = [("tenants", tenants), ("catalog", catalog), ("governance", governance)]
    if pii is not None:
        sections.append(("pii", {"policies": pii}))
    if integrity is not None:
        shipped = yaml.safe_load((ROOT / "policies" / "portcullis" / "integrity" / "data.yaml").read_text())
        sections.append(("integrity", {"injection_rules": shipped["injection_rules"], "tool_rules": shipped["tool_rules"], "policies": integrity}))
    if routing:
        sections += list(routing_layers(tenants, catalog).items())
    for section, document in sections:
        (directory / "portcullis" / section).mkdir(parents=True)
        (directory / "portcullis" / section / "data.yaml").write_text(yaml.dump(document, Dumper=_NoAliases))
    for module in modules.glob("*.rego"):
        shutil.copy(module, directory / "portcullis" / module.name)
    (directory / ".manifest").write_text(f'{{"revision": "{revision}", "roots": ["portcullis"]}}')
    return directory
