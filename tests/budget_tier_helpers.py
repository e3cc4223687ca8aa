"""What the budget-tier suites share: a bundle whose costs make utilisation exact.

Input is free and output costs $50 per million tokens on the tiered model, so with a
$1.00 budget each output token is 0.005 % of it: a request's bound (``max_tokens`` ×
50 micro-USD) and its settled cost (the fake's ``output_tokens`` × 50) put the counter
where a test wants it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.bundles import CATALOG, TENANTS, deep_copy, target, write_bundle

TIERED = "tiered-model"
TIERED_UPSTREAM = "tiered-upstream"
CHEAP = "tiered-cheap"
CHEAP_UPSTREAM = "tiered-cheap-upstream"
FORBIDDEN = "tiered-forbidden"  # in the catalog, granted to no tiered team
FORBIDDEN_UPSTREAM = "tiered-forbidden-upstream"
LIMIT_USD = "1.00"
MICRO_PER_TOKEN = 50  # output micro-USD per token on the tiered model
TOKENS_PER_PERCENT = 10_000 // MICRO_PER_TOKEN  # 1 % of $1.00


def tiered_catalog() -> dict[str, Any]:
    catalog = deep_copy(CATALOG)
    for model, upstream, output in ((TIERED, TIERED_UPSTREAM, "50"), (CHEAP, CHEAP_UPSTREAM, "5"), (FORBIDDEN, FORBIDDEN_UPSTREAM, "5")):
        catalog["models"][model] = {"targets": [target("anthropic-us", upstream, "us-east-1", max_output_tokens=100_000)]}
        catalog["prices"].append(
            {
                "provider": "anthropic-us",
                "model": upstream,
                "effective_from": "2025-01-01",
                "usd_per_mtok": {"input": "0", "output": output, "cache_read": "0", "cache_write": "0"},
            }
        )
    return catalog


def yellow_then_red(substitute: str = CHEAP) -> list[dict[str, Any]]:
    return [
        {"name": "yellow", "threshold_percent": 80, "substitutions": {TIERED: substitute}},
        {"name": "red", "threshold_percent": 95, "substitutions": {TIERED: substitute}},
    ]


def tiered_bundle(
    directory: Path, tiers_by_team: dict[str, list[dict[str, Any]]], period: str = "CalendarMonth", revision: str = "tiers-1", limit_usd: str = LIMIT_USD
) -> Path:
    """Each team gets a ``<team>-cap`` budget (of $1.00 unless told) and the given tiers on it."""
    tenants = deep_copy(TENANTS)
    rules: dict[str, Any] = {}
    configs: dict[str, Any] = {}
    for team, tiers in tiers_by_team.items():
        tenants["teams"][team] = {"models": [TIERED, CHEAP]}
        rules[f"{team}-cap"] = {"subject": {"team": team}, "budget": {"limit_usd": limit_usd, "period": period}}
        configs[team] = {"budget": f"{team}-cap", "tiers": tiers}
    return write_bundle(directory, tenants, tiered_catalog(), revision=revision, governance=rules, sections={"budget_tiers": {"teams": configs}})


def body(max_tokens: int, model: str = TIERED) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "x"}]}
