"""What the governance suites share: the metered model and its prices, budget rules,
bundles for one team, concurrent firing and reading the shared ledger."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.bundles import CATALOG, TENANTS, deep_copy, target, write_bundle
from tests.conftest import Services

METERED = "metered-model"
METERED_UPSTREAM = "metered-upstream"
# Input is free and output costs $50 per million tokens, so a request with max_tokens
# 1000 has a bound of exactly $0.05 and, answered with 20 tokens, costs $0.001.
BOUND = 50_000
ACTUAL = 1_000
BODY = {"model": METERED, "max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}
# The same prices on an OpenAI-compatible provider.
METERED_CHAT = "metered-chat"
METERED_CHAT_UPSTREAM = "metered-chat-upstream"


def budget_cap(team: str, limit_usd: str, period: str) -> dict[str, Any]:
    """A team's hard budget: the rule most tests here run against."""
    return {f"{team}-cap": {"subject": {"team": team}, "budget": {"limit_usd": limit_usd, "period": period}}}


def metered_bundle(directory: Path, team: str, rules: dict[str, Any], extra_teams: tuple[str, ...] = ()) -> Path:
    catalog = deep_copy(CATALOG)
    for model, provider, upstream in ((METERED, "anthropic-us", METERED_UPSTREAM), (METERED_CHAT, "openai-main", METERED_CHAT_UPSTREAM)):
        catalog["models"][model] = {"targets": [target(provider, upstream, "us-east-1", max_output_tokens=1000)]}
        catalog["prices"].append(
            {
                "provider": provider,
                "model": upstream,
                "effective_from": "2025-01-01",
                "usd_per_mtok": {"input": "0", "output": "50", "cache_read": "0", "cache_write": "0"},
            }
        )
    tenants = deep_copy(TENANTS)
    for name in (team, *extra_teams):
        tenants["teams"][name] = {"models": ["*"]}
    return write_bundle(directory, tenants, catalog, governance=rules)


def unique_team() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def headers(key: str) -> dict[str, str]:
    return {"x-api-key": key, "anthropic-version": "2023-06-01"}


async def fire(urls: list[str], key: str, count: int, body: dict[str, Any] = BODY) -> list[httpx.Response]:
    """``count`` requests at once, spread over the given gateways."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=count)) as client:
        return await asyncio.gather(*(client.post(f"{urls[i % len(urls)]}/v1/messages", json=body, headers=headers(key)) for i in range(count)))


def shared(services: Services, **store: Any) -> tuple[dict[str, str], dict[str, Any]]:
    env = {"DATABASE_URL": services.database_url, "REDIS_URL": services.redis_url}
    return env, {"kind": "shared", "redis_prefix": services.redis_prefix, **store}


def ledger_rows(services: Services, team: str) -> list[tuple]:
    with psycopg.connect(services.database_url) as connection:
        return connection.execute("SELECT id, state, tokens, cost_micro_usd FROM reservations WHERE team = %s ORDER BY created_at", (team,)).fetchall()


def away_from_minute_edge(margin: float = 4.0) -> None:
    """Provider keys' capacity is counted per calendar minute: keep a burst inside one."""
    seconds = time.time() % 60
    if seconds > 60 - margin:
        time.sleep(60 - seconds + 0.2)
