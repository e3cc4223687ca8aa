"""The shared store under a burst: three gateway processes on one PostgreSQL and one
Redis take 1,000 concurrent requests. Every answer is a decision (200, 402, 429),
never a 503 from a pool that ran dry, and the ledger and the audit logs agree."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from tests.conftest import Fakes, GatewayProcess, Services
from tests.fakes import Reply
from tests.governance_helpers import BODY, headers, metered_bundle, shared, unique_team

pytestmark = pytest.mark.served

BURST = 1_000
RPM = 100
BUDGET_USD = "10.00"  # 200 bounds of $0.05 outstanding at once
DECISIONS = {200, 402, 429}


async def burst(urls: list[str], key: str | list[str], count: int) -> list[int]:
    """``count`` requests in flight at once over the gateways, each with its own connection
    (with several keys, request i uses key i mod their number)."""
    keys = [key] if isinstance(key, str) else key
    connector = aiohttp.TCPConnector(limit=count, force_close=True)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(i: int) -> int:
            async with session.post(f"{urls[i % len(urls)]}/v1/messages", json=BODY, headers=headers(keys[i % len(keys)])) as response:
                await response.read()
                return response.status

        return await asyncio.gather(*(one(i) for i in range(count)))


def ledger_totals(services: Services, *teams: str) -> tuple[int, int, int]:
    """(reservations, of them settled, micro-USD the ledger holds) for some teams."""
    with psycopg.connect(services.database_url) as connection:
        row = connection.execute(
            "SELECT count(*), count(*) FILTER (WHERE state = 'settled'), coalesce(sum(cost_micro_usd), 0) FROM reservations WHERE team = ANY(%s)",
            (list(teams),),
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def audited_charges(gateways: list[GatewayProcess]) -> int:
    outcomes = [r for g in gateways for r in g.settled(timeout=20) if r["event"] in ("request_finished", "request_failed", "request_cancelled")]
    return sum(r.get("charged_micro_usd", 0) for r in outcomes)


def test_a_burst_over_three_replicas_gets_only_decisions(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    capped, rated = unique_team(), unique_team()  # half the burst meets a budget, half a rate
    rules: dict[str, Any] = {
        f"{capped}-cap": {"subject": {"team": capped}, "budget": {"limit_usd": BUDGET_USD, "period": "CalendarMonth"}},
        f"{rated}-rate": {"subject": {"team": rated}, "rate": {"rpm": RPM}},
    }
    env, store = shared(services)  # the documented default pool sizes
    bundle = metered_bundle(tmp_path / "b", capped, rules, extra_teams=(rated,))
    gateways = [fresh_gateway(bundle=bundle, env=env, store=store) for _ in range(3)]
    keys = [gateways[0].key(capped, env=env), gateways[0].key(rated, env=env)]
    fakes.anthropic_us.script("metered-upstream", *[Reply(delay=1.0) for _ in range(BURST)])  # admitted calls overlap the rest

    statuses = asyncio.run(burst([g.url for g in gateways], keys, BURST))

    counts = collections.Counter(statuses)
    admitted, refused = counts[200], counts[402] + counts[429]
    server_errors = sum(n for status, n in counts.items() if status >= 500)
    print(f"\nburst of {BURST} over 3 replicas: admitted {admitted}, refused {refused} (402: {counts[402]}, 429: {counts[429]}), 5xx {server_errors}")
    assert set(counts) <= DECISIONS, f"statuses outside 200/402/429: {dict(counts)}"
    assert counts[402] > 0 and counts[429] == BURST // 2 - RPM  # the rate admits exactly its rpm: the burst lasts well under a minute
    reservations, settled, held = ledger_totals(services, capped, rated)
    assert reservations == settled == admitted  # a refused request holds nothing
    assert held == admitted * 1_000  # each admitted call settled at its actual cost
    assert ledger_totals(services, capped)[2] <= 10_000_000  # under the cap
    assert len(fakes.anthropic_us.requests_for("metered-upstream")) == admitted
    assert audited_charges(gateways) == held
