"""Two-phase governance end to end: budgets, rates and quotas reserved before dispatch
and settled after, against the embedded ledger and against real Redis + PostgreSQL,
under concurrency and across gateway processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psycopg
import pytest

from tests.bundles import CATALOG, TENANTS, deep_copy, target, write_bundle
from tests.conftest import Fakes, Services, private_redis
from tests.fakes import CutStream, Fail, Reply

pytestmark = pytest.mark.served

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


# --- failures: killed processes, cut streams, Redis lost or gone ------------------------------------


def test_killed_process_leaves_an_open_reservation_that_reconcile_resolves(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    team = unique_team()
    rules = budget_cap(team, "1.00", "CalendarMonth")
    env, store = shared(services)
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules), env=env, store=store)
    key = gateway.key(team, env=env)
    fakes.anthropic_us.script(METERED_UPSTREAM, Reply(text="a slow answer in many parts", event_delay=1.0))
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json={**BODY, "stream": True}, headers=headers(key), timeout=30) as response:
        assert next(response.iter_lines()).startswith("event: message_start")
        gateway.signal(signal.SIGKILL)
        gateway.process.wait()
    [(reservation_id, state, _, cost)] = ledger_rows(services, team)
    assert state == "open" and cost == BOUND
    reconciled = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "ledger", "reconcile", "--config", str(gateway.config_path), "--older-than", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "FAKE_UPSTREAM_KEY": "x"},
        timeout=60,
    )
    assert reconciled.returncode == 0, reconciled.stderr
    assert f"{reservation_id}  was open  charged {BOUND} micro-USD" in reconciled.stdout
    assert ledger_rows(services, team)[0][1] == "reconciled"
    again = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "ledger", "reconcile", "--config", str(gateway.config_path), "--older-than", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "FAKE_UPSTREAM_KEY": "x"},
        timeout=60,
    )
    assert "reconciled 0 reservations" in again.stdout


def test_cut_stream_stays_charged_until_reconciled_with_provider_usage(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    rules = budget_cap(team, "0.10", "CalendarMonth")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    key = gateway.key(team)
    fakes.anthropic_us.script(METERED_UPSTREAM, CutStream(after=4))
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json={**BODY, "stream": True}, headers=headers(key)) as response:
        request_id = response.headers["x-portcullis-request-id"]
        assert "event: error" in response.read().decode()
    outcome = gateway.outcome(request_id)
    assert outcome["event"] == "request_failed" and outcome["settlement"] == "pending"
    # The bound ($0.05) stays charged: one more bound fits under $0.10, a second does not.
    assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code == 200
    assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code == 402
    usage = tmp_path / "usage.jsonl"
    usage.write_text(json.dumps({"request_id": request_id, "input": 10, "output": 30}) + "\n")
    reconciled = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "ledger", "reconcile", "--config", str(gateway.config_path), "--usage", str(usage)],
        capture_output=True,
        text=True,
        env={**os.environ, "FAKE_UPSTREAM_KEY": "x"},
        timeout=60,
    )
    assert f"{request_id}  was pending  charged 1500 micro-USD  (usage from the provider's records)" in reconciled.stdout
    assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code == 200  # the bound was released


def test_counters_come_back_from_the_ledger_after_redis_loses_them(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    team = unique_team()
    rules = budget_cap(team, "0.07", "CalendarMonth")
    prefix = f"{services.redis_prefix}{team}:"
    env, store = shared(services, redis_prefix=prefix)
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules), env=env, store=store)
    key = gateway.key(team, env=env)
    post = lambda: httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code  # noqa: E731
    statuses = [post() for _ in range(22)]
    assert statuses[:21] == [200] * 21 and statuses[21] == 402  # $0.021 spent: one more $0.05 bound no longer fits
    import redis

    client = redis.Redis.from_url(services.redis_url)
    lost = [k for k in client.scan_iter(match=f"{prefix}counter:*")]
    assert lost and client.delete(*lost) == len(lost)  # as if Redis had been flushed
    assert post() == 402  # reloaded from PostgreSQL, not restarted from zero


def test_unreachable_redis_fails_hard_caps_closed_and_loses_nothing(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    with private_redis() as redis_url:
        capped, free = unique_team(), unique_team()
        rules = {f"{capped}-cap": {"subject": {"team": capped}, "budget": {"limit_usd": "5", "period": "CalendarMonth"}}}
        env = {"DATABASE_URL": services.database_url, "REDIS_URL": redis_url}
        gateway = fresh_gateway(
            bundle=metered_bundle(tmp_path / "b", capped, rules, extra_teams=(free,)), env=env, store={"kind": "shared"}, auth={"key_cache_seconds": 300}
        )
        capped_key, free_key = gateway.key(capped, env=env), gateway.key(free, env=env)
        for key in (capped_key, free_key):  # verified once, while Redis is up
            assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code == 200
    refused = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(capped_key))
    assert refused.status_code == 503 and "limits cannot be checked" in refused.json()["error"]["message"]
    served = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(free_key))
    assert served.status_code == 200
    assert [row[1:] for row in ledger_rows(services, free)] == [("settled", 120, ACTUAL), ("settled", 120, ACTUAL)]  # recorded all the same
    assert len(ledger_rows(services, capped)) == 1


# --- provider keys as supply ---------------------------------------------------------------------


def provider_with_keys(fakes: Fakes, **limits: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": "anthropic-us",
            "type": "anthropic",
            "base_url": fakes.anthropic_us.url,
            "cooldown_seconds": 30,
            "keys": [{"name": "k1", "api_key_env": "KEY_ONE", **limits}, {"name": "k2", "api_key_env": "KEY_TWO", **limits}],
        },
        {"name": "anthropic-eu", "type": "anthropic", "base_url": fakes.anthropic_eu.url, "api_key_env": "FAKE_UPSTREAM_KEY"},
        {"name": "openai-main", "type": "openai", "base_url": f"{fakes.openai_main.url}/v1", "api_key_env": "FAKE_UPSTREAM_KEY"},
    ]


def test_keys_are_picked_by_capacity(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    fakes.anthropic_us.accepted_keys = {"sk-one", "sk-two"}
    gateway = fresh_gateway(env={"KEY_ONE": "sk-one", "KEY_TWO": "sk-two"}, providers=provider_with_keys(fakes, rpm=1))
    key = gateway.key("eng")
    away_from_minute_edge()
    opus = {**BODY, "model": "claude-opus-4-1"}  # one target only: anthropic-us
    statuses = [httpx.post(f"{gateway.url}/v1/messages", json=opus, headers=headers(key)) for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    assert sorted(r.headers["x-api-key"] for r in fakes.anthropic_us.received) == ["sk-one", "sk-two"]
    assert 0 < int(statuses[2].headers["retry-after"]) <= 60
    assert gateway.outcome(statuses[2].headers["x-portcullis-request-id"])["attempts"][0]["outcome"] == "no_capacity"


def test_a_cooling_key_is_skipped_by_every_replica(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    fakes.anthropic_us.accepted_keys = {"sk-one", "sk-two"}
    env, store = shared(services, redis_prefix=f"{services.redis_prefix}{uuid.uuid4().hex[:6]}:")
    env = {**env, "KEY_ONE": "sk-one", "KEY_TWO": "sk-two"}
    first = fresh_gateway(env=env, store=store, providers=provider_with_keys(fakes))
    second = fresh_gateway(env=env, store=store, providers=provider_with_keys(fakes))
    key = first.key("eng", env=env)
    opus = {**BODY, "model": "claude-opus-4-1"}
    fakes.anthropic_us.script("claude-opus-4-1-20250805", Fail(429, retry_after=30))
    assert httpx.post(f"{first.url}/v1/messages", json=opus, headers=headers(key)).status_code == 429
    cooled = fakes.anthropic_us.received[0].headers["x-api-key"]
    for _ in range(3):  # the other replica never sends to the cooling key
        assert httpx.post(f"{second.url}/v1/messages", json=opus, headers=headers(key)).status_code == 200
    assert all(r.headers["x-api-key"] != cooled for r in fakes.anthropic_us.received[1:])


def test_cooling_keys_everywhere_fail_over_to_the_next_target(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    fakes.anthropic_us.accepted_keys = {"sk-one", "sk-two"}
    gateway = fresh_gateway(env={"KEY_ONE": "sk-one", "KEY_TWO": "sk-two"}, providers=provider_with_keys(fakes))
    key = gateway.key("eng")
    fakes.anthropic_us.script("claude-sonnet-4-5-20250929", Fail(429, retry_after=30), Fail(429, retry_after=30))
    for _ in range(2):
        httpx.post(f"{gateway.url}/v1/messages", json={**BODY, "model": "claude-sonnet-4-5"}, headers=headers(key))
    fakes.anthropic_eu.reset()
    response = httpx.post(f"{gateway.url}/v1/messages", json={**BODY, "model": "claude-sonnet-4-5"}, headers=headers(key))
    assert response.status_code == 200 and len(fakes.anthropic_eu.received) == 1
    attempts = gateway.outcome(response.headers["x-portcullis-request-id"])["attempts"]
    assert [a["outcome"] for a in attempts] == ["no_capacity", "ok"]


def test_a_request_that_fails_everywhere_releases_its_reservation(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    rules = budget_cap(team, "0.06", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    key = gateway.key(team)
    fakes.anthropic_us.script(METERED_UPSTREAM, Fail(503), Fail(400))
    for expected in (502, 400, 200, 200):  # failures cost nothing and hold nothing back
        response = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key))
        assert response.status_code == expected, response.text
        assert gateway.outcome(response.headers["x-portcullis-request-id"]).get("settlement") in ("released", "settled")


def test_a_timeout_keeps_the_bound_pending(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    from tests.fakes import Hang

    team = unique_team()
    rules = budget_cap(team, "0.06", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    key = gateway.key(team)
    fakes.anthropic_us.script(METERED_UPSTREAM, Hang(5))  # the provider may have done, and billed, the work
    timed_out = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key), timeout=30)
    assert timed_out.status_code == 504
    assert gateway.outcome(timed_out.headers["x-portcullis-request-id"])["settlement"] == "pending"
    assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code == 402


# --- the bound: what a request may cost, and keeping the provider to it ---------------------------


def test_hard_limits_cap_the_output_the_provider_may_produce(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """A bound is only a bound if the provider is held to it: under a hard limit the
    gateway sets the output limit it reserved for; without one the body goes unchanged."""
    capped, free = unique_team(), unique_team()
    rules = {f"{capped}-cap": {"subject": {"team": capped}, "budget": {"limit_usd": "1.00", "period": "CalendarDay"}}}
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", capped, rules, extra_teams=(free,)))
    for team in (capped, free):
        chat = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)
        chat.chat.completions.create(model=METERED_CHAT, messages=[{"role": "user", "content": "no limit given"}])
        chat.chat.completions.create(model=METERED_CHAT, max_tokens=5000, messages=[{"role": "user", "content": "over the model's"}])
        messages = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key(team), max_retries=0)
        messages.messages.create(model=METERED, max_tokens=5000, messages=[{"role": "user", "content": "over the model's"}])
    sent = [r.json for r in fakes.openai_main.requests_for(METERED_CHAT_UPSTREAM)]
    assert [(s.get("max_tokens"), s.get("max_completion_tokens")) for s in sent] == [(None, 1000), (1000, None), (None, None), (5000, None)]
    assert [r.json["max_tokens"] for r in fakes.anthropic_us.requests_for(METERED_UPSTREAM)] == [1000, 5000]


def test_every_choice_counts_in_the_bound(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """n=2 may produce twice the output: $0.10 fits a $0.12 cap, n=3's $0.15 does not."""
    team = unique_team()
    rules = budget_cap(team, "0.12", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)
    ask = {"model": METERED_CHAT, "max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}
    assert client.chat.completions.create(n=2, **ask).choices
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(n=3, **ask)
    assert refused.value.status_code == 402 and refused.value.body["code"] == "request_exceeds_limit"
    assert len(fakes.openai_main.requests_for(METERED_CHAT_UPSTREAM)) == 1


def test_an_answer_without_usage_keeps_its_bound_pending(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """A provider that reports no usage is not assumed free: the bound stays charged
    until reconciliation finds the real figure, and the next call meets the cap."""
    team = unique_team()
    rules = budget_cap(team, "0.06", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)
    ask = {"model": METERED_CHAT, "max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}
    fakes.openai_main.script(METERED_CHAT_UPSTREAM, Reply(reports_usage=False), Reply(reports_usage=False))
    answered = client.chat.completions.with_raw_response.create(**ask)
    assert answered.parse().choices[0].message.content
    assert gateway.outcome(answered.headers["x-portcullis-request-id"])["settlement"] == "pending"
    streamed = [chunk for chunk in client.chat.completions.create(stream=True, **{**ask, "max_tokens": 100})]
    assert streamed and gateway.settled()[-1]["settlement"] == "pending"
    with pytest.raises(openai.APIStatusError) as refused:  # $0.05 + $0.005 held; another $0.05 does not fit
        client.chat.completions.create(**ask)
    assert refused.value.status_code == 402 and refused.value.body["code"] == "budget_exceeded"


def test_a_client_gone_before_the_first_byte_still_settles(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    rules = budget_cap(team, "1.00", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    fakes.anthropic_us.script(METERED_UPSTREAM, Reply(delay=1.0, event_delay=0.2))
    key = gateway.key(team)
    with pytest.raises(httpx.ReadTimeout), httpx.stream("POST", f"{gateway.url}/v1/messages", json={**BODY, "stream": True}, headers=headers(key), timeout=0.3):
        pass
    time.sleep(1.5)  # the provider answers after the client left
    [outcome] = [r for r in gateway.settled() if r["event"] in ("request_cancelled", "request_finished", "request_failed")]
    assert outcome["event"] == "request_cancelled" and outcome["settlement"] == "pending"
