"""What the routing layers cost a request, all on and one at a time, in one run:

    .venv/bin/python bench/routing_layers.py [--decisions 3000] [--rounds 5] [--calls 2000]
    .venv/bin/python bench/routing_layers.py --compare before=/tmp/old/policies/portcullis

1. The main decision (``data.portcullis.decision``, uncached) on the generated 50-team /
   500-user / 40-model bundle (bench/bundle_gen.py): as today (no routing data, no
   facts); with every layer's data (``bundle_gen.write(routing=True)``) and no facts;
   with one layer's facts at a time (intent: features and, on about half the requests,
   a session pin; budget tiers: each team's monthly budget at 10-97 %; breakers: two
   open and one half-open target); and with all of them. The same requests in every
   variant; variants take turns, round after round; each figure is the median over the
   rounds of the per-call median. Then the context-fit entry point (2 targets).
2. What the gateway does in Python to gather each layer's facts, per request: the
   features of a Claude Code-sized request, the session pin read, the budget peak read
   (bench/budget_tiers.py) and the breakers board read (bench/breakers.py's parts),
   embedded and shared (Redis + PostgreSQL from REDIS_URL / DATABASE_URL).

The issue's bar: all layers on, the decision stays within 150 µs at the median.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bundle_gen  # noqa: E402
from bench.claude_code_request import claude_code_exchange  # noqa: E402

BAR_US = 150.0
PERCENTS = (10, 45, 70, 85, 90, 97)  # of each team's monthly budget: tiers at 80 and 95
TIERS = ("light", "standard", "frontier")


def activate_dir(directory: Path) -> Any:
    from portcullis.engine.activation import activate
    from portcullis.engine.bundle import parse_bundle, read_bundle_files

    return activate(parse_bundle(read_bundle_files(directory), []), bundle_gen.provider_names(), dt.date.today())


def features_pool(active: Any) -> list[dict[str, Any]]:
    """``input.facts.features`` of each labelled intent task (tests/data), sent as its
    client sends it, as the gateway's FeatureSource computes them on this bundle."""
    from bench import intent_accuracy
    from portcullis.adapters.auth import Principal
    from portcullis.adapters.intent.features import FeatureSource
    from portcullis.adapters.intent.routers import BundleRouters
    from portcullis.adapters.pipeline import Exchange
    from portcullis.adapters.protocols.registry import protocol
    from portcullis.adapters.protocols.request import ParsedRequest
    from portcullis.engine.clients import client_of

    source, pool = FeatureSource(BundleRouters()), []
    tasks = [json.loads(line) for line in intent_accuracy.SETS["tuning"].read_text().splitlines() if line.strip()]
    for task in tasks:
        name, body = intent_accuracy.request_of(task)
        body["model"] = "gpt-m1"  # a model a router covers for every team
        tools = [tool["name"] for tool in body.get("tools", [])]
        client = client_of(intent_accuracy.USER_AGENTS[task["client"]])
        request = ParsedRequest(name, json.dumps(body).encode(), body, "gpt-m1", False, 4096, [], tools=tools, client=client)
        exchange = Exchange("bench", protocol(name), 0.0, dt.datetime.now(dt.UTC), principal=Principal("bench", "team0", None), request=request)
        exchange.bundle = active
        features = asyncio.run(source.gather(exchange))
        assert features is not None, "a router covers the request"
        pool.append(features)
    return pool


def breaker_board(catalog: dict[str, Any]) -> dict[str, Any]:
    """Two open breakers and one half-open, on models the requests name, named as
    engine/breakers.py target_id names them."""

    def first(model: str) -> str:
        target = catalog["models"][model]["targets"][0]
        return f"{target['provider']}/{target['model']}@{target['region']}"

    until = int(time.time()) + 30
    return {first("gpt-m1"): {"state": "open", "until": until}, first("claude-m4"): {"state": "open", "until": until}, first("gpt-m9"): {"state": "half_open"}}


def requests(active: Any, samples: int) -> dict[str, list[str]]:
    """The same mixed requests, with each variant's facts (JSON input documents)."""
    from portcullis.engine.intent_routers import IntentRouters, canonical

    tenants, catalog, _ = bundle_gen.generate()
    routers = IntentRouters.from_data(active.bundle.data["portcullis"]["intent"])
    pool = features_pool(active)
    board = breaker_board(catalog)
    rng = random.Random(11)
    teams, names = list(tenants["teams"]), list(catalog["models"]) + list(catalog["aliases"])
    variants: dict[str, list[str]] = {name: [] for name in ("none", "intent", "budget tiers", "breakers", "all")}
    for _ in range(samples):
        team = rng.choice(teams)
        user = rng.choice([None, *tenants["teams"][team]["users"]])
        model = rng.choice(names)
        base = {
            "principal": {"team": team, "user": user, "key_id": f"key_{rng.randrange(1 << 40):016x}"},
            "request": {"model": model, "requires": ["streaming", "tools"], "protocol": "anthropic_messages", "stream": True},
        }
        intent: dict[str, Any] = {}
        if routers.router_for(team, canonical(catalog, model)) is not None:  # the gateway measures features only then
            intent["features"] = rng.choice(pool)
            if rng.random() < 0.5:
                intent["session"] = {"tier": rng.choice(TIERS)}
        budgets = {"budgets": {f"{team}-month": {"percent": rng.choice(PERCENTS)}}}
        breakers = {"breakers": board}
        for name, facts in (("none", {}), ("intent", intent), ("budget tiers", budgets), ("breakers", breakers), ("all", {**intent, **budgets, **breakers})):
            variants[name].append(json.dumps({**base, "facts": facts} if facts else base, separators=(",", ":")))
    return variants


def outcomes(active: Any, documents: list[str]) -> str:
    """What the layers did to these requests: substitutions taken and refused, by layer;
    targets a breaker took out; requests left with no target."""
    counts: Counter[str] = Counter()
    for document in documents:
        plan = active.decide(json.loads(document))
        if plan.routing is not None:
            for record in plan.routing.layers:
                if record["from"] != record["to"]:
                    counts[f"{record['layer']} {'taken' if record['applied'] else 'refused'}"] += 1
                else:
                    counts[f"{record['layer']} kept the model"] += 1
        counts["breaker_open rejections"] += sum("breaker_open" in target.get("reasons", ()) for target in plan.rejected_targets)
        if not plan.allow:
            counts[f"refused: {plan.reasons[0]['code']}"] += 1
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items()) if count) or "nothing"


def decisions(tmp: Path, samples: int, rounds: int, compare: dict[str, Path]) -> tuple[dict[str, float], dict[str, str]]:
    """``compare``: other versions of the bundle's Rego (label -> directory), measured on
    the same requests with every layer's data, facts none, each layer's, and all."""
    from portcullis.engine.activation import CONTEXT_FIT_RULE, DECISION_RULE
    from portcullis.engine.context_fit import EXACT, UPPER_BOUND, Generation, Sized, fit_input
    from portcullis.engine.target import Target

    off = activate_dir(bundle_gen.write(tmp / "off"))
    on = activate_dir(bundle_gen.write(tmp / "on", routing=True))
    documents = requests(on, samples)
    variants = {
        "layers off (today's bundle, no facts)": (off, documents["none"]),
        "layers' data, no facts": (on, documents["none"]),
        "intent alone (features, pin on ~1/2)": (on, documents["intent"]),
        "budget tiers alone (10-97 %)": (on, documents["budget tiers"]),
        "breakers alone (2 open, 1 half-open)": (on, documents["breakers"]),
        "all layers on": (on, documents["all"]),
    }
    for n, (version, modules) in enumerate(compare.items()):
        other = activate_dir(bundle_gen.write(tmp / f"compare-{n}", modules=modules, routing=True))
        for kind in ("none", "intent", "budget tiers", "breakers", "all"):
            variants[f"[{version}] facts: {kind}"] = (other, documents[kind])
    said = {label: outcomes(active, docs) for label, (active, docs) in variants.items()}
    targets = [Target("m", "p", f"model-{n}", "r", 1, 200000, 8192, ()) for n in range(2)]
    fit = json.dumps(fit_input([Sized(t, 1200 + n, EXACT if n % 2 else UPPER_BOUND) for n, t in enumerate(targets)], Generation(1024, None, "low")))
    calls: dict[str, Callable[[int], Any]] = {
        label: (lambda i, a=active, d=docs: a.policy.evaluate_json(DECISION_RULE, d[i])) for label, (active, docs) in variants.items()
    }
    calls["context-fit verdicts, 2 targets (when evaluated)"] = lambda i: on.policy.evaluate_json(CONTEXT_FIT_RULE, fit)
    figures: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            timings = []
            for i in range(samples):
                started = time.perf_counter_ns()
                call(i)
                timings.append((time.perf_counter_ns() - started) / 1000)
            figures[label].append(statistics.median(timings))
    return {label: statistics.median(values) for label, values in figures.items()}, said


async def interleaved(actions: dict[str, Callable[[], Awaitable[Any]]], calls: int) -> dict[str, float]:
    samples: dict[str, list[int]] = {name: [] for name in actions}
    for n in range(calls + 100):
        for name, action in actions.items():
            started = time.perf_counter_ns()
            await action()
            if n >= 100:  # warm-up
                samples[name].append(time.perf_counter_ns() - started)
    return {name: statistics.median(taken) / 1000 for name, taken in samples.items()}


async def python_facts(tmp: Path, calls: int) -> dict[str, float]:
    """Each fact source's gather on a Claude Code-sized request (features, session pin)
    and the breakers board read, embedded and on Redis."""
    from redis.asyncio import Redis

    from portcullis.adapters.breakers import BreakerFacts, Breakers
    from portcullis.adapters.intent.features import FeatureSource
    from portcullis.adapters.intent.routers import BundleRouters
    from portcullis.adapters.intent.session_pin import SessionPin, pin_key
    from portcullis.adapters.store.breakers import MemoryBreakerBoard, RedisBreakerBoard
    from portcullis.adapters.store.session_state import MemorySessionState, RedisSessionState

    on = activate_dir(bundle_gen.write(tmp / "facts-on", routing=True))
    redis = Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    prefix = f"bench-layers-{uuid.uuid4().hex[:8]}:"
    routers = BundleRouters()
    features = FeatureSource(routers)
    pins = {"embedded": MemorySessionState(), "shared (Redis)": RedisSessionState(redis, prefix)}
    sample = claude_code_exchange(on)
    print(f"  (Claude Code-sized request: {len(sample.request.raw) // 1024} KiB, {len(sample.request.tools)} tools, features {await features.gather(sample)})")
    for state in pins.values():
        await state.put(pin_key(sample), "standard", 60_000)

    async def gather(source: Any) -> None:
        assert await source.gather(claude_code_exchange(on)) is not None

    async def fresh_exchange() -> None:
        claude_code_exchange(on)

    actions: dict[str, Callable[[], Awaitable[Any]]] = {
        "(building the exchange alone, subtracted)": fresh_exchange,
        "features (FeatureSource.gather)": lambda: gather(features),
    }
    for label, state in pins.items():
        pin = SessionPin(state, routers)
        actions[f"session pin read, {label}"] = lambda s=pin: gather(s)
    for label, board in (("embedded", MemoryBreakerBoard()), ("shared (Redis)", RedisBreakerBoard(redis, prefix))):
        for cache, how in ((0.5, "as served, 0.5 s reading"), (0.0, "read every request")):
            facts = BreakerFacts(Breakers(board, cache_seconds=cache))
            actions[f"breakers board, {label}, {how}"] = lambda f=facts: f.gather(sample)
    figures = await interleaved(actions, calls)
    keys = [key async for key in redis.scan_iter(f"{prefix}*")]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()
    building = figures["(building the exchange alone, subtracted)"]
    return {label: value - building if label.startswith(("features", "session")) else value for label, value in figures.items()}


def main() -> None:
    from bench.budget_tiers import fact_reads
    from bench.harness import scratch_database

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=3000, help="requests per round and variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="calls per fact source")
    parser.add_argument("--compare", action="append", default=[], metavar="LABEL=DIR", help="another directory of the bundle's *.rego, decided too")
    args = parser.parse_args()
    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    with tempfile.TemporaryDirectory(prefix="portcullis-layers-") as tmp:
        compare = {label: Path(directory) for label, _, directory in (item.partition("=") for item in args.compare)}
        figures, said = decisions(Path(tmp), args.decisions, args.rounds, compare)
        print(f"\nmain decision, {args.decisions} mixed requests x {args.rounds} rounds (regorus, one thread, uncached), median µs:")
        baseline = figures["layers off (today's bundle, no facts)"]
        for label, value in figures.items():
            print(f"  {label:<50} {value:7.1f}   {value - baseline:+6.1f} vs off")
        total = figures["all layers on"]
        verdict = "within" if total <= BAR_US else f"OVER by {total - BAR_US:.1f} µs"
        print(f"  all layers on: {total:.1f} µs median, {verdict} the {BAR_US:.0f} µs bar")
        print("what the layers did (per variant, over the same requests):")
        for label, text in said.items():
            print(f"  {label:<40} {text}")
        print(f"\nfacts gathered in Python per request, {args.calls} calls each, interleaved, median µs:")
        for label, value in asyncio.run(python_facts(Path(tmp), args.calls)).items():
            print(f"  {label:<50} {value:7.1f}")
        with scratch_database(admin_url) as database_url:
            for label, value in asyncio.run(fact_reads(Path(tmp), database_url, redis_url, args.calls, args.rounds)).items():
                print(f"  budget peak read, {label:<32} {value:7.1f}")


if __name__ == "__main__":
    main()
