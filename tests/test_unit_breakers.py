"""The circuit breaker's state machine (closed → open → half-open with one probe →
closed or open again), on the embedded board and on real Redis, with an injected
clock; what counts as a target's failure; the facts the policy reads."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from portcullis.adapters.audit_log import AuditLog
from portcullis.adapters.breakers import Breakers, counts_against_target
from portcullis.adapters.store.breakers import BreakerBoard, MemoryBreakerBoard, RedisBreakerBoard
from portcullis.engine.breakers import BreakerRule, BreakerSettings, target_id
from portcullis.engine.target import Target
from tests.fakes import free_port

RULE = BreakerRule(consecutive_failures=3, open_seconds=30)
US = Target("claude-sonnet-4-5", "anthropic-us", "claude-sonnet-4-5-20250929", "us-east-1", 1, 200000, 8192, ())
EU = Target("claude-sonnet-4-5", "anthropic-eu", "claude-sonnet-4-5-20250929", "eu-west-1", 2, 200000, 8192, ())


class Clock:
    def __init__(self) -> None:
        self.now = 1_764_600_000.0

    def __call__(self) -> float:
        return self.now


BoardFactory = Callable[[], BreakerBoard]
Scenario = Callable[[BoardFactory], Awaitable[None]]


@pytest.fixture(params=["memory", "redis"])
def run(request: pytest.FixtureRequest) -> Callable[[Scenario], None]:
    """Runs a scenario with a factory of boards on one shared state: the same object in
    process, or a new client on the same Redis keys (another replica) each call."""

    def run(scenario: Scenario) -> None:
        if request.param == "memory":
            board = MemoryBreakerBoard()
            asyncio.run(scenario(lambda: board))
            return
        asyncio.run(_on_redis(scenario))

    return run


async def _on_redis(scenario: Scenario) -> None:
    prefix = f"test-breakers-{uuid.uuid4().hex[:8]}:"
    clients: list[Redis] = []

    def make() -> BreakerBoard:
        client = Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
        clients.append(client)
        return RedisBreakerBoard(client, prefix)

    try:
        await scenario(make)
    finally:
        for client in clients:
            keys = [key async for key in client.scan_iter(f"{prefix}*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()


def breakers(board: BreakerBoard, clock: Clock, audit: AuditLog | None = None) -> Breakers:
    return Breakers(board, audit, clock, cache_seconds=0)  # every reading fresh: the machine, not the cache


def test_consecutive_failures_open_the_breaker_and_a_success_resets_the_count(run: Callable[[Scenario], None]) -> None:
    async def scenario(boards: BoardFactory) -> None:
        clock = Clock()
        board = breakers(boards(), clock)
        for _ in range(RULE.consecutive_failures - 1):
            await board.failed(US, RULE, "r")
        await board.succeeded(US, False, "r")  # the count starts again
        for _ in range(RULE.consecutive_failures - 1):
            await board.failed(US, RULE, "r")
        assert await board.admit(US, RULE) == "send"
        assert await board.facts() is None  # failures counted, still closed: not a fact
        await board.failed(US, RULE, "r")
        assert await board.admit(US, RULE) == "skip"
        assert await board.admit(EU, RULE) == "send"  # per target
        assert await board.facts() == {target_id(US): {"state": "open", "until": int(clock.now) + 30}}

    run(scenario)


def test_after_the_cool_off_one_probe_goes_and_its_success_closes(run: Callable[[Scenario], None]) -> None:
    async def scenario(boards: BoardFactory) -> None:
        clock = Clock()
        one, other = breakers(boards(), clock), breakers(boards(), clock)  # two replicas
        for _ in range(RULE.consecutive_failures):
            await one.failed(US, RULE, "r")
        clock.now += 29
        assert await other.admit(US, RULE) == "skip"
        clock.now += 1.5
        assert await other.facts() == {target_id(US): {"state": "half_open"}}
        assert await other.admit(US, RULE) == "probe"
        assert await one.admit(US, RULE) == "skip"  # the probe is taken: this request goes elsewhere
        await other.succeeded(US, True, "r")
        assert await one.admit(US, RULE) == "send"
        assert await one.facts() is None

    run(scenario)


def test_a_failed_probe_opens_the_breaker_for_another_cool_off(run: Callable[[Scenario], None]) -> None:
    async def scenario(boards: BoardFactory) -> None:
        clock = Clock()
        board = breakers(boards(), clock)
        for _ in range(RULE.consecutive_failures):
            await board.failed(US, RULE, "r")
        clock.now += 31
        assert await board.admit(US, RULE) == "probe"
        await board.failed(US, RULE, "r")
        assert await board.admit(US, RULE) == "skip"
        assert await board.facts() == {target_id(US): {"state": "open", "until": int(clock.now) + 30}}
        clock.now += 31
        assert await board.admit(US, RULE) == "probe"  # a new cool-off, a new probe

    run(scenario)


def test_failures_of_requests_sent_before_it_opened_do_not_extend_it(run: Callable[[Scenario], None]) -> None:
    async def scenario(boards: BoardFactory) -> None:
        clock = Clock()
        board = breakers(boards(), clock)
        for _ in range(RULE.consecutive_failures):
            await board.failed(US, RULE, "r")
        opened_until = int(clock.now) + 30
        clock.now += 10
        await board.failed(US, RULE, "r")
        assert await board.facts() == {target_id(US): {"state": "open", "until": opened_until}}

    run(scenario)


def test_a_probe_that_says_nothing_lets_another_probe(run: Callable[[Scenario], None]) -> None:
    async def scenario(boards: BoardFactory) -> None:
        clock = Clock()
        board = breakers(boards(), clock)
        for _ in range(RULE.consecutive_failures):
            await board.failed(US, RULE, "r")
        clock.now += 31
        assert await board.admit(US, RULE) == "probe"
        await board.release(US)  # e.g. the provider refused the request itself (400)
        assert await board.admit(US, RULE) == "probe"

    run(scenario)


def test_concurrent_requests_on_two_replicas_get_one_probe(run: Callable[[Scenario], None]) -> None:
    async def scenario(boards: BoardFactory) -> None:
        clock = Clock()
        replicas = [breakers(boards(), clock) for _ in range(2)]
        for _ in range(RULE.consecutive_failures):
            await replicas[0].failed(US, RULE, "r")
        clock.now += 31
        verdicts = await asyncio.gather(*(replicas[i % 2].admit(US, RULE) for i in range(20)))
        assert sorted(verdicts) == ["probe"] + ["skip"] * 19

    run(scenario)


def test_transitions_are_audited_without_content(run: Callable[[Scenario], None], tmp_path: Path) -> None:
    async def scenario(boards: BoardFactory) -> None:
        clock = Clock()
        audit = AuditLog(tmp_path / "audit.jsonl")
        board = breakers(boards(), clock, audit)
        for _ in range(RULE.consecutive_failures):
            await board.failed(US, RULE, "req-1")
        clock.now += 31
        await board.admit(US, RULE)
        await board.failed(US, RULE, "req-2")
        clock.now += 31
        await board.admit(US, RULE)
        await board.succeeded(US, True, "req-3")
        audit.close()
        records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert [(r["event"], r["request_id"]) for r in records] == [("breaker_opened", "req-1"), ("breaker_reopened", "req-2"), ("breaker_closed", "req-3")]
        assert records[0]["target"] == target_id(US) and records[0]["failures"] == 3 and records[0]["half_open_at"] == 1_764_600_030
        assert records[2]["probe"] is True

    run(scenario)


def test_only_the_targets_own_failures_count() -> None:
    for outcome, status in (("status_500", 500), ("status_529", 529), ("status_408", 408), ("timeout", None), ("connect", None), ("error_event", None)):
        assert counts_against_target(outcome, status), outcome
    for outcome, status in (("status_400", 400), ("status_413", 413), ("status_429", 429), ("status_401", 401), ("unconvertible", None), ("no_capacity", None)):
        assert not counts_against_target(outcome, status), outcome


def test_settings_come_from_the_bundle_with_provider_overrides() -> None:
    assert BreakerSettings.from_data(None) is None
    settings = BreakerSettings.from_data({"default": {"consecutive_failures": 4}, "providers": {"bedrock-usw2": {"open_seconds": 60}}})
    assert settings is not None
    assert settings.rule_for("anthropic-us") == BreakerRule(4, 30)
    assert settings.rule_for("bedrock-usw2") == BreakerRule(4, 60)


def test_an_unreachable_store_leaves_every_breaker_closed() -> None:
    """Breakers are an availability optimisation: without Redis every target may be tried."""

    async def scenario() -> None:
        client = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)  # nothing listens there
        board = breakers(RedisBreakerBoard(client, "test-down:"), Clock())
        try:
            for _ in range(RULE.consecutive_failures):
                await board.failed(US, RULE, "r")  # not counted, and no exception
            assert await board.admit(US, RULE) == "send"
            assert await board.facts() is None
            await board.succeeded(US, True, "r")
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_success_that_was_not_the_probe_leaves_an_open_breaker_open(run: Callable[[Scenario], None]) -> None:
    """A request sent before the breaker opened (or by a replica that had not seen it open)
    answering well says nothing of the target now: only the probe closes the breaker."""

    async def scenario(boards: BoardFactory) -> None:
        clock = Clock()
        board = breakers(boards(), clock)
        for _ in range(RULE.consecutive_failures):
            await board.failed(US, RULE, "r")
        await board.succeeded(US, False, "in-flight")
        assert await board.admit(US, RULE) == "skip"
        clock.now += 31
        assert await board.admit(US, RULE) == "probe"
        await board.succeeded(US, False, "another")  # still half-open: the probe decides
        assert await board.facts() == {target_id(US): {"state": "half_open"}}
        await board.succeeded(US, True, "probe")
        assert await board.admit(US, RULE) == "send"

    run(scenario)
