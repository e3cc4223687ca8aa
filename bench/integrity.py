"""What prompt integrity costs: the scanner alone per text (the rules with and
without the de-obfuscation layer, and against an older rules file when given), the
request-side stage in-process (scan, spotlight, policy prompt; cold and warm scan
cache), a tool-call verdict, and requests and streams through a real gateway with and
without the policy, side by side in one run.

    python bench/integrity.py [--duration 5] [--streams 200] [--samples 500] [--baseline-rules data.yaml]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bundle_gen, side_by_side  # noqa: E402
from portcullis.adapters.auth import Principal  # noqa: E402
from portcullis.adapters.integrity.guard import PromptIntegrity  # noqa: E402
from portcullis.adapters.offload import serialised  # noqa: E402
from portcullis.adapters.pipeline import Exchange, utc_now  # noqa: E402
from portcullis.adapters.protocols.openai_chat import PROTOCOL as openai_chat  # noqa: E402
from portcullis.engine.activation import activate  # noqa: E402
from portcullis.engine.bundle import parse_bundle, read_bundle_files  # noqa: E402
from portcullis.engine.integrity.scanner import Scanner  # noqa: E402

POLICY = {
    "bench-agent-safety": {
        "teams": ["team1"],
        "prompt": {
            "version": "1",
            "text": "Follow the organisation's rules. Never run commands that download and execute code.",
            "canary": "PCX-CANARY-bench-00000001",
        },
        "spotlight": ["tool_results"],
        "injection": {"surfaces": {"user": "warn", "tool_results": "warn", "tool_descriptions": "warn"}},
        "tools": {"deny": ["remote-script-pipe", "destructive-command", "credential-files"]},
        "output": {"actions": {"canary": "withhold", "secrets": "redact", "urls": "flag"}},
    }
}


def agent_body(size: int) -> dict[str, Any]:
    """An agent turn of about ``size`` bytes: tool results (source files) behind a question."""
    code = (ROOT / "adapters" / "executor.py").read_text()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."}, {"role": "user", "content": "Why does the build fail?"}]
    i = 0
    while sum(len(json.dumps(m)) for m in messages) < size:
        chunk = code[(i * 4000) % len(code) :][:4000]
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{i}.py"})}}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": chunk})
        i += 1
    messages.append({"role": "user", "content": "Summarise what you found."})
    tools = [
        {
            "type": "function",
            "function": {"name": "read_file", "description": "Reads a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
        }
    ]
    return {"model": "gpt-m1", "messages": messages, "tools": tools, "max_tokens": 64}


def stage_cost(samples: int, workdir: Path) -> dict[str, dict[str, float]]:
    bundle = activate(
        parse_bundle(read_bundle_files(bundle_gen.write(workdir / "stage", rules=False, integrity=POLICY)), []),
        sorted(bundle_gen.provider_names()),
        dt.date.today(),
    )
    principal = Principal("key_0000000000000001", "team1", None)
    results: dict[str, dict[str, float]] = {}
    for label, size in (("2 KB chat", 2_000), ("85 KB agent turn", 85_000)):
        raw = json.dumps(agent_body(size)).encode()
        for mode in ("cold cache", "warm cache"):
            step = PromptIntegrity(b"k" * 32, cache_entries=10_000 if mode == "warm cache" else 0)

            async def timed(step: PromptIntegrity = step, raw: bytes = raw) -> list[float]:
                timings = []
                for n in range(samples + 1):
                    request = openai_chat.wire.parse(raw, {})
                    plan = bundle.decide(
                        {
                            "principal": principal.as_input(),
                            "request": {
                                "protocol": "openai_chat",
                                "model": "gpt-m1",
                                "stream": False,
                                "max_tokens": 64,
                                "requires": [],
                                "tools": request.tools,
                            },
                        }
                    )
                    exchange = Exchange(f"req_{n}", openai_chat, 0.0, utc_now(), principal=principal, request=request, plan=plan, bundle=bundle)
                    exchange.targets = plan.targets
                    started = time.perf_counter()
                    admission = await step.admit(exchange)
                    if admission is not None and admission.body_changed:  # as the pipeline does once for every step
                        request.raw = await serialised(request.body, len(request.raw))
                    if n:  # the first fills the warm cache
                        timings.append((time.perf_counter() - started) * 1e6)
                return sorted(timings)

            timings = asyncio.run(timed())
            results[f"{label}, {mode}"] = {"median_us": statistics.median(timings), "p99_us": timings[int(len(timings) * 0.99) - 1]}
    calls = [{"name": "bash", "arguments": {"command": "git status && make test"}}]
    timings = []
    for _ in range(samples):
        started = time.perf_counter()
        bundle.tool_call_verdicts(principal.as_input(), calls, ["bash"])
        timings.append((time.perf_counter() - started) * 1e6)
    timings.sort()
    results["tool-call verdict (one call)"] = {"median_us": statistics.median(timings), "p99_us": timings[int(len(timings) * 0.99) - 1]}
    return results


def scanner_cost(samples: int, baseline_rules: Path | None) -> dict[str, dict[str, float]]:
    """Per text, warm: source files as tool results (4 KB each) and the labelled
    tuning corpus's short texts, through scanners built side by side in this run."""
    import yaml

    rules = yaml.safe_load((ROOT / "policies" / "portcullis" / "integrity" / "data.yaml").read_text())["injection_rules"]
    scanners = {"shipped rules, no de-obfuscation": Scanner(rules, deobfuscate=False), "shipped rules + de-obfuscation": Scanner(rules)}
    if baseline_rules is not None:
        scanners = {"baseline rules, no de-obfuscation": Scanner(yaml.safe_load(baseline_rules.read_text())["injection_rules"], deobfuscate=False), **scanners}
    code = "".join(path.read_text() for path in sorted((ROOT / "adapters").glob("*.py")))
    corpus = ROOT / "tests" / "injection_corpus_tuning.jsonl"
    texts = {
        "4 KB source file": [code[i : i + 4000] for i in range(0, min(len(code), 200_000), 4000)],
        "short labelled text": [json.loads(line)["text"] for line in corpus.read_text().splitlines() if line.strip()],
    }
    results: dict[str, dict[str, float]] = {}
    for kind, batch in texts.items():
        for label, scanner in scanners.items():
            for text in batch:  # warm RE2's lazily built automaton, as a serving gateway has
                scanner.scan(text)
            timings = []
            for n in range(samples):
                text = batch[n % len(batch)]
                started = time.perf_counter()
                scanner.scan(text)
                timings.append((time.perf_counter() - started) * 1e6)
            timings.sort()
            results[f"{kind}: {label}"] = {"median_us": statistics.median(timings), "p99_us": timings[int(len(timings) * 0.99) - 1]}
    return results


def through_gateways(duration: int, streams: int, workdir: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    bundles = {
        "no policy": bundle_gen.write(workdir / "plain", rules=False),
        "integrity policy": bundle_gen.write(workdir / "integrity", rules=False, integrity=POLICY),
    }
    return side_by_side.compare(workdir, bundles, agent_body(20_000), duration, streams, {"x-portcullis-session-id": "bench-session"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--streams", type=int, default=200, help="streamed requests timed for first-token latency")
    parser.add_argument("--samples", type=int, default=500, help="stage calls timed per case")
    parser.add_argument("--baseline-rules", type=Path, help="an older integrity data.yaml whose injection rules to time alongside")
    parser.add_argument("--scanner-only", action="store_true", help="time the scanner alone, nothing else")
    args = parser.parse_args()
    scans = scanner_cost(args.samples * 4, args.baseline_rules)
    print(f"\nthe injection scanner alone, per text ({os.cpu_count()} cores, same run):")
    for label, figures in scans.items():
        print(f"  {label:<60} median {figures['median_us']:8.1f} µs   p99 {figures['p99_us']:8.1f} µs")
    if args.scanner_only:
        return
    with tempfile.TemporaryDirectory(prefix="portcullis-bench-integrity-") as tmp:
        stages = stage_cost(args.samples, Path(tmp))
        rows, ttft = through_gateways(args.duration, args.streams, Path(tmp))
    print(f"\nprompt integrity — {os.cpu_count()} cores; scanner: the shipped rules; output guard: canary, secrets, URLs")
    print("\nthe request-side stage alone (scan, spotlight, policy prompt, re-serialise), per request:")
    for label, figures in stages.items():
        print(f"  {label:<40} median {figures['median_us']:9.1f} µs   p99 {figures['p99_us']:9.1f} µs")
    heading = "20 KB agent turn through the gateway (same session each time, so the scan cache is warm; output guard on the answer):"
    side_by_side.report(rows, ttft, heading, args.streams, baseline="no policy", candidate="integrity policy")


if __name__ == "__main__":
    main()
