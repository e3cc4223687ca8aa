"""A bundle's intent routers are checked before they serve (each problem named), and the
session pin: read for covered requests only, written once the plan decides a tier,
first write winning, and a store that fails costing the pin, never the request."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from portcullis.adapters.intent.routers import BundleRouters
from portcullis.adapters.intent.session_pin import SessionPin, pin_key
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.session_state import MemorySessionState
from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import BundleError, parse_bundle, read_bundle_files
from portcullis.engine.plan import DecisionPlan
from portcullis.engine.routing import Routing
from tests.intent_helpers import intent_data, router, write_intent_bundle
from tests.test_unit_intent_features import exchange_for

PROVIDERS = {"anthropic-us", "anthropic-eu", "openai-main"}
TODAY = dt.date(2026, 11, 30)


def load(tmp_path: Path, intent: dict[str, Any]) -> ActiveBundle:
    return activate(parse_bundle(read_bundle_files(write_intent_bundle(tmp_path / "bundle", intent)), []), PROVIDERS, TODAY)


@pytest.mark.parametrize(
    ("intent", "message"),
    [
        (intent_data([router(), router()]), "intent router 'reference' is defined twice"),
        (intent_data([router(teams=["nobody"])]), "team 'nobody' is not defined in tenants"),
        (intent_data([router(models=["sonnet"])]), "requested model 'sonnet' is not a canonical model of the catalog (an alias of 'claude-sonnet-4-5'"),
        (
            intent_data([router(tiers={"light": "claude-nano", "standard": "claude-sonnet-4-5"})]),
            "tier 'light' names model 'claude-nano', which the catalog does not serve",
        ),
        (intent_data([router(default_tier="medium")]), "default_tier 'medium' is not one of its tiers"),
        (intent_data([router(rules=[{"tier": "ultra", "when": {}}])]), "rule 0 chooses tier 'ultra', which is not one of its tiers"),
        (
            intent_data([router(rules=[{"tier": "light", "when": {"keywords_any": ["nonsense"]}}])]),
            "rule 0 names keyword set 'nonsense', which keyword_sets does not define",
        ),
        (intent_data([router(classifier={"model": "claude-nano", "min_confidence": 0.8})]), "classifier model 'claude-nano' is not served by the catalog"),
        (intent_data(keyword_sets={"bad": ["--"]}, routers=[]), "intent keyword_sets: keyword '--' has no letter or digit"),
        (
            intent_data([router(classifier={"model": "claude-haiku-4-5", "min_confidence": 0.8})]),
            "classifier model 'claude-haiku-4-5' has no internal target (it reads raw text)",
        ),
        (
            intent_data(
                [router(rules=[{"tier": "light", "when": {"max_words": 3}}])],
            ),
            "max_words",
        ),  # the schema names the unknown condition
        (intent_data([router(rules=[{"tier": "light", "when": {"clients": ["vim"]}}])]), "vim"),
    ],
)
def test_a_bundle_with_unusable_routers_is_refused_with_the_reason(tmp_path: Path, intent: dict[str, Any], message: str) -> None:
    with pytest.raises(BundleError) as refused:
        load(tmp_path, intent)
    assert message in str(refused.value)


def test_the_reference_router_activates_and_routes(tmp_path: Path) -> None:
    active = load(tmp_path, intent_data())
    facts = {
        "features": {
            "input_tokens": 64,
            "tools": 0,
            "turns": 1,
            "first_turn": True,
            "reasoning": False,
            "client": "other",
            "text_chars": 20,
            "code": False,
            "keywords": ["mechanical"],
        }
    }
    plan = active.decide({"principal": {"team": "eng", "user": None}, "request": {"model": "sonnet", "requires": []}, "facts": facts})
    assert plan.model == "claude-haiku-4-5" and plan.routing.layer == "intent"
    assert plan.routing.audit_view() == [
        {
            "layer": "intent",
            "from": "claude-sonnet-4-5",
            "to": "claude-haiku-4-5",
            "applied": True,
            "tier": "light",
            "pinned": False,
            "router": "reference",
            "by": "rule",
            "rule": 1,
        }
    ]


def plan_with(record: dict[str, Any] | None) -> DecisionPlan:
    plan = DecisionPlan.from_policy(
        {
            "allow": True,
            "reasons": [{"code": "allowed"}],
            "requested_model": "sonnet",
            "model": "claude-sonnet-4-5",
            "targets": [],
            "rejected_targets": [],
            "limits": {},
            "routing": None,
        },
        {},
    )
    return replace(plan, routing=Routing((record,) if record else ()))


class Broken(MemorySessionState):
    async def get(self, key: str) -> str | None:
        raise StoreUnavailable("Redis is unavailable: ConnectionError")

    async def put_if_absent(self, key: str, value: str, ttl_ms: int) -> str:
        raise StoreUnavailable("Redis is unavailable: ConnectionError")


def test_the_pin_is_written_once_decided_and_read_on_later_turns(tmp_path: Path) -> None:
    bundle, sessions = load(tmp_path, intent_data()), MemorySessionState()
    source = SessionPin(sessions, BundleRouters())
    body = {"messages": [{"role": "user", "content": "rename x to total"}]}
    first = exchange_for(bundle, "anthropic_messages", body)

    async def scenario() -> None:
        assert await source.gather(first) is None  # nothing pinned yet
        first.plan = plan_with({"layer": "intent", "from": "a", "to": "b", "applied": True, "tier": "light", "pinned": False})
        await source.decided(first)
        later = exchange_for(
            bundle,
            "anthropic_messages",
            {"messages": [*body["messages"], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "now design a system"}]},
        )
        assert await source.gather(later) == {"tier": "light"}  # the same conversation: its prefix key
        later.plan = plan_with({"layer": "intent", "from": "a", "to": "c", "applied": True, "tier": "frontier", "pinned": False})
        await source.decided(later)  # a second decision does not move the pin: first write wins
        assert await sessions.get(pin_key(first)) == "light"

    asyncio.run(scenario())


def test_the_client_session_id_names_the_conversation(tmp_path: Path) -> None:
    bundle = load(tmp_path, intent_data())
    def with_session(text: str, session: str) -> Any:
        exchange = exchange_for(bundle, "anthropic_messages", {"messages": [{"role": "user", "content": text}]})
        exchange.request.session = session
        return exchange

    one = with_session("hi", "sess-1")
    assert pin_key(one) == pin_key(with_session("a different first message", "sess-1"))
    assert pin_key(one) != pin_key(with_session("a different first message", "sess-2"))
    another_team = exchange_for(bundle, "anthropic_messages", {"messages": [{"role": "user", "content": "hi"}]}, team="eu-team")
    another_team.request.session = "sess-1"
    assert pin_key(one) != pin_key(another_team)  # one team's session id never names another's pin


def test_nothing_is_read_or_pinned_for_a_request_no_router_covers_or_a_pinned_tier(tmp_path: Path) -> None:
    bundle, sessions = load(tmp_path, intent_data()), MemorySessionState()
    source = SessionPin(sessions, BundleRouters())
    uncovered = exchange_for(bundle, "anthropic_messages", {"messages": [{"role": "user", "content": "hi"}]}, model="gpt-4o-mini")
    pinned = exchange_for(bundle, "anthropic_messages", {"messages": [{"role": "user", "content": "hi"}]})

    async def scenario() -> None:
        uncovered.plan = plan_with({"layer": "intent", "from": "a", "to": "b", "applied": True, "tier": "light", "pinned": False})
        await source.decided(uncovered)
        assert await sessions.get(pin_key(uncovered)) is None
        pinned.plan = plan_with({"layer": "intent", "from": "a", "to": "b", "applied": True, "tier": "light", "pinned": True})
        await source.decided(pinned)  # already pinned: nothing to write (the TTL runs from the first turn)
        assert await sessions.get(pin_key(pinned)) is None
        pinned.plan = plan_with(None)
        await source.decided(pinned)
        assert await sessions.get(pin_key(pinned)) is None

    asyncio.run(scenario())


def test_a_store_that_fails_costs_the_pin_and_never_the_request(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bundle = load(tmp_path, intent_data())
    source = SessionPin(Broken(), BundleRouters())
    exchange = exchange_for(bundle, "anthropic_messages", {"messages": [{"role": "user", "content": "my secret task"}]})

    async def scenario() -> None:
        assert await source.gather(exchange) is None
        exchange.plan = plan_with({"layer": "intent", "from": "a", "to": "b", "applied": True, "tier": "light", "pinned": False})
        await source.decided(exchange)  # does not raise

    asyncio.run(scenario())
    assert "cannot be read" in caplog.text and "cannot be pinned" in caplog.text
    assert "secret" not in caplog.text


def test_a_tier_whose_model_was_refused_is_not_pinned(tmp_path: Path) -> None:
    bundle, sessions = load(tmp_path, intent_data()), MemorySessionState()
    source = SessionPin(sessions, BundleRouters())
    exchange = exchange_for(bundle, "anthropic_messages", {"messages": [{"role": "user", "content": "rename x to total"}]})

    async def scenario() -> None:
        refused = {"layer": "intent", "from": "a", "to": "b", "applied": False, "reasons": ["model_not_allowed"], "tier": "light", "pinned": False}
        exchange.plan = plan_with(refused)
        await source.decided(exchange)
        assert await sessions.get(pin_key(exchange)) is None  # the conversation is not held to a tier it is not served on

    asyncio.run(scenario())
