"""How well the reference intent router (examples/intent/router.yaml, with the quickstart
bundle's keyword sets) picks a task's tier, and what routing costs a request.

Each labelled task (tests/data/intent_tasks.md) is sent as its client would send it —
Claude Code and opencode over Anthropic Messages, Codex over the Responses API, SDK
programs over Messages; its system prompt, its tools, its turns and its reasoning
request — and goes through what the gateway runs for a request: the `features` fact
source over ``Exchange.conversation()``, then the bundle's decision. Printed: accuracy
per tier and per domain, the 3 × 3 confusion matrix (rows: label, columns: routed),
and the median cost of features + decision with the router against the same bundle
without one, in the same run (every decision a cache miss: each request has its own key).

Tune rules on the tuning set only; the held-out set is measured, never read.

    python -m bench.intent_accuracy [--set tuning|heldout|both] [--misses]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from portcullis.adapters.auth import Principal
from portcullis.adapters.intent.features import FeatureSource
from portcullis.adapters.intent.routers import BundleRouters
from portcullis.adapters.pipeline import Exchange
from portcullis.adapters.policy_input import decide
from portcullis.adapters.protocols.registry import protocol
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files
from portcullis.engine.clients import client_of

ROOT = Path(__file__).resolve().parent.parent
SETS = {"tuning": ROOT / "tests" / "data" / "intent_tasks_tuning.jsonl", "heldout": ROOT / "tests" / "data" / "intent_tasks_heldout.jsonl"}
ROUTER = ROOT / "examples" / "intent" / "router.yaml"
INTENT_DATA = "portcullis/intent/data.yaml"
TIERS = ("light", "standard", "frontier")
REQUESTED = "claude-sonnet-4-5"
USER_AGENTS = {
    "claude-code": "claude-cli/2.1.197 (external, cli)",
    "codex": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) unknown (codex_exec; 0.171.0)",
    "opencode": "opencode/1.18.2 ai-sdk/anthropic",
    "sdk": "Anthropic/Python 0.69.0",
}
COST_ROUNDS = 5


def bundles() -> tuple[ActiveBundle, ActiveBundle]:
    """The quickstart bundle with the reference router, and as shipped (no router)."""
    files = read_bundle_files(ROOT / "policies")
    shipped = yaml.safe_load(files[INTENT_DATA])
    routed = {**files, INTENT_DATA: yaml.safe_dump({**shipped, "routers": [yaml.safe_load(ROUTER.read_text())]}).encode()}
    today = dt.date.today()
    return activate(parse_bundle(routed, []), ["mock"], today), activate(parse_bundle(files, []), ["mock"], today)


def tools_of(count: int) -> list[dict[str, Any]]:
    return [{"name": f"tool_{i}", "description": "A tool the agent offers.", "input_schema": {"type": "object", "properties": {}}} for i in range(count)]


def request_of(task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(protocol, body) as the task's client sends it."""
    history: list[tuple[str, str]] = [("user", task["text"])]
    for turn in range(1, task["turns"]):
        history += [("assistant", f"Step {turn} done."), ("user", "Go on.")]
    if task["client"] == "codex":
        body: dict[str, Any] = {
            "model": REQUESTED,
            "instructions": task["system"],
            "input": [
                {"type": "message", "role": role, "content": [{"type": "input_text" if role == "user" else "output_text", "text": text}]}
                for role, text in history
            ],
            "tools": [
                {"type": "function", "name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"]}
                for tool in tools_of(task["tools"])
            ],
            "store": False,
        }
        if task["reasoning"]:
            body["reasoning"] = {"effort": "high"}
        return "openai_responses", body
    body = {"model": REQUESTED, "max_tokens": 4096, "messages": [{"role": role, "content": text} for role, text in history]}
    if task["system"]:
        body["system"] = task["system"]
    if task["tools"]:
        body["tools"] = tools_of(task["tools"])
    if task["reasoning"]:
        body["thinking"] = {"type": "enabled", "budget_tokens": 2048}
    return "anthropic_messages", body


def exchange_of(task: dict[str, Any], bundle: ActiveBundle, key_id: str) -> Exchange:
    name, body = request_of(task)
    raw = json.dumps(body).encode()
    tools = [tool["name"] for tool in body.get("tools", [])]
    request = ParsedRequest(name, raw, body, REQUESTED, False, 4096, [], tools=tools, client=client_of(USER_AGENTS[task["client"]]))
    exchange = Exchange("bench", protocol(name), 0.0, dt.datetime.now(dt.UTC), principal=Principal(key_id, "demo", None), request=request)
    exchange.bundle = bundle
    return exchange


async def route(task: dict[str, Any], bundle: ActiveBundle, source: FeatureSource, key_id: str) -> tuple[str, dict[str, Any] | None]:
    """The tier the gateway would route ``task`` to, and its features."""
    exchange = exchange_of(task, bundle, key_id)
    features = await source.gather(exchange)
    facts = {"features": features} if features is not None else {}
    assert exchange.principal is not None and exchange.request is not None
    plan = decide(bundle, exchange.principal, exchange.request, facts)
    record = plan.routing.layer_record("intent")
    return (record["tier"] if record else "none"), features


def report(name: str, tasks: list[dict[str, Any]], routed: list[str], misses: bool) -> None:
    right = sum(task["tier"] == tier for task, tier in zip(tasks, routed, strict=True))
    print(f"\n{name}: {right}/{len(tasks)} routed to their labelled tier ({right / len(tasks):.1%})")
    for key in ("tier", "domain"):
        for value in sorted({task[key] for task in tasks}):
            pairs = [(t, r) for t, r in zip(tasks, routed, strict=True) if t[key] == value]
            hits = sum(t["tier"] == r for t, r in pairs)
            print(f"  {key} {value:<10} {hits:>3}/{len(pairs):<3} {hits / len(pairs):6.1%}")
    confusion = Counter((task["tier"], tier) for task, tier in zip(tasks, routed, strict=True))
    print(f"  confusion (rows: label, columns: routed)\n  {'':<10}" + "".join(f"{tier:>10}" for tier in TIERS))
    for label in TIERS:
        print(f"  {label:<10}" + "".join(f"{confusion[(label, tier)]:>10}" for tier in TIERS))
    print(f"  frontier tasks routed light: {confusion[('frontier', 'light')]}; light tasks routed frontier: {confusion[('light', 'frontier')]}")
    if misses:
        for task, tier in zip(tasks, routed, strict=True):
            if task["tier"] != tier:
                print(f"    {task['id']} {task['tier']} -> {tier}: {task['text'][:100]!r}")


def cost(tasks: list[dict[str, Any]], routed_bundle: ActiveBundle, plain_bundle: ActiveBundle) -> None:
    """Median µs of features + decision per request, with the router and without."""
    labels = ("with the router", "without a router")
    bundles = dict(zip(labels, (routed_bundle, plain_bundle), strict=True))
    sources = {label: FeatureSource(BundleRouters()) for label in labels}
    timings: dict[str, list[float]] = {label: [] for label in labels}

    async def measure() -> None:
        calls = 0
        for _ in range(COST_ROUNDS):
            for task in tasks:
                for label in labels:  # interleaved, so both see the same machine
                    calls += 1
                    exchange = exchange_of(task, bundles[label], f"bench-{calls}")  # its own key: a decision-cache miss
                    assert exchange.principal is not None and exchange.request is not None
                    started = time.perf_counter()
                    features = await sources[label].gather(exchange)
                    decide(bundles[label], exchange.principal, exchange.request, {"features": features} if features is not None else {})
                    timings[label].append((time.perf_counter() - started) * 1e6)

    asyncio.run(measure())
    print(f"\ncost per request, features + decision ({COST_ROUNDS} rounds over {len(tasks)} tasks, same run, each decision a cache miss):")
    for label, values in timings.items():
        print(f"  {label:<18} median {statistics.median(values):8.1f} µs   p90 {statistics.quantiles(values, n=10)[-1]:8.1f} µs")
    print(f"  routing adds {statistics.median(timings['with the router']) - statistics.median(timings['without a router']):.1f} µs (median)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", choices=("tuning", "heldout", "both"), default="both")
    parser.add_argument("--misses", action="store_true", help="list the misroutes (tuning set only: the held-out set is never read)")
    args = parser.parse_args()
    routed_bundle, plain_bundle = bundles()
    names = ["tuning", "heldout"] if args.set == "both" else [args.set]
    every: list[dict[str, Any]] = []
    for name in names:
        tasks = [json.loads(line) for line in SETS[name].read_text().splitlines() if line.strip()]
        source = FeatureSource(BundleRouters())
        routed = [asyncio.run(route(task, routed_bundle, source, f"accuracy-{i}"))[0] for i, task in enumerate(tasks)]
        report(f"{name} set ({SETS[name].name})", tasks, routed, args.misses and name == "tuning")
        every += tasks
    cost(every, routed_bundle, plain_bundle)


if __name__ == "__main__":
    main()
