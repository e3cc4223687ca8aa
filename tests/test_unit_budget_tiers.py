"""L3 budget tiers in-process: activation refuses tiers it could not enforce, naming
the entry; the counter each team's tiers read is the one its requests charge (checked
against the plan's own counters); the ``budgets`` fact is the current period's
high-water mark as a percent of the limit, and is absent when it cannot be read."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest

from portcullis.adapters.auth import Principal
from portcullis.adapters.budget_facts import BudgetFacts
from portcullis.adapters.pipeline import Exchange
from portcullis.adapters.store.sqlite import SqliteKeyStore, SqliteLedger
from portcullis.engine.activation import activate
from portcullis.engine.bundle import BundleError, parse_bundle, read_bundle_files
from tests.budget_tier_helpers import CHEAP, FORBIDDEN, TIERED, tiered_catalog
from tests.bundles import TENANTS, deep_copy, write_bundle

TODAY = dt.date(2026, 11, 30)
PROVIDERS = {"anthropic-us", "anthropic-eu", "openai-main"}

RULES = {
    "pay-cap": {"subject": {"team": "pay"}, "budget": {"limit_usd": "200", "period": "CalendarMonth"}},
    "pay-per-user": {"subject": {"team": "pay", "per": "user"}, "budget": {"limit_usd": "10", "period": "CalendarDay"}},
    "org-cap": {"subject": {}, "budget": {"limit_usd": "1000", "period": "CalendarMonth"}},
    "pay-rate": {"subject": {"team": "pay"}, "rate": {"rpm": 100}},
    "ops-cap": {"subject": {"team": "ops"}, "budget": {"limit_usd": "5", "period": "CalendarDay"}},
    "carol-cap": {"subject": {"team": "pay", "user": "carol"}, "budget": {"limit_usd": "5", "period": "CalendarDay"}},
    "zero-cap": {"subject": {"team": "pay"}, "budget": {"limit_usd": "0", "period": "CalendarDay"}},
}
TIERS = [{"name": "yellow", "threshold_percent": 80, "substitutions": {TIERED: CHEAP}}]


def load(tmp_path: Path, configs: dict[str, Any]):
    tenants = deep_copy(TENANTS)
    for team in ("pay", "ops", "research"):
        tenants["teams"][team] = {"models": [TIERED, CHEAP]}
    directory = write_bundle(tmp_path / "b", tenants, tiered_catalog(), governance=RULES, sections={"budget_tiers": {"teams": configs}})
    return activate(parse_bundle(read_bundle_files(directory), []), PROVIDERS, TODAY)


def with_tiers(budget: str, tiers: list[dict[str, Any]] = TIERS) -> dict[str, Any]:
    return {"budget": budget, "tiers": tiers}


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ({"pay": with_tiers("nothing")}, "budget_tiers.teams['pay']: budget 'nothing' is not a governance rule"),
        ({"pay": with_tiers("pay-rate")}, "governance rule 'pay-rate' has no budget"),
        ({"pay": with_tiers("ops-cap")}, "budget 'ops-cap' applies to team 'ops', not to team 'pay'"),
        ({"*": with_tiers("pay-cap")}, "budget 'pay-cap' applies to team 'pay', not to every team"),
        ({"pay": with_tiers("carol-cap")}, "budget 'carol-cap' covers one user or key, not the whole team"),
        ({"pay": with_tiers("zero-cap")}, "budget 'zero-cap' has a limit of 0"),
        ({"nobody": with_tiers("org-cap")}, "team 'nobody' is not defined in tenants.teams"),
        ({"pay": with_tiers("pay-cap", [{"name": "y", "threshold_percent": 80, "substitutions": {TIERED: "gpt-5"}}])}, "model 'gpt-5' is not in the catalog"),
        ({"pay": with_tiers("pay-cap", [{"name": "y", "threshold_percent": 80, "substitutions": {"sonnet": CHEAP}}])}, "an alias of 'claude-sonnet-4-5'"),
        ({"pay": with_tiers("pay-cap", [{"name": "y", "threshold_percent": 80, "substitutions": {CHEAP: CHEAP}}])}, "substitutes for itself"),
        ({"pay": with_tiers("pay-cap", [*TIERS, {"name": "red", "threshold_percent": 60, "substitutions": {TIERED: FORBIDDEN}}])}, "strictly ascending"),
        ({"pay": with_tiers("pay-cap", [*TIERS, {"name": "yellow", "threshold_percent": 90, "substitutions": {TIERED: FORBIDDEN}}])}, "names must be distinct"),
        ({"pay": with_tiers("pay-cap", [{"name": "y", "threshold_percent": 101, "substitutions": {TIERED: CHEAP}}])}, "101 is greater than the maximum of 100"),
        ({"pay": with_tiers("pay-cap", [{"name": "y", "threshold_percent": 0, "substitutions": {TIERED: CHEAP}}])}, "0 is less than the minimum of 1"),
        ({"pay": {"budget": "pay-cap", "tiers": [], "extra": 1}}, "budget_tiers"),
    ],
)
def test_tiers_that_cannot_be_enforced_are_refused_naming_the_entry(tmp_path: Path, configs: dict[str, Any], message: str) -> None:
    with pytest.raises(BundleError) as refused:
        load(tmp_path, configs)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("configs", "principal", "budget"),
    [
        ({"pay": with_tiers("pay-cap")}, {"team": "pay", "user": "alice", "key_id": "k1"}, "pay-cap"),
        ({"pay": with_tiers("pay-per-user")}, {"team": "pay", "user": "alice", "key_id": "k1"}, "pay-per-user"),
        ({"pay": with_tiers("pay-per-user")}, {"team": "pay", "user": None, "key_id": "k1"}, "pay-per-user"),
        ({"*": with_tiers("org-cap")}, {"team": "research", "user": "bob", "key_id": "k2"}, "org-cap"),
        ({"*": with_tiers("org-cap"), "pay": with_tiers("pay-cap")}, {"team": "pay", "user": None, "key_id": "k3"}, "pay-cap"),
    ],
)
def test_the_counter_a_team_tiers_read_is_the_one_its_requests_charge(tmp_path: Path, configs: dict[str, Any], principal: dict[str, Any], budget: str) -> None:
    active = load(tmp_path, configs)
    read = active.budget_reads.for_team(principal["team"])
    assert read is not None and read.budget == budget
    now = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
    plan = active.decide({"principal": principal, "request": {"model": TIERED, "requires": []}})
    (counter,) = [c for c in plan.limits.counters if budget in c.rules]  # the plan's own counter for the rule
    instance = "M2026-11" if counter.period == "month" else "d2026-11-30"
    assert read.key(principal, now) == f"{counter.scope}|{counter.metric}|{instance}"


def test_teams_without_tiers_read_nothing(tmp_path: Path) -> None:
    active = load(tmp_path, {"pay": with_tiers("pay-cap")})
    assert active.budget_reads.for_team("ops") is None and active.budget_reads.for_team("research") is None


def exchange_for(active: Any, team: str) -> Exchange:
    exchange = Exchange("req_1", protocol=None, started=time.monotonic(), arrived=dt.datetime.now(dt.UTC))  # type: ignore[arg-type]
    exchange.principal = Principal("k1", team, None)
    exchange.bundle = active
    return exchange


def test_the_fact_is_the_current_periods_peak_over_the_limit(tmp_path: Path) -> None:
    active = load(tmp_path, {"pay": with_tiers("pay-cap")})  # $200 a month
    store = SqliteKeyStore.open(tmp_path / "state.db")
    store.connection.execute("INSERT INTO counters (key, value, expires_at, peak) VALUES ('team:pay|cost|M2026-11', 10, '2999-01-01', 170999999)")
    clock = [dt.datetime(2026, 11, 30, 23, 59, tzinfo=dt.UTC)]
    facts = BudgetFacts(SqliteLedger(store.connection), lambda: clock[0])
    assert asyncio.run(facts.gather(exchange_for(active, "pay"))) == {"pay-cap": {"percent": 85}}  # rounded down
    clock[0] = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)  # the next period: a counter of its own
    assert asyncio.run(facts.gather(exchange_for(active, "pay"))) == {"pay-cap": {"percent": 0}}
    assert asyncio.run(facts.gather(exchange_for(active, "ops"))) is None  # no tiers: no read
    store.connection.close()  # the store fails: no fact, and no error for the request
    assert asyncio.run(facts.gather(exchange_for(active, "pay"))) is None
