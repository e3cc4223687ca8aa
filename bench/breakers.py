"""What circuit breakers (L6) and the cache-domain pin add to one request, measured in
process on the product's bundle, with same-run baselines.

    .venv/bin/python bench/breakers.py [--iterations 3000]

Per request the gateway gathers the ``breakers`` fact (the board as last read: each
process keeps its reading for 0.5 s), the cache-domain step reads the session's
served target, the policy decides with the fact, and the dispatcher asks the board
about each target it tries (from the same reading) and records a success only when
the reading shows something to reset. Printed: the median, in µs, of each part on the
embedded store and on Redis, beside an empty await and a Redis PING (one round trip).
Redis comes from REDIS_URL (default the local port).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent

from portcullis.adapters.auth import Principal  # noqa: E402
from portcullis.adapters.breakers import BreakerFacts, Breakers  # noqa: E402
from portcullis.adapters.cache_domain import CacheDomainPin  # noqa: E402
from portcullis.adapters.pipeline import Exchange  # noqa: E402
from portcullis.adapters.protocols import anthropic_messages  # noqa: E402
from portcullis.adapters.protocols.request import ParsedRequest  # noqa: E402
from portcullis.adapters.store.breakers import MemoryBreakerBoard, RedisBreakerBoard  # noqa: E402
from portcullis.adapters.store.session_state import MemorySessionState, RedisSessionState  # noqa: E402
from portcullis.engine.activation import DECISION_RULE, activate  # noqa: E402
from portcullis.engine.breakers import BreakerRule, target_id  # noqa: E402
from portcullis.engine.bundle import parse_bundle, read_bundle_files  # noqa: E402


def product_bundle(policies: Path = ROOT / "policies") -> Any:
    bundle = parse_bundle(read_bundle_files(policies), [])
    providers = {t["provider"] for model in bundle.data["portcullis"]["catalog"]["models"].values() for t in model["targets"]}
    return activate(bundle, providers, dt.date.today())


async def median_us(action: Callable[[], Awaitable[Any]], iterations: int) -> float:
    for _ in range(min(200, iterations)):
        await action()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        await action()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1000


async def interleaved(actions: dict[str, Callable[[], Awaitable[Any]]], iterations: int) -> dict[str, float]:
    """Each action's median, the actions taking turns every iteration: drift in the
    machine's load falls on all of them alike."""
    samples: dict[str, list[int]] = {name: [] for name in actions}
    for round_ in range(iterations + 200):
        for name, action in actions.items():
            start = time.perf_counter_ns()
            await action()
            if round_ >= 200:  # warm-up
                samples[name].append(time.perf_counter_ns() - start)
    return {name: statistics.median(taken) / 1000 for name, taken in samples.items()}


async def _evaluate(active: Any, document: str) -> None:
    active.policy.evaluate_json(DECISION_RULE, document)


async def both(embedded: Callable[[], Awaitable[Any]], shared: Callable[[], Awaitable[Any]], iterations: int) -> tuple[float, float]:
    return await median_us(embedded, iterations), await median_us(shared, iterations)


def exchange_for(active: Any) -> Exchange:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "Review this diff, please."}]}
    request = ParsedRequest("anthropic_messages", json.dumps(body).encode(), body, "claude-sonnet-4-5", False, 64, [])
    exchange = Exchange("bench", anthropic_messages.PROTOCOL, time.monotonic(), dt.datetime.now(dt.UTC))
    exchange.principal, exchange.request, exchange.bundle = Principal("k", "demo", "alice"), request, active
    return exchange


async def main(iterations: int, baseline_policies: Path | None) -> None:
    active = product_bundle()
    redis = Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    prefix = f"bench-breakers-{uuid.uuid4().hex[:8]}:"
    exchange = exchange_for(active)
    plan_input = {"principal": exchange.principal.as_input(), "request": {"protocol": "anthropic_messages", "model": "claude-sonnet-4-5", "stream": False}}
    plan = active.decide(plan_input)
    exchange.targets = plan.targets
    target = plan.targets[0]
    rule = BreakerRule()  # the product's default; it matters only for failures, not measured here
    rows: list[tuple[str, float, float]] = []

    async def nothing() -> None:
        return None

    baseline = await median_us(nothing, iterations)
    ping = await median_us(redis.ping, iterations)
    for label, cache in (("cached reading (0.5 s)", 0.5), ("reading every request", 0.0)):
        embedded = BreakerFacts(Breakers(MemoryBreakerBoard(), cache_seconds=cache))
        shared = BreakerFacts(Breakers(RedisBreakerBoard(redis, prefix), cache_seconds=cache))
        rows.append((f"breakers fact, {label}", *await both(lambda s=embedded: s.gather(exchange), lambda s=shared: s.gather(exchange), iterations)))

    async def attempt(board: Breakers) -> None:
        await board.admit(target, rule)
        await board.succeeded(target, False, "bench")

    boards = (Breakers(MemoryBreakerBoard()), Breakers(RedisBreakerBoard(redis, prefix)))
    rows.append(("dispatcher per attempt (healthy target)", *await both(lambda: attempt(boards[0]), lambda: attempt(boards[1]), iterations)))
    pins = (CacheDomainPin(MemorySessionState()), CacheDomainPin(RedisSessionState(redis, prefix)))
    rows.append(("cache-domain pin (session read)", *await both(lambda: pins[0].admit(exchange), lambda: pins[1].admit(exchange), iterations)))

    without = json.dumps(plan_input)
    with_open = json.dumps({**plan_input, "facts": {"breakers": {target_id(target): {"state": "open", "until": int(time.time()) + 30}}}})

    decisions = {
        "no breaker facts": lambda: _evaluate(active, without),
        "one open breaker": lambda: _evaluate(active, with_open),
    }
    if baseline_policies is not None:
        before = product_bundle(baseline_policies)
        decisions["policy before L6"] = lambda: _evaluate(before, without)
    decided = await interleaved(decisions, iterations)
    keys = [key async for key in redis.scan_iter(f"{prefix}*")]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()

    print(f"\nmedian µs over {iterations} iterations (same run)")
    print(f"  baseline: empty await {baseline:.2f} µs; Redis PING (one round trip) {ping:.1f} µs")
    print(f"  {'part':48} {'embedded':>10} {'shared':>10}")
    for label, embedded_us, shared_us in rows:
        print(f"  {label:48} {embedded_us:10.2f} {shared_us:10.2f}")
    for label, took in decided.items():
        print(f"  decision (uncached, interleaved), {label:30} {took:10.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--baseline-policies", type=Path, help="a policies/ directory without L6 (e.g. main's), decided in the same run")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.iterations, arguments.baseline_policies))
