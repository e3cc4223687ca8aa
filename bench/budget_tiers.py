"""What L3 budget tiers add to a request, measured in one run against same-run baselines:

- the policy decision on the generated 50-team bundle (bench/bundle_gen.py) with every
  team's monthly budget tiered, against the same bundle without tiers;
- gathering the ``budgets`` fact (one high-water-mark read) in each ledger, against a
  team without tiers (no read at all);
- keeping the high-water mark on Redis: a reservation plus its settlement with the
  shipped Lua scripts, against the same scripts without the peak maintenance.

    .venv/bin/python bench/budget_tiers.py [--decisions 4000] [--reads 2000] [--rounds 5]

Variants take turns within each round; each figure is the median over the rounds of
the per-call median (µs).
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
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bundle_gen  # noqa: E402
from bench.harness import scratch_database  # noqa: E402


def tiered(directory: Path) -> Path:
    """The generated bundle, every team's monthly budget with two tiers."""
    bundle_gen.write(directory)
    _, catalog, _ = bundle_gen.generate()
    claude = [name for name in catalog["models"] if name.startswith("claude-m")]
    gpt = [name for name in catalog["models"] if name.startswith("gpt-m")]
    tenants = yaml.safe_load((directory / "portcullis" / "tenants" / "data.yaml").read_text())
    teams = {
        team: {
            "budget": f"{team}-month",
            "tiers": [
                {"name": "yellow", "threshold_percent": 80, "substitutions": {claude[0]: claude[1], gpt[0]: gpt[1]}},
                {"name": "red", "threshold_percent": 95, "substitutions": {claude[0]: claude[2], claude[1]: claude[2], gpt[0]: gpt[2], gpt[1]: gpt[2]}},
            ],
        }
        for team in tenants["teams"]
    }
    (directory / "portcullis" / "budget_tiers").mkdir()
    (directory / "portcullis" / "budget_tiers" / "data.yaml").write_text(yaml.safe_dump({"teams": teams}))
    return directory


def decision_inputs(samples: int, tiers: bool, model: str | None = None, percents: tuple[int, ...] = (40, 85, 97)) -> list[str]:
    """Mixed requests (a quarter naming a model the tiers substitute), or all naming
    ``model``; with ``tiers`` each carries its team's budget fact at one of ``percents``."""
    tenants, catalog, _ = bundle_gen.generate()
    rng = random.Random(11)
    teams = list(tenants["teams"])
    # a quarter of the requests name a model the tiers substitute
    names = [name for name in catalog["models"] if name[-3:] in ("-m0", "-m1", "-m4", "-m5")] + list(catalog["models"])
    documents = []
    for _ in range(samples):
        team = rng.choice(teams)
        user = rng.choice([None, *tenants["teams"][team]["users"]])
        document: dict[str, Any] = {
            "principal": {"team": team, "user": user, "key_id": f"key_{rng.randrange(1 << 40):016x}"},
            "request": {"model": model or rng.choice(names), "requires": ["streaming", "tools"], "protocol": "openai_chat", "stream": True},
        }
        if tiers:
            document["facts"] = {"budgets": {f"{team}-month": {"percent": rng.choice(percents)}}}
        documents.append(json.dumps(document, separators=(",", ":")))
    return documents


def per_call(timings: list[float]) -> float:
    return statistics.median(timings)


def decisions(tmp: Path, samples: int, rounds: int) -> dict[str, float]:
    from portcullis.engine.activation import activate
    from portcullis.engine.bundle import parse_bundle, read_bundle_files

    def load(directory: Path) -> Any:
        return activate(parse_bundle(read_bundle_files(directory), []), bundle_gen.provider_names(), dt.date.today())

    plain, tiered_bundle = load(bundle_gen.write(tmp / "plain")), load(tiered(tmp / "tiered"))
    first = next(name for name in bundle_gen.generate()[1]["models"] if name.startswith("claude-m"))
    variants = {
        "mixed requests, no tiers (baseline)": (plain, decision_inputs(samples, tiers=False)),
        "mixed requests, tiers, facts at 40/85/97 %": (tiered_bundle, decision_inputs(samples, tiers=True)),
        f"all {first}, no tiers (baseline)": (plain, decision_inputs(samples, tiers=False, model=first)),
        f"all {first}, tiers, facts at 97 % (a proposal each)": (tiered_bundle, decision_inputs(samples, tiers=True, model=first, percents=(97,))),
    }
    for label, (active, documents) in variants.items():
        plans = [active.decide(json.loads(document)) for document in documents]
        taken = sum(1 for plan in plans if plan.routing.layer == "budget_tier")
        proposed = sum(1 for plan in plans if plan.routing.layer_record("budget_tier"))
        print(f"  ({label}: {proposed} proposals, {taken} taken)")
    figures: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(rounds):
        for label, (active, documents) in variants.items():
            timings = []
            for document in documents:  # uncached: policy.evaluate_json, not the decision cache
                started = time.perf_counter_ns()
                active.policy.evaluate_json("data.portcullis.decision", document)
                timings.append((time.perf_counter_ns() - started) / 1000)
            figures[label].append(per_call(timings))
    return {label: statistics.median(values) for label, values in figures.items()}


async def fact_reads(tmp: Path, database_url: str, redis_url: str, calls: int, rounds: int) -> dict[str, float]:
    import redis.asyncio as aioredis

    from portcullis.adapters.auth import Principal
    from portcullis.adapters.budget_facts import BudgetFacts
    from portcullis.adapters.pipeline import Exchange
    from portcullis.adapters.store.postgres import PostgresKeyStore
    from portcullis.adapters.store.shared import SharedLedger
    from portcullis.adapters.store.sqlite import SqliteKeyStore, SqliteLedger
    from portcullis.engine.activation import activate
    from portcullis.engine.bundle import parse_bundle, read_bundle_files

    active = activate(parse_bundle(read_bundle_files(tiered(tmp / "facts")), []), bundle_gen.provider_names(), dt.date.today())
    plain = activate(parse_bundle(read_bundle_files(bundle_gen.write(tmp / "facts-plain")), []), bundle_gen.provider_names(), dt.date.today())
    sqlite = SqliteKeyStore.open(tmp / "facts.db")
    keys = await PostgresKeyStore.open(database_url, migrate=True)
    client = aioredis.Redis.from_url(redis_url)
    prefix = f"portcullis-bench-{uuid.uuid4().hex[:6]}:"
    ledgers = {"embedded (SQLite)": SqliteLedger(sqlite.connection), "shared (Redis)": SharedLedger(client, keys.pool, prefix)}
    now = dt.datetime.now(dt.UTC)
    read = active.budget_reads.for_team("team1")
    key = read.key({"team": "team1", "user": "user1-1", "key_id": "k"}, now)
    sqlite.connection.execute("INSERT INTO counters (key, value, expires_at, peak) VALUES (?, 1, '2999-01-01', 4200000000)", (key,))
    await client.set(f"{prefix}counter:{key}", 1)
    await client.set(f"{prefix}counter:{key}:peak", 4_200_000_000)

    def exchange(bundle: Any) -> Exchange:
        ex = Exchange("req", protocol=None, started=time.monotonic(), arrived=now)  # type: ignore[arg-type]
        ex.principal, ex.bundle = Principal("k", "team1", "user1-1"), bundle
        return ex

    variants = {f"{name}, tiered team": (BudgetFacts(ledger), exchange(active)) for name, ledger in ledgers.items()}
    variants["team without tiers (baseline)"] = (BudgetFacts(ledgers["embedded (SQLite)"]), exchange(plain))
    figures: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(rounds):
        for label, (facts, ex) in variants.items():
            timings = []
            for _ in range(calls):
                started = time.perf_counter_ns()
                await facts.gather(ex)
                timings.append((time.perf_counter_ns() - started) / 1000)
            figures[label].append(per_call(timings))
    print(f"  (the tiered team's fact: {await variants['shared (Redis), tiered team'][0].gather(variants['shared (Redis), tiered team'][1])})")
    await client.aclose()
    await keys.close()
    await sqlite.close()
    return {label: statistics.median(values) for label, values in figures.items()}


async def peak_upkeep(redis_url: str, calls: int, rounds: int) -> dict[str, float]:
    """Only the Redis part of a reservation and its settlement (the two scripts, as the
    shared ledger calls them, on a counter Redis has), with and without the peak."""
    import redis.asyncio as aioredis

    from portcullis.adapters.store import redis_scripts

    client = aioredis.Redis.from_url(redis_url)
    prefix = f"portcullis-bench-{uuid.uuid4().hex[:6]}:"
    scripts = {
        "Redis reserve + settle scripts (pipelined), with the peak": (
            client.register_script(redis_scripts.RESERVE),
            client.register_script(redis_scripts.SETTLE),
        ),
        "the same scripts without it (baseline)": (
            client.register_script(redis_scripts.RESERVE.replace("if ARGV[5 * i] ~= '1' then raise_peak(key, after) end", "")),
            client.register_script(redis_scripts.SETTLE.replace("if (not window) and tonumber(delta) > 0 then raise_peak(key, after[i - 1]) end", "")),
        ),
    }

    async def script_time(label: str, reserve: Any, settle: Any) -> float:
        """Per reservation + settlement, pipelined 100 at a time: the round trip is
        amortised, so what is left is mostly Redis running the scripts."""
        counter = f"{prefix}counter:{label[:5]}|cost|M2099-01"
        await client.set(counter, 0, ex=3600)
        timings = []
        for batch in range(max(1, calls // 100)):
            pipe = client.pipeline(transaction=False)
            for n in range(100):
                rid = f"req_{batch}_{n}_{uuid.uuid4().hex[:8]}"
                await reserve(keys=[counter, f"{prefix}reserved:{rid}"], args=[50_000, 10**15, 1, -1, 0, int(time.time() * 1000), rid], client=pipe)
                await settle(
                    keys=[f"{prefix}settled:{rid}:settled", counter], args=[60, rid, -49_000 + n % 7 if n % 10 else 1_000, 0], client=pipe
                )  # one in ten settles higher
            started = time.perf_counter_ns()
            await pipe.execute()
            timings.append((time.perf_counter_ns() - started) / 1000 / 100)
        return per_call(timings)

    assert len({script.script for pair in scripts.values() for script in pair}) == 4, "the baseline scripts must differ from the shipped ones"
    figures: dict[str, list[float]] = {label: [] for label in scripts}
    for _ in range(rounds):
        for label, (reserve, settle) in scripts.items():
            figures[label].append(await script_time(label, reserve, settle))
    async for key in client.scan_iter(match=f"{prefix}*", count=1000):
        await client.delete(key)
    await client.aclose()
    return {label: statistics.median(values) for label, values in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=4000)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    with tempfile.TemporaryDirectory(prefix="portcullis-tiers-") as tmp, scratch_database(admin_url) as database_url:
        print(f"policy decision, {args.decisions} mixed requests x {args.rounds} rounds, median µs:")
        for label, value in decisions(Path(tmp), args.decisions, args.rounds).items():
            print(f"  {label:48s} {value:8.1f}")
        print(f"budgets fact (gather), {args.reads} reads x {args.rounds} rounds, median µs:")
        for label, value in asyncio.run(fact_reads(Path(tmp), database_url, redis_url, args.reads, args.rounds)).items():
            print(f"  {label:48s} {value:8.1f}")
        print(f"peak upkeep, {args.reads} reservations x {args.rounds} rounds, median µs:")
        for label, value in asyncio.run(peak_upkeep(redis_url, args.reads, args.rounds)).items():
            print(f"  {label:48s} {value:8.1f}")


if __name__ == "__main__":
    main()
