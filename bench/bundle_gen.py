"""A generated bundle of realistic shape for benchmarks: 50 teams, 500 users, 40 models,
201 governance rules.

Models have one to three targets across regions and a quarter of them a fallback;
teams grant a mix of globs and exact IDs, most with a region lock; about a third of
users narrow their team's models or regions.
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


def write(
    directory: Path,
    revision: str = "bench-1",
    rules: bool = True,
    pii: dict[str, Any] | None = None,
    integrity: dict[str, Any] | None = None,
    modules: Path = ROOT / "policies" / "portcullis",
) -> Path:
    """``pii``, ``integrity``: PII and prompt-integrity policies to include (none by
    default); integrity policies come with the product's scanner and tool rules.
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
    for section, document in sections:
        (directory / "portcullis" / section).mkdir(parents=True)
        (directory / "portcullis" / section / "data.yaml").write_text(yaml.safe_dump(document))
    for module in modules.glob("*.rego"):
        shutil.copy(module, directory / "portcullis" / module.name)
    (directory / ".manifest").write_text(f'{{"revision": "{revision}", "roots": ["portcullis"]}}')
    return directory
