"""L3 budget tiers end to end, with the official SDKs against gateway processes: below a
tier nothing changes; once the budget's counter reaches it the tier's substitute
serves, told to the client and kept in the audit log; the tier holds when the counter
falls back (a reservation settled lower) until the period ends; replicas on the
shared store agree; a substitute the team may not use leaves the model as it was."""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from tests.budget_tier_helpers import (
    CHEAP,
    CHEAP_UPSTREAM,
    FORBIDDEN,
    FORBIDDEN_UPSTREAM,
    TIERED,
    TIERED_UPSTREAM,
    TOKENS_PER_PERCENT,
    body,
    tiered_bundle,
    yellow_then_red,
)
from tests.conftest import Fakes, GatewayProcess, Services, wait_for
from tests.fakes import Reply
from tests.governance_helpers import shared, unique_team

pytestmark = pytest.mark.served

FALLBACK = "x-portcullis-model-fallback"


def claude(gateway: GatewayProcess, team: str, env: dict[str, str] | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key(team, env=env), max_retries=0)


def send(gateway: GatewayProcess, team: str, max_tokens: int, env: dict[str, str] | None = None) -> Any:
    response = claude(gateway, team, env).messages.with_raw_response.create(**body(max_tokens))
    assert response.status_code == 200
    return response


def started(gateway: GatewayProcess, response: Any) -> dict[str, Any]:
    request_id = response.headers["x-portcullis-request-id"]
    return next(r for r in gateway.records_for(request_id) if r["event"] == "request_started")


def assert_untiered(gateway: GatewayProcess, response: Any) -> None:
    assert FALLBACK not in response.headers
    assert response.parse().model == TIERED_UPSTREAM
    record = started(gateway, response)
    assert record["model"] == TIERED and "routing" not in record["decision"]
    assert "model_substituted_from" not in gateway.outcome(response.headers["x-portcullis-request-id"])


def assert_yellow(gateway: GatewayProcess, response: Any, budget: str) -> None:
    assert response.headers[FALLBACK] == TIERED
    assert response.parse().model == CHEAP_UPSTREAM
    record = started(gateway, response)
    assert record["model"] == CHEAP
    assert record["decision"]["routing"] == [
        {"layer": "budget_tier", "from": TIERED, "to": CHEAP, "applied": True, "tier": "yellow", "budget": budget, "threshold_percent": 80}
    ]
    outcome = gateway.outcome(response.headers["x-portcullis-request-id"])
    assert outcome["model_substituted_from"] == TIERED and outcome["substitution_layer"] == "budget_tier"


def while_in_flight(fakes: Fakes, start: Any, then: Any) -> Any:
    """Run ``start`` (a slow request) on a thread; once its reservation reached the
    provider, run ``then``; return what ``then`` returned after ``start`` finished."""
    before = len(fakes.anthropic_us.requests_for(TIERED_UPSTREAM))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            start()
        except BaseException as error:  # surfaced below
            errors.append(error)

    slow = threading.Thread(target=run)
    slow.start()
    deadline = time.monotonic() + 10
    while len(fakes.anthropic_us.requests_for(TIERED_UPSTREAM)) == before:
        assert time.monotonic() < deadline, "the slow request never reached the provider"
        time.sleep(0.02)
    result = then()
    slow.join()
    assert not errors
    return result


def embedded_counter(gateway: GatewayProcess, team: str) -> tuple[int, int]:
    with sqlite3.connect(gateway.directory / "state.db") as db:
        return db.execute("SELECT value, peak FROM counters WHERE key LIKE ?", (f"team:{team}|cost|%",)).fetchone()


def test_a_tier_applies_once_reached_and_holds_when_the_counter_falls(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    gateway = fresh_gateway(bundle=tiered_bundle(tmp_path / "b", {team: yellow_then_red()}))
    fakes.anthropic_us.script(
        TIERED_UPSTREAM,
        Reply(output_tokens=79 * TOKENS_PER_PERCENT),  # settles at 79 % of the budget
        Reply(output_tokens=1),
        Reply(output_tokens=1, delay=2.0),  # holds 2 % more while in flight
    )
    send(gateway, team, 79 * TOKENS_PER_PERCENT)
    assert_untiered(gateway, send(gateway, team, 10))  # 79 %: no tier

    probe = while_in_flight(fakes, lambda: send(gateway, team, 2 * TOKENS_PER_PERCENT), lambda: send(gateway, team, 10))
    assert_yellow(gateway, probe, f"{team}-cap")  # 81 % while the slow request was open

    value, peak = embedded_counter(gateway, team)
    assert value < 80 * 10_000 <= 81 * 10_000 <= peak  # settled lower: the counter is back at 79 %
    after = send(gateway, team, 10)
    assert_yellow(gateway, after, f"{team}-cap")  # ... and the tier holds
    assert not fakes.anthropic_us.requests_for(FORBIDDEN_UPSTREAM)


def seed_counter(gateway: GatewayProcess, key: str, value: int) -> None:
    """A counter instance as the ledger would have left it (value and peak)."""
    with sqlite3.connect(gateway.directory / "state.db") as db:
        db.execute("INSERT INTO counters (key, value, expires_at, peak) VALUES (?, ?, '2999-01-01', ?)", (key, value, value))


def test_a_new_period_starts_without_the_last_ones_tier(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    gateway = fresh_gateway(bundle=tiered_bundle(tmp_path / "b", {team: yellow_then_red()}, period="CalendarDay"))
    today = dt.datetime.now(dt.UTC).date()
    seed_counter(gateway, f"team:{team}|cost|d{today - dt.timedelta(days=1):%Y-%m-%d}", 1_000_000)  # yesterday: 100 %
    assert_untiered(gateway, send(gateway, team, 10))
    seed_counter(gateway, f"team:{team}|cost|d{today + dt.timedelta(days=1):%Y-%m-%d}", 850_000)  # tomorrow's instance, once it comes
    assert_untiered(gateway, send(gateway, team, 10))
    with sqlite3.connect(gateway.directory / "state.db") as db:  # today's instance reaching 85 % is what counts
        db.execute("UPDATE counters SET peak = 850000 WHERE key = ?", (f"team:{team}|cost|d{today:%Y-%m-%d}",))
    assert_yellow(gateway, send(gateway, team, 10), f"{team}-cap")


def test_a_substitute_the_team_may_not_use_leaves_the_model(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    tiers = [{"name": "red", "threshold_percent": 1, "substitutions": {TIERED: FORBIDDEN}}]
    gateway = fresh_gateway(bundle=tiered_bundle(tmp_path / "b", {team: tiers}))
    fakes.anthropic_us.script(TIERED_UPSTREAM, Reply(output_tokens=TOKENS_PER_PERCENT))
    send(gateway, team, TOKENS_PER_PERCENT)  # 1 %
    response = send(gateway, team, 10)
    assert FALLBACK not in response.headers and response.parse().model == TIERED_UPSTREAM
    record = started(gateway, response)
    assert record["model"] == TIERED
    assert record["decision"]["routing"] == [
        {
            "layer": "budget_tier",
            "from": TIERED,
            "to": FORBIDDEN,
            "applied": False,
            "tier": "red",
            "reasons": ["model_not_allowed"],
            "budget": f"{team}-cap",
            "threshold_percent": 1,
        }
    ]
    assert "model_substituted_from" not in gateway.outcome(response.headers["x-portcullis-request-id"])
    assert not fakes.anthropic_us.requests_for(FORBIDDEN_UPSTREAM)


def test_replicas_on_the_shared_store_agree_and_keep_the_tier(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    team = unique_team()
    env, store = shared(services)
    bundle = tiered_bundle(tmp_path / "b", {team: yellow_then_red()})
    first, second = fresh_gateway(bundle=bundle, env=env, store=store), fresh_gateway(bundle=bundle, env=env, store=store)
    fakes.anthropic_us.script(TIERED_UPSTREAM, Reply(output_tokens=79 * TOKENS_PER_PERCENT), Reply(output_tokens=1), Reply(output_tokens=1, delay=2.0))
    send(first, team, 79 * TOKENS_PER_PERCENT, env)
    assert_untiered(second, send(second, team, 10, env))

    probe = while_in_flight(fakes, lambda: send(first, team, 2 * TOKENS_PER_PERCENT, env), lambda: send(second, team, 10, env))
    assert_yellow(second, probe, f"{team}-cap")  # the other replica's open reservation put it at 81 %

    client = redis.Redis.from_url(services.redis_url)
    (key,) = [k for k in client.scan_iter(match=f"{services.redis_prefix}counter:team:{team}|cost|*") if not k.endswith(b":peak")]
    assert int(client.get(key)) < 80 * 10_000 <= 81 * 10_000 <= int(client.get(key + b":peak"))
    for gateway in (first, second):
        assert_yellow(gateway, send(gateway, team, 10, env), f"{team}-cap")

    # Redis loses the counters (a restart without persistence): the peak comes back from PostgreSQL.
    client.delete(key, key + b":peak")
    chat = openai.OpenAI(base_url=f"{second.url}/v1", api_key=second.key(team, env=env), max_retries=0)
    reply = chat.chat.completions.with_raw_response.create(model=TIERED, max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert reply.headers[FALLBACK] == TIERED
    assert started(second, reply)["decision"]["routing"][0]["tier"] == "yellow"
    assert int(client.get(key + b":peak")) >= 81 * 10_000


def test_a_revision_that_raises_the_limit_applies_from_the_next_request(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    bundle = tiered_bundle(tmp_path / "b", {team: yellow_then_red()}, revision="tiers-1")
    gateway = fresh_gateway(bundle=bundle)
    fakes.anthropic_us.script(TIERED_UPSTREAM, Reply(output_tokens=85 * TOKENS_PER_PERCENT))
    send(gateway, team, 85 * TOKENS_PER_PERCENT)
    assert_yellow(gateway, send(gateway, team, 10), f"{team}-cap")
    tiered_bundle(bundle, {team: yellow_then_red()}, revision="tiers-2", limit_usd="2.00")  # the same peak is now 42 %
    assert wait_for(lambda: httpx.get(f"{gateway.url}/readyz").json()["bundle"]["revision"] == "tiers-2")
    assert_untiered(gateway, send(gateway, team, 10))
