"""Intent tiers (routing layer L4) end to end: the official SDKs over real HTTP through
gateway processes whose bundle carries the reference router (light: haiku, standard:
sonnet, frontier: opus). A conversation's first turn decides its tier, and the tier is
pinned to the session: later turns, other replicas on the shared store, and a
conversation that only shares the client's session id keep it."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

import anthropic
import openai
import pytest

from tests.bundles import TENANTS, target, write_bundle
from tests.conftest import Fakes, GatewayProcess, Services
from tests.fakes import Fail, Reply
from tests.fakes.anthropic_messages import COUNT_PATH
from tests.intent_helpers import FRONTIER_UPSTREAM, intent_catalog, intent_data, router, write_intent_bundle

pytestmark = pytest.mark.served

SONNET_UPSTREAM = "claude-sonnet-4-5-20250929"
HAIKU_UPSTREAM = "claude-haiku-4-5-20251001"
FALLBACK = "x-portcullis-model-fallback"
TRIVIAL = "fix the typo in README.md: 'recieve' should be 'receive'"
HARD = "Design the architecture for a zero-downtime migration of our billing ledger to a sharded schema, with the trade-offs."


def claude(gateway: GatewayProcess, team: str = "eng", env: dict[str, str] | None = None, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key(team, None, env), max_retries=0, default_headers=headers or None)


def started(gateway: GatewayProcess, request_id: str) -> dict:
    return next(r for r in gateway.records_for(request_id) if r["event"] == "request_started")


def intent_view(gateway: GatewayProcess, request_id: str) -> dict:
    [record] = [layer for layer in started(gateway, request_id)["decision"]["routing"] if layer["layer"] == "intent"]
    return record


def user(text: str) -> dict:
    return {"role": "user", "content": text}


@pytest.fixture
def routed(tmp_path: Path, fresh_gateway) -> GatewayProcess:
    return fresh_gateway(bundle=write_intent_bundle(tmp_path / "bundle"))


def test_a_trivial_first_turn_goes_to_the_light_tier_and_a_hard_one_to_the_frontier(routed: GatewayProcess, fakes: Fakes) -> None:
    light = claude(routed).messages.with_raw_response.create(model="sonnet", max_tokens=16, messages=[user(TRIVIAL)])
    assert light.status_code == 200 and light.parse().model == HAIKU_UPSTREAM
    assert light.headers[FALLBACK] == "claude-sonnet-4-5"  # the client is told what it asked for was replaced
    assert len(fakes.anthropic_eu.requests_for(HAIKU_UPSTREAM)) == 1 and not fakes.anthropic_us.requests_for(SONNET_UPSTREAM)
    request_id = light.headers["x-portcullis-request-id"]
    outcome = routed.outcome(request_id)
    assert outcome["substitution_layer"] == "intent" and outcome["model_substituted_from"] == "claude-sonnet-4-5"
    assert outcome["served"]["canonical_model"] == "claude-haiku-4-5"
    view = intent_view(routed, request_id)
    assert {key: view[key] for key in ("tier", "pinned", "router", "by", "applied")} == {
        "tier": "light",
        "pinned": False,
        "router": "reference",
        "by": "rule",
        "applied": True,
    }
    assert "features" not in started(routed, request_id)["decision"] and "keywords" not in view

    # Another client, another protocol: the frontier tier through OpenAI Chat.
    chat = openai.OpenAI(base_url=f"{routed.url}/v1", api_key=routed.key("eng"), max_retries=0)
    hard = chat.chat.completions.with_raw_response.create(model="sonnet", max_tokens=16, messages=[user(HARD)])
    assert hard.headers[FALLBACK] == "claude-sonnet-4-5"
    assert len(fakes.anthropic_us.requests_for(FRONTIER_UPSTREAM)) == 1
    view = intent_view(routed, hard.headers["x-portcullis-request-id"])
    assert (view["tier"], view["to"]) == ("frontier", "claude-opus-4-8")


def test_a_standard_task_keeps_the_requested_model_and_records_its_tier(routed: GatewayProcess, fakes: Fakes) -> None:
    response = claude(routed).messages.with_raw_response.create(
        model="sonnet", max_tokens=16, messages=[user("Write a Python function that parses ISO 8601 durations, with unit tests for the edge cases.")]
    )
    assert FALLBACK not in response.headers and len(fakes.anthropic_us.requests_for(SONNET_UPSTREAM)) == 1
    request_id = response.headers["x-portcullis-request-id"]
    view = intent_view(routed, request_id)
    assert (view["tier"], view["from"], view["to"], view["by"]) == ("standard", "claude-sonnet-4-5", "claude-sonnet-4-5", "default")
    assert "substitution_layer" not in routed.outcome(request_id)


def test_the_tier_stays_pinned_across_turns_even_when_a_later_turn_looks_different(routed: GatewayProcess, fakes: Fakes) -> None:
    client = claude(routed)
    first = [user(TRIVIAL)]
    client.messages.create(model="sonnet", max_tokens=16, messages=first)
    later = [*first, {"role": "assistant", "content": "Done."}, user(HARD)]
    response = client.messages.with_raw_response.create(model="sonnet", max_tokens=16, messages=later)
    assert response.parse().model == HAIKU_UPSTREAM and not fakes.anthropic_us.requests_for(FRONTIER_UPSTREAM)
    view = intent_view(routed, response.headers["x-portcullis-request-id"])
    assert (view["tier"], view["pinned"], view["by"]) == ("light", True, "pin")


@pytest.mark.parametrize("header", ["x-portcullis-session-id", "x-claude-code-session-id"])
def test_the_client_session_id_pins_the_tier_whatever_the_messages(header: str, routed: GatewayProcess, fakes: Fakes) -> None:
    session = f"conv-{uuid.uuid4().hex}"
    client = claude(routed, **{header: session})
    client.messages.create(model="sonnet", max_tokens=16, messages=[user(HARD)])
    # A compacted conversation: its first message changed, its session did not.
    response = client.messages.with_raw_response.create(model="sonnet", max_tokens=16, messages=[user("thanks!")])
    assert response.parse().model == FRONTIER_UPSTREAM
    assert intent_view(routed, response.headers["x-portcullis-request-id"])["pinned"] is True
    # Without the header, the same text is a conversation of its own.
    fresh = claude(routed).messages.create(model="sonnet", max_tokens=16, messages=[user("thanks!")])
    assert fresh.model == HAIKU_UPSTREAM


def test_replicas_on_the_shared_store_agree_on_the_pinned_tier(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    env = {"DATABASE_URL": services.database_url, "REDIS_URL": services.redis_url}
    shared = {"store": {"kind": "shared", "redis_prefix": services.redis_prefix}}
    bundle = write_intent_bundle(tmp_path / "bundle")
    one, two = fresh_gateway(bundle=bundle, env=env, **shared), fresh_gateway(bundle=bundle, env=env, **shared)
    key = one.key("eng", None, env=env)
    session = {"x-portcullis-session-id": f"conv-{uuid.uuid4().hex}"}
    first = [user(TRIVIAL)]
    anthropic.Anthropic(base_url=one.url, api_key=key, max_retries=0, default_headers=session).messages.create(model="sonnet", max_tokens=16, messages=first)
    later = [*first, {"role": "assistant", "content": "Done."}, user(HARD)]
    response = anthropic.Anthropic(base_url=two.url, api_key=key, max_retries=0, default_headers=session).messages.with_raw_response.create(
        model="sonnet", max_tokens=16, messages=later
    )
    assert response.parse().model == HAIKU_UPSTREAM  # the other replica's first-turn decision
    view = intent_view(two, response.headers["x-portcullis-request-id"])
    assert (view["tier"], view["pinned"]) == ("light", True)
    # And without a session id, the prefix key reaches the same pin from either replica.
    anthropic.Anthropic(base_url=two.url, api_key=key, max_retries=0).messages.create(model="sonnet", max_tokens=16, messages=[user(HARD)])
    again = anthropic.Anthropic(base_url=one.url, api_key=key, max_retries=0).messages.create(
        model="sonnet", max_tokens=16, messages=[user(HARD), {"role": "assistant", "content": "Plan follows."}, user("thanks")]
    )
    assert again.model == FRONTIER_UPSTREAM


def test_a_tier_model_the_team_may_not_use_keeps_the_requested_model(routed: GatewayProcess, fakes: Fakes) -> None:
    response = claude(routed, "sonnet-only").messages.with_raw_response.create(model="sonnet", max_tokens=16, messages=[user(TRIVIAL)])
    assert response.status_code == 200 and response.parse().model == SONNET_UPSTREAM
    assert FALLBACK not in response.headers and not fakes.anthropic_eu.requests_for(HAIKU_UPSTREAM)
    request_id = response.headers["x-portcullis-request-id"]
    view = intent_view(routed, request_id)
    assert (view["tier"], view["to"], view["applied"], view["reasons"]) == ("light", "claude-haiku-4-5", False, ["model_not_allowed"])
    assert "substitution_layer" not in routed.outcome(request_id)


def test_a_token_count_is_not_routed(routed: GatewayProcess, fakes: Fakes) -> None:
    response = claude(routed).messages.with_raw_response.count_tokens(model="sonnet", messages=[user(TRIVIAL)])
    assert response.status_code == 200 and FALLBACK not in response.headers
    [sent] = [r for r in fakes.anthropic_us.received if r.path == COUNT_PATH]
    assert sent.json["model"] == SONNET_UPSTREAM and not fakes.anthropic_eu.received
    assert "routing" not in started(routed, response.headers["x-portcullis-request-id"])["decision"]


# --- the classifier: a billable guess the policy weighs -------------------------------

CLASSIFIER_UPSTREAM = "tier-classifier-8b"


def classifier_bundle(directory: Path, min_confidence: float = 0.8, team_models: list[str] | None = None) -> Path:
    """The reference router with a classifier on an internal target of the OpenAI fake."""
    catalog = intent_catalog()
    catalog["models"]["tier-classifier"] = {"targets": [target("openai-main", CLASSIFIER_UPSTREAM, "us-east-1", internal=True)]}
    catalog["prices"].append(
        {"provider": "openai-main", "model": CLASSIFIER_UPSTREAM, "effective_from": "2025-01-01", "usd_per_mtok": {"input": "1", "output": "2"}}
    )
    tenants = copy.deepcopy(TENANTS)
    tenants["teams"]["eng"]["models"] = team_models or ["claude-*", "tier-*"]
    intent = intent_data([router(classifier={"model": "tier-classifier", "min_confidence": min_confidence, "max_tokens": 24})])
    return write_bundle(directory, tenants=tenants, catalog=catalog, revision="intent-classifier", sections={"intent": intent})


def test_a_confident_classifier_chooses_the_tier_and_is_charged(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=classifier_bundle(tmp_path / "bundle"))
    fakes.openai_main.script(CLASSIFIER_UPSTREAM, Reply(text='{"tier": "frontier", "confidence": 0.93}', input_tokens=50, output_tokens=10))
    response = claude(gateway).messages.with_raw_response.create(model="sonnet", max_tokens=16, messages=[user(TRIVIAL)])
    assert response.parse().model == FRONTIER_UPSTREAM  # the rules alone would have said light
    [asked] = fakes.openai_main.requests_for(CLASSIFIER_UPSTREAM)
    assert TRIVIAL in json.dumps(asked.json) and "frontier: claude-opus-4-8; light: claude-haiku-4-5; standard: claude-sonnet-4-5" in json.dumps(asked.json)
    request_id = response.headers["x-portcullis-request-id"]
    view = intent_view(gateway, request_id)
    assert (view["tier"], view["by"]) == ("frontier", "classifier")
    outcome = gateway.outcome(request_id)
    assert outcome["charged_micro_usd"] == outcome["cost_micro_usd"] + 70  # the sub-call is on the request's bill: 50 in at $1, 10 out at $2 per Mtok
    # The tier is pinned: the next turn asks no classifier.
    later = [user(TRIVIAL), {"role": "assistant", "content": "Done."}, user("and the other file?")]
    assert claude(gateway).messages.create(model="sonnet", max_tokens=16, messages=later).model == FRONTIER_UPSTREAM
    assert len(fakes.openai_main.requests_for(CLASSIFIER_UPSTREAM)) == 1


@pytest.mark.parametrize(
    "behaviour",
    [Reply(text='{"tier": "frontier", "confidence": 0.4}'), Reply(text="I think it is hard."), Reply(text='{"tier": "premium", "confidence": 1}'), Fail(500)],
    ids=["unsure", "unreadable", "unknown-tier", "failing"],
)
def test_an_unsure_or_failing_classifier_leaves_the_tier_to_the_rules(behaviour: object, tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=classifier_bundle(tmp_path / "bundle"))
    fakes.openai_main.script(CLASSIFIER_UPSTREAM, *([behaviour] * 3))
    response = claude(gateway).messages.with_raw_response.create(model="sonnet", max_tokens=16, messages=[user(TRIVIAL)])
    assert response.status_code == 200 and response.parse().model == HAIKU_UPSTREAM
    view = intent_view(gateway, response.headers["x-portcullis-request-id"])
    assert (view["tier"], view["by"]) == ("light", "rule")
    assert TRIVIAL not in gateway.logs()


def test_a_team_that_may_not_use_the_classifier_model_is_routed_by_the_rules(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=classifier_bundle(tmp_path / "bundle", team_models=["claude-*"]))
    response = claude(gateway).messages.with_raw_response.create(model="sonnet", max_tokens=16, messages=[user(TRIVIAL)])
    assert response.parse().model == HAIKU_UPSTREAM and not fakes.openai_main.requests_for(CLASSIFIER_UPSTREAM)
    assert intent_view(gateway, response.headers["x-portcullis-request-id"])["by"] == "rule"


def test_a_request_the_policy_refuses_anyway_costs_no_classifier_call(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=classifier_bundle(tmp_path / "bundle", team_models=["claude-haiku-*", "claude-opus-*", "tier-*"]))
    fakes.openai_main.script(CLASSIFIER_UPSTREAM, Reply(text='{"tier": "light", "confidence": 0.99}'))
    with pytest.raises(anthropic.PermissionDeniedError):  # sonnet itself is not granted: refused whatever the tier
        claude(gateway).messages.create(model="sonnet", max_tokens=16, messages=[user(TRIVIAL)])
    assert not fakes.openai_main.requests_for(CLASSIFIER_UPSTREAM)
