"""Portcullis benchmark: the gateway beside its baselines, in one run.

    make bench                      # or: .venv/bin/python bench/run.py --duration 3 --concurrency 1,16,64
    make bench BENCH_ARGS=--only-headline

First the headline (``bench/pipeline.py``: upstream direct, the floor proxy and the
gateway bare, with the quickstart pipeline and on the shared store; ``--only-headline``
stops after it, ``--skip-headline`` leaves it out). Then prints, on a generated 50-team / 500-user / 40-model bundle with 201 governance rules:
1. for each scenario and concurrency, p50/p99 and requests per second straight to the
   fake provider and through the gateway (embedded store), and the latency it adds;
2. the same chat request through the gateway with the embedded store, with Redis +
   PostgreSQL, and with no governance rules at all;
   and two chat requests through the gateway with every routing layer on
   (``bundle_gen.write(routing=True)``) beside the same gateway with them off: one the
   intent router keeps on its model (the team's budget tier not reached), one it sends
   to its light tier's model;
3. what one reservation plus its settlement costs in each ledger, called directly;
4. the policy decision latency with and without the per-bundle index;
5. the gateway's resident memory.

Load comes from wrk (a Python load generator tops out below what the gateway serves on
these cores); wrk, the fake provider and the gateway share the machine's cores.
PostgreSQL and Redis come from DATABASE_URL / REDIS_URL (`make bench` provides them).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bundle_gen  # noqa: E402
from bench.harness import Gateway, ensure_wrk, free_port, rss_mb, scratch_database, start_fake, wrk  # noqa: E402
from bench.scenarios import scenarios  # noqa: E402


def decision_latency(bundle: Path, samples: int) -> dict[str, dict[str, float]]:
    """Median and p99 of one decision, with the per-bundle index (as served) and
    without it (the rules matching globs, sorting targets and merging governance
    rules on every request)."""
    from portcullis.engine.activation import activate
    from portcullis.engine.bundle import parse_bundle, read_bundle_files
    from portcullis.engine.rego import Policy

    active = activate(parse_bundle(read_bundle_files(bundle), []), bundle_gen.provider_names(), dt.date.today())
    tenants, catalog, _ = bundle_gen.generate()
    rng = random.Random(11)
    teams = list(tenants["teams"])
    names = list(catalog["models"]) + list(catalog["aliases"])
    inputs = []
    for _ in range(samples):
        team = rng.choice(teams)
        user = rng.choice([None, *tenants["teams"][team]["users"]])
        request = {"model": rng.choice(names), "requires": ["streaming", "tools"], "protocol": "openai_chat", "stream": True}
        inputs.append({"principal": {"team": team, "user": user, "key_id": f"key_{rng.randrange(1 << 40):016x}"}, "request": request})
    results = {}
    for label, policy in (("indexed (served)", active.policy), ("no index (baseline)", Policy(active.bundle.modules, active.bundle.data))):
        timings = []
        for document in inputs:
            started = time.perf_counter_ns()
            policy.evaluate("data.portcullis.decision", document)
            timings.append((time.perf_counter_ns() - started) / 1000)
        timings.sort()
        results[label] = {"median_us": statistics.median(timings), "p99_us": timings[int(len(timings) * 0.99)]}
    return results


def ledger_costs(database_url: str, redis_url: str, workdir: Path, calls: int) -> dict[str, dict[str, float]]:
    """One reservation and its settlement, called directly, in each ledger: the cost
    governance adds per request, beside a request with nothing to meter."""
    import redis.asyncio as aioredis

    from portcullis.adapters.store.ledger import Final, Reservation
    from portcullis.adapters.store.postgres import PostgresKeyStore
    from portcullis.adapters.store.shared import SharedLedger
    from portcullis.adapters.store.sqlite import SqliteKeyStore, SqliteLedger
    from portcullis.adapters.store.sqlite_write_behind import WriteBehindLedger
    from portcullis.engine.governance import Bound, CounterLimit, Limits, charges

    limits = Limits(
        (
            CounterLimit("team:bench", "cost", "month", 10**15, None, True, ("m",), (80, 95)),
            CounterLimit("team:bench", "cost", "day", None, 10**14, False, ("d",), ()),
            CounterLimit("user:bench/u", "requests", "minute", 10**9, None, True, ("r",), ()),
            CounterLimit("user:bench/u", "tokens", "minute", 10**15, None, True, ("r",), ()),
        )
    )

    def reservation(with_counters: bool) -> Reservation:
        now = dt.datetime.now(dt.UTC)
        bound = Bound(2000, 50_000, "bench")
        made = tuple(charges(limits, bound, now)) if with_counters else ()
        return Reservation(f"req_{uuid.uuid4().hex}", "r", "main", {"team": "bench", "user": "u", "key_id": "k"}, made, bound, now)

    async def settle(ledger: Any, reservation: Reservation) -> None:
        amounts = {c.key: 1 if c.limit.metric == "requests" else 300 for c in reservation.charges}
        await ledger.settle(reservation.id, reservation.charge_records(), Final("settled", 300, 1_000, amounts))

    async def measure(ledger: Any, with_counters: bool, in_flight: int = 1) -> dict[str, float]:
        """Per request: ``in_flight`` reservations at once, then their settlements."""
        timings = []
        for _ in range(max(1, calls // in_flight)):
            made = [reservation(with_counters) for _ in range(in_flight)]
            started = time.perf_counter_ns()
            await asyncio.gather(*(ledger.reserve(item) for item in made))
            await asyncio.gather(*(settle(ledger, item) for item in made))
            timings.append((time.perf_counter_ns() - started) / 1000 / in_flight)
        timings.sort()
        return {"median_us": statistics.median(timings), "p99_us": timings[int(len(timings) * 0.99)]}

    async def main() -> dict[str, dict[str, float]]:
        results = {}
        sqlite = SqliteKeyStore.open(workdir / "ledger-bench.db")
        embedded = SqliteLedger(sqlite.connection)
        results["embedded (SQLite), 4 counters"] = await measure(embedded, True)
        results["embedded (SQLite), no counters"] = await measure(embedded, False)
        results["embedded, 16 in flight, 4 counters"] = await measure(embedded, True, 16)
        await sqlite.close()
        sqlite = SqliteKeyStore.open(workdir / "ledger-behind.db")
        behind = WriteBehindLedger.open(sqlite.connection, workdir / "ledger-behind.db")
        assert behind is not None
        results["written behind (workers: 1), 4 counters"] = await measure(behind, True)
        results["written behind, 16 in flight, 4 counters"] = await measure(behind, True, 16)
        await behind.close()
        await sqlite.close()
        keys = await PostgresKeyStore.open(database_url)
        client = aioredis.Redis.from_url(redis_url)
        shared = SharedLedger(client, keys.pool, f"portcullis-bench-{uuid.uuid4().hex[:6]}:")
        results["shared (Redis + PostgreSQL), 4 counters"] = await measure(shared, True)
        results["shared (Redis + PostgreSQL), no counters"] = await measure(shared, False)
        await client.aclose()
        await keys.close()
        return results

    return asyncio.run(main())


# Two chat requests for team1 on the routing bundle: gpt-m1 is covered by an intent
# router for every team (standard tier: gpt-m1, light: gpt-m9) and team1's monthly
# budget, barely used, has reached no tier.
ROUTING_CHATS = {
    "chat, router keeps the model": "Write a paragraph on how our quarterly report numbers compare with the previous year.",
    "chat, light tier substitutes": "Summarise the quarterly report in three bullet points.",
}


def routing_comparison(workdir: Path, fake_port: int, off: Path, on: Path, duration: int, running: list[Gateway]) -> list[dict[str, Any]]:
    """The same chat requests through the gateway with the routing layers off (the
    generated bundle) and on (its routing variant), at concurrency 1 and 16, in one run:
    each gateway's first answer says which model served (x-portcullis-model-fallback)."""
    wrk_bin = ensure_wrk()
    rows = []
    for label, bundle in (("layers off", off), ("layers on", on)):
        gateway = Gateway(workdir, f"routing-{label.replace(' ', '-')}", fake_port, bundle, {"kind": "embedded"}, {})
        running.append(gateway)
        headers = {"authorization": f"Bearer {gateway.key}"}
        for scenario, text in ROUTING_CHATS.items():
            body = {"model": "gpt-m1", "messages": [{"role": "user", "content": text}], "max_tokens": 64}
            warm = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=10)
            if warm.status_code != 200:
                sys.exit(f"bench: {scenario} with the {label} answered {warm.status_code}: {warm.text}")
            served = warm.json().get("model")
            substituted = warm.headers.get("x-portcullis-model-fallback")
            for connections in (1, 16):
                result = wrk(wrk_bin, f"{gateway.url}/v1/chat/completions", body, headers, connections, duration, workdir)
                rows.append({"gateway": label, "scenario": scenario, "concurrency": connections, "served": served, "substituted": substituted, **result})
        gateway.stop()
        running.remove(gateway)
    return rows


def report_routing(rows: list[dict[str, Any]], duration: int) -> None:
    print(f"\nchat through the gateway, routing layers off vs on (L3 budget tiers, L4 intent + session pin, L5-L7 settings; {duration}s per run):")
    for row in rows:
        figures = f"p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms  {row['rps']:7.0f} req/s  errors {row['errors']}"
        served = f"served {row['served']}" + (f" (header: {row['substituted']})" if row["substituted"] else "")
        print(f"  {row['gateway']:<10} {row['scenario']:<30} conc {row['concurrency']:>3}: {figures}  {served}")
    invalid = [row for row in rows if row["errors"]]
    for row in invalid:
        print(f"  INVALID: {row['gateway']}, {row['scenario']}, conc {row['concurrency']}: {row['errors']} non-2xx or socket errors")
    for scenario in ROUTING_CHATS:
        for connections in (1, 16):
            pair = {row["gateway"]: row for row in rows if row["scenario"] == scenario and row["concurrency"] == connections}
            if len(pair) == 2:
                print(f"  {scenario}, conc {connections}: layers add {pair['layers on']['p50_ms'] - pair['layers off']['p50_ms']:+.2f} ms at p50")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run after the headline")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--decisions", type=int, default=20000)
    parser.add_argument("--ledger-calls", type=int, default=2000)
    parser.add_argument("--only-routing", action="store_true", help="only the routing layers on vs off (section 2's last table)")
    headline = parser.add_argument_group("the headline (bench/pipeline.py, run first)")
    headline.add_argument("--only-headline", action="store_true", help="the headline alone")
    headline.add_argument("--skip-headline", action="store_true")
    headline.add_argument("--headline-duration", type=int, default=5, help="seconds per wrk run in the headline")
    headline.add_argument("--ttfb-duration", default="3", help="seconds of streams timed to their first content byte per headline row")
    headline.add_argument("--workers", default="1,auto", help="the headline gateways' workers settings")
    headline.add_argument("--messages", action="store_true", help="Anthropic Messages rows in the headline too")
    headline.add_argument("--peers", action="store_true", help="LiteLLM's row in the headline (make bench-peers)")
    args = parser.parse_args()
    status = 0
    if not args.skip_headline and not args.only_routing:
        from bench import pipeline

        options = ["--duration", str(args.headline_duration), "--concurrency", args.concurrency, "--ttfb-duration", args.ttfb_duration]
        options += ["--workers", args.workers] + ["--messages"] * args.messages + ["--peers"] * args.peers
        status = pipeline.main(options)
        if args.only_headline:
            return status
    return rest(args) or status


def rest(args: argparse.Namespace) -> int:
    """Sections 1-5 (the module docstring); 1 when a row had non-2xx answers or socket errors."""
    wrk_bin = ensure_wrk()
    levels = [int(c) for c in args.concurrency.split(",")]
    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

    with tempfile.TemporaryDirectory(prefix="portcullis-bench-") as tmp, scratch_database(admin_url) as database_url:
        workdir = Path(tmp)
        fake_port = free_port()
        fake = start_fake(workdir, fake_port)
        running: list[Gateway] = []
        try:
            fake_url = f"http://127.0.0.1:{fake_port}"
            bundle = bundle_gen.write(workdir / "bundle")
            ungoverned = bundle_gen.write(workdir / "bundle-no-rules", rules=False)

            routed = routing_comparison(workdir, fake_port, bundle, bundle_gen.write(workdir / "bundle-routing", routing=True), args.duration, running)
            if args.only_routing:
                report_routing(routed, args.duration)
                return 1 if any(row["errors"] for row in routed) else 0
            gateway = Gateway(workdir, "embedded", fake_port, bundle, {"kind": "embedded"}, {})
            running.append(gateway)
            rows = []
            for scenario in scenarios(gateway.key):
                warm = httpx.post(f"{gateway.url}{scenario.path}", json=scenario.body, headers=scenario.headers, timeout=10)
                if warm.status_code != 200:
                    sys.exit(f"bench: {scenario.name} through the gateway answered {warm.status_code}: {warm.text}")
                for connections in levels:
                    upstream = f"{fake_url}{scenario.direct_path}"
                    direct = wrk(wrk_bin, upstream, scenario.direct_body, scenario.direct_headers, connections, args.duration, workdir)
                    through = wrk(wrk_bin, f"{gateway.url}{scenario.path}", scenario.body, scenario.headers, connections, args.duration, workdir)
                    rows.append({"scenario": scenario.name, "concurrency": connections, "direct": direct, "gateway": through})
            rss, peak = rss_mb(gateway.process.pid)
            gateway.stop()
            running.remove(gateway)

            shared_env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
            shared_store = {"kind": "shared", "redis_prefix": f"portcullis-bench-{uuid.uuid4().hex[:6]}:"}
            stores = []
            for label, store, env, source in (
                ("embedded store", {"kind": "embedded"}, {}, bundle),
                ("Redis + PostgreSQL", shared_store, shared_env, bundle),
                ("no governance rules", {"kind": "embedded"}, {}, ungoverned),
            ):
                candidate = Gateway(workdir, label.replace(" ", "-").replace("+", ""), fake_port, source, store, env)
                running.append(candidate)
                chat = scenarios(candidate.key)[0]
                path, body, gateway_headers = chat.path, chat.body, chat.headers
                for connections in (1, 16):
                    stores.append(
                        {
                            "store": label,
                            "concurrency": connections,
                            **wrk(wrk_bin, f"{candidate.url}{path}", body, gateway_headers, connections, args.duration, workdir),
                        }
                    )
                candidate.stop()
                running.remove(candidate)
        finally:
            for process in [g.process for g in running] + [fake]:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=15)
        ledger = ledger_costs(database_url, redis_url, workdir, args.ledger_calls)
        decisions = decision_latency(bundle, args.decisions)

    print(f"\nPortcullis benchmark — {os.cpu_count()} cores shared by wrk, the fake provider and the gateway; {args.duration}s per run")
    print("bundle: 50 teams, 500 users, 40 models, 201 governance rules; gateway with the embedded store\n")
    print(
        f"{'scenario':<18}{'conc':>5} | {'direct p50':>10} {'p99':>8} {'req/s':>8} | "
        f"{'gateway p50':>11} {'p99':>8} {'req/s':>8} | {'added p50':>9} {'errors':>6}"
    )
    print("-" * 107)
    for row in rows:
        d, g = row["direct"], row["gateway"]
        print(
            f"{row['scenario']:<18}{row['concurrency']:>5} | {d['p50_ms']:>8.2f}ms {d['p99_ms']:>6.2f}ms {d['rps']:>8.0f} | "
            f"{g['p50_ms']:>9.2f}ms {g['p99_ms']:>6.2f}ms {g['rps']:>8.0f} | {g['p50_ms'] - d['p50_ms']:>7.2f}ms {int(d['errors'] + g['errors']):>6}"
        )
    print(f"\ngateway RSS after the runs: {rss:.0f} MB (peak {peak:.0f} MB)")
    print("\nchat through the gateway, by store (governance reserves before and settles after every request):")
    for row in stores:
        figures = f"p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms  {row['rps']:7.0f} req/s  errors {row['errors']}"
        print(f"  {row['store']:<22} conc {row['concurrency']:>3}: {figures}")
    report_routing(routed, args.duration)
    print(f"\nreservation + settlement per request, called directly, {args.ledger_calls} requests (one at a time, or 16 at once):")
    for label, figures in ledger.items():
        print(f"  {label:<42} median {figures['median_us']:7.1f} µs   p99 {figures['p99_us']:7.1f} µs")
    print(f"\npolicy decision, {args.decisions} mixed requests (regorus, one thread):")
    for label, figures in decisions.items():
        print(f"  {label:<20} median {figures['median_us']:7.1f} µs   p99 {figures['p99_us']:7.1f} µs")
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    document = {"runs": rows, "stores": stores, "routing": routed, "ledger": ledger, "rss_mb": rss, "peak_rss_mb": peak, "decisions": decisions}
    (results / "latest.json").write_text(json.dumps(document, indent=2))
    invalid = [f"{row['scenario']}, conc {row['concurrency']}" for row in rows if row["direct"]["errors"] or row["gateway"]["errors"]]
    invalid += [f"{row['store']}, conc {row['concurrency']}" for row in stores if row["errors"]]
    invalid += [f"routing {row['gateway']}, {row['scenario']}, conc {row['concurrency']}" for row in routed if row["errors"]]
    for name in invalid:
        print(f"INVALID: {name}: non-2xx answers or socket errors (see the errors column)")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
