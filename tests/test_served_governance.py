"""Two-phase governance end to end: budgets, rates and quotas reserved before dispatch
and settled after, against the embedded ledger and against real Redis + PostgreSQL,
under concurrency and across gateway processes; warnings, soft caps and refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.conftest import Fakes, Services
from tests.fakes import Reply
from tests.governance_helpers import ACTUAL, BODY, BOUND, METERED, METERED_UPSTREAM, budget_cap, fire, headers, ledger_rows, metered_bundle, shared, unique_team

pytestmark = pytest.mark.served


# --- the hard cap under concurrency ---------------------------------------------------------


def test_hard_cap_admits_exactly_what_fits_under_concurrency(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    team = unique_team()
    rules = budget_cap(team, "1.00", "CalendarMonth")
    env, store = shared(services)
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules), env=env, store=store)
    key = gateway.key(team, env=env)
    fakes.anthropic_us.script(METERED_UPSTREAM, *[Reply(delay=1.0) for _ in range(100)])  # admitted calls overlap the rest
    responses = asyncio.run(fire([gateway.url], key, 100))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) == 20 and statuses.count(402) == 80
    refused = next(r for r in responses if r.status_code == 402).json()
    assert refused["error"]["type"] == "billing_error" and "budget" in refused["error"]["message"]
    rows = ledger_rows(services, team)
    assert len(rows) == 20 and {row[1] for row in rows} == {"settled"}
    assert sum(row[3] for row in rows) == 20 * ACTUAL <= 1_000_000
    assert len(fakes.anthropic_us.requests_for(METERED_UPSTREAM)) == 20


def test_three_processes_share_one_cap(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    team = unique_team()
    rules = budget_cap(team, "1.00", "CalendarMonth")
    env, store = shared(services)
    bundle = metered_bundle(tmp_path / "b", team, rules)
    gateways = [fresh_gateway(bundle=bundle, env=env, store=store) for _ in range(3)]
    key = gateways[0].key(team, env=env)
    fakes.anthropic_us.script(METERED_UPSTREAM, *[Reply(delay=1.0) for _ in range(100)])
    responses = asyncio.run(fire([g.url for g in gateways], key, 99))
    assert [r.status_code for r in responses].count(200) == 20
    assert sum(row[3] for row in ledger_rows(services, team)) == 20 * ACTUAL


def test_embedded_cap_holds_under_concurrency_too(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    rules = budget_cap(team, "0.50", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    fakes.anthropic_us.script(METERED_UPSTREAM, *[Reply(delay=1.0) for _ in range(40)])
    responses = asyncio.run(fire([gateway.url], gateway.key(team), 40))
    assert [r.status_code for r in responses].count(200) == 10


# --- rates and quotas -------------------------------------------------------------------------


def test_rpm_is_exact_under_concurrency(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    team = unique_team()
    rules = {f"{team}-rate": {"subject": {"team": team}, "rate": {"rpm": 10}}}
    env, store = shared(services)
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules), env=env, store=store)
    key = gateway.key(team, env=env)
    responses = asyncio.run(fire([gateway.url], key, 30))  # rate windows slide: no minute edge to avoid
    assert [r.status_code for r in responses].count(200) == 10
    limited = next(r for r in responses if r.status_code == 429)
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert 0 < int(limited.headers["retry-after"]) <= 60


def test_team_and_user_limits_both_apply(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    rules = {
        f"{team}-rate": {"subject": {"team": team}, "rate": {"rpm": 5}},
        f"{team}-alice": {"subject": {"team": team, "user": "alice"}, "rate": {"rpm": 2}},
    }
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    alice, bob = gateway.key(team, "alice"), gateway.key(team, "bob")
    post = lambda key: httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code  # noqa: E731
    assert [post(alice) for _ in range(3)] == [200, 200, 429]  # alice's own 2 per minute
    assert [post(bob) for _ in range(4)] == [200, 200, 200, 429]  # the team's 5, alice's 2 included


def test_daily_token_quota_counts_tokens(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    # A bound is input (bytes of text, an upper bound) + max_tokens; 2 requests fit 2,200 tokens.
    rules = {f"{team}-quota": {"subject": {"team": team}, "quota": {"tokens_per_day": 2200}}}
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    key = gateway.key(team)
    statuses = [httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code for _ in range(3)]
    # settled at 120 tokens each, so the quota admits again what the bounds held back
    assert statuses == [200, 200, 200]
    tight = {f"{team}-quota": {"subject": {"team": team}, "quota": {"tokens_per_day": 1100}}}
    gateway2 = fresh_gateway(bundle=metered_bundle(tmp_path / "b2", team, tight))
    key2 = gateway2.key(team)
    fakes.anthropic_us.script(METERED_UPSTREAM, Reply(output_tokens=1000))
    first = httpx.post(f"{gateway2.url}/v1/messages", json=BODY, headers=headers(key2))
    second = httpx.post(f"{gateway2.url}/v1/messages", json=BODY, headers=headers(key2))
    assert first.status_code == 200 and second.status_code == 429
    assert second.json()["error"]["message"].startswith("the daily token quota limit is reached")


# --- warnings, soft caps, thresholds, the audit trail -----------------------------------------------


def test_warn_header_thresholds_once_and_audit(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    rules = {
        f"{team}-month": {"subject": {"team": team}, "budget": {"limit_usd": "0.10", "period": "CalendarMonth", "thresholds": [1, 2]}},
        f"{team}-day-warn": {"subject": {"team": team}, "budget": {"limit_usd": "0.04", "period": "CalendarDay"}, "failure_policy": "Warn"},
    }
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    client = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key(team), max_retries=0)
    responses = [client.messages.with_raw_response.create(**BODY) for _ in range(3)]
    assert all(r.status_code == 200 for r in responses)
    assert "limit passed: cost/day on team:" in responses[0].headers["x-portcullis-budget-warning"]
    records = gateway.settled()
    fired = [(r["threshold"], r["request_id"]) for r in records if r["event"] == "budget_threshold"]
    assert [t for t, _ in fired] == [1, 2]  # each once, as spend passed 1% and then 2% of $0.10
    started = next(r for r in records if r["event"] == "request_started")
    assert started["reservation"]["bound_micro_usd"] == BOUND and started["reservation"]["estimate"] == "upper-bound:utf8-bytes"
    assert started["decision"]["rules"] == sorted(rules)
    finished = gateway.outcome(started["request_id"])
    assert finished["settlement"] == "settled" and finished["cost_micro_usd"] == ACTUAL


def test_soft_cap_lets_the_crossing_request_finish(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    rules = {f"{team}-soft": {"subject": {"team": team}, "budget": {"limit_usd": "0.0015", "period": "CalendarDay", "hard_cap": False}}}
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    key = gateway.key(team)
    statuses = [httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code for _ in range(3)]
    assert statuses == [200, 200, 402]  # $0.001 spent < $0.0015: the second runs and crosses it


def test_exhausted_budget_refusal_in_openai_format(tmp_path: Path, fresh_gateway) -> None:
    """The first call fits the $0.05 cap exactly and spends $0.001; the second's bound no
    longer fits until the day ends, which retry-after says."""
    team = unique_team()
    rules = budget_cap(team, "0.05", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)
    ask = {"model": METERED, "max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}
    assert client.chat.completions.create(**ask).choices[0].message.content
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(**ask)
    assert refused.value.status_code == 402
    assert refused.value.body["type"] == "insufficient_quota" and refused.value.body["code"] == "budget_exceeded"
    assert 0 < int(refused.value.response.headers["retry-after"]) <= 86400


def test_a_request_bigger_than_the_whole_limit_is_not_invited_to_retry(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    poor, frugal = unique_team(), unique_team()
    rules = {
        f"{poor}-cap": {"subject": {"team": poor}, "budget": {"limit_usd": "0.01", "period": "CalendarDay"}},
        f"{frugal}-tokens": {"subject": {"team": frugal}, "quota": {"tokens_per_day": 500}},
    }
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", poor, rules, extra_teams=(frugal,)))
    ask = {"model": METERED, "max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}
    for team, status in ((poor, 402), (frugal, 400)):  # a $0.05 bound against $0.01; 1,000+ tokens against 500
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(**ask)
        assert refused.value.status_code == status and refused.value.body["code"] == "request_exceeds_limit"
        assert "max_tokens" in refused.value.body["message"] and "retry-after" not in refused.value.response.headers
    assert fakes.anthropic_us.requests_for(METERED_UPSTREAM) == []


def test_unlimited_is_audited_and_serves(tmp_path: Path, fresh_gateway) -> None:
    team = unique_team()
    rules = {f"{team}-free": {"subject": {"team": team}, "unlimited": True}}
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    response = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(gateway.key(team)))
    assert response.status_code == 200
    started = next(r for r in gateway.records_for(response.headers["x-portcullis-request-id"]) if r["event"] == "request_started")
    assert started["decision"]["unlimited"] == [f"{team}-free"] and started["reservation"]["counters"] == []
