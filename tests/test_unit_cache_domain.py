"""The cache-domain pin in process: a conversation's next turn tries the target that
served it first, only while the plan authorises it and its breaker is closed; it only
orders targets, never adds one; it writes only when the conversation moves; a bundle
without ``cache_domains`` does not pin. Real bundle and decision, in-process sessions."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path

import yaml

from portcullis.adapters.auth import Principal
from portcullis.adapters.cache_domain import CacheDomainPin
from portcullis.adapters.pipeline import Exchange
from portcullis.adapters.policy_input import decide
from portcullis.adapters.protocols.anthropic_messages import PROTOCOL
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.adapters.store.session_state import MemorySessionState
from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.breakers import target_id
from portcullis.engine.bundle import parse_bundle, read_bundle_files
from portcullis.engine.plan import DecisionPlan
from tests.bundles import CATALOG, write_bundle

PROVIDERS = {t["provider"] for model in CATALOG["models"].values() for t in model["targets"]}
US, EU, HAIKU = (
    "anthropic-us/claude-sonnet-4-5-20250929@us-east-1",
    "anthropic-eu/claude-sonnet-4-5-20250929@eu-west-1",
    "anthropic-eu/claude-haiku-4-5-20251001@eu-west-1",
)


def bundle(directory: Path, pin: bool | None = True) -> ActiveBundle:
    extra = {} if pin is None else {"portcullis/cache_domains/data.yaml": yaml.safe_dump({"pin": pin, "ttl_seconds": 60})}
    return activate(parse_bundle(read_bundle_files(write_bundle(directory, extra=extra)), []), PROVIDERS, dt.date(2026, 6, 1))


def exchange(active: ActiveBundle, first_message: str, team: str = "eng", facts: dict | None = None) -> Exchange:
    body = {"model": "sonnet", "max_tokens": 8, "messages": [{"role": "user", "content": first_message}]}
    request = ParsedRequest("anthropic_messages", json.dumps(body).encode(), body, "sonnet", False, 8, [])
    turn = Exchange("req", PROTOCOL, time.monotonic(), dt.datetime.now(dt.UTC))
    turn.principal, turn.request, turn.bundle, turn.facts = Principal("k", team, None), request, active, facts or {}
    turn.plan = decide(active, turn.principal, request, turn.facts)
    turn.targets = turn.plan.targets
    return turn


def order(turn: Exchange) -> list[str]:
    return [target_id(t) for t in turn.targets]


async def served_by(pin: CacheDomainPin, turn: Exchange, target: str) -> None:
    """Admit ``turn`` and settle it as served by ``target``."""
    admission = await pin.admit(turn)
    turn.admitted(pin, admission)
    turn.served = next(t for t in turn.targets if target_id(t) == target)
    if admission is not None:
        await pin.settle(turn, admission.state)


def test_the_target_that_served_is_tried_first_and_the_others_keep_their_order(tmp_path: Path) -> None:
    active, sessions = bundle(tmp_path / "b"), MemorySessionState()
    pin = CacheDomainPin(sessions)

    async def scenario() -> None:
        await served_by(pin, exchange(active, "Review this diff."), EU)  # the first target failed once
        turn = exchange(active, "Review this diff.")
        turn.admitted(pin, await pin.admit(turn))
        assert order(turn) == [EU, US, HAIKU]
        other = exchange(active, "Another conversation.")
        other.admitted(pin, await pin.admit(other))
        assert order(other) == [US, EU, HAIKU]

    asyncio.run(scenario())


def test_an_open_breaker_or_a_plan_without_the_target_wins_over_the_pin(tmp_path: Path) -> None:
    active, sessions = bundle(tmp_path / "b"), MemorySessionState()
    pin = CacheDomainPin(sessions)

    async def scenario() -> None:
        await served_by(pin, exchange(active, "Review this diff."), EU)
        half_open = exchange(active, "Review this diff.", facts={"breakers": {EU: {"state": "half_open"}}})
        half_open.admitted(pin, await pin.admit(half_open))
        assert order(half_open) == [US, EU, HAIKU]  # not closed: no pin, the plan's order
        opened = exchange(active, "Review this diff.", facts={"breakers": {EU: {"state": "open", "until": int(time.time()) + 30}}})
        opened.admitted(pin, await pin.admit(opened))
        assert order(opened) == [US, HAIKU]  # the policy left it out; the pin does not bring it back
        locked = exchange(active, "Review this diff.", team="eu-team")  # another team: another session, and no us-east-1
        await served_by(pin, locked, HAIKU)
        again = exchange(active, "Review this diff.", team="eu-team")
        again.admitted(pin, await pin.admit(again))
        assert order(again) == [HAIKU, EU]

    asyncio.run(scenario())


class CountingSessions(MemorySessionState):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        self.writes.append(value)
        await super().put(key, value, ttl_ms)


def test_a_conversation_on_its_first_target_writes_nothing(tmp_path: Path) -> None:
    active, sessions = bundle(tmp_path / "b"), CountingSessions()
    pin = CacheDomainPin(sessions)

    async def scenario() -> None:
        await served_by(pin, exchange(active, "Review this diff."), US)
        await served_by(pin, exchange(active, "Review this diff."), US)
        assert sessions.writes == []  # the healthy path reads, never writes
        await served_by(pin, exchange(active, "Review this diff."), EU)
        await served_by(pin, exchange(active, "Review this diff."), EU)
        await served_by(pin, exchange(active, "Review this diff."), US)  # moved back: remembered too
        assert sessions.writes == [EU, US]

    asyncio.run(scenario())


def test_a_bundle_without_cache_domains_or_with_pin_off_does_not_pin(tmp_path: Path) -> None:
    async def scenario() -> None:
        for n, setting in enumerate((None, False)):
            active = bundle(tmp_path / f"b{n}", pin=setting)
            pin = CacheDomainPin(MemorySessionState())
            turn = exchange(active, "Review this diff.")
            assert await pin.admit(turn) is None

    asyncio.run(scenario())


def test_a_plan_refused_for_open_breakers_names_when_to_come_back() -> None:
    document = {
        "allow": False,
        "reasons": [{"code": "targets_unavailable", "message": "every target is unavailable", "retry_at": 1_780_315_230}],
        "requested_model": "sonnet",
        "model": "claude-sonnet-4-5",
        "targets": [],
        "rejected_targets": [],
    }
    refusal = DecisionPlan.from_policy(document, {}).refusal(dt.datetime.fromtimestamp(1_780_315_218.4, dt.UTC))
    assert (refusal.kind.value, refusal.code, refusal.retry_after) == (503, "targets_unavailable", 12)
