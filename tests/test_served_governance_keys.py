"""Provider keys as supply end to end: keys picked by capacity, cooling keys skipped by
every replica, failover, and reservations released or kept on failure and timeout."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Fakes, Services
from tests.fakes import Fail
from tests.governance_helpers import BODY, METERED_UPSTREAM, away_from_minute_edge, budget_cap, headers, metered_bundle, shared, unique_team

pytestmark = pytest.mark.served


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
