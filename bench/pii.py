"""What the PII guard costs: the filter stage in-process, and requests and streams
through a real gateway with and without a PII policy, side by side in one run.

    python bench/pii.py [--duration 5] [--streams 200]
"""

from __future__ import annotations

import argparse
import asyncio
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
from portcullis.adapters.offload import serialised  # noqa: E402
from portcullis.adapters.pii.detectors import Detector  # noqa: E402
from portcullis.adapters.pii.guard import PiiGuard  # noqa: E402
from portcullis.adapters.pii.vault import MemoryVault  # noqa: E402
from portcullis.adapters.pipeline import Exchange, utc_now  # noqa: E402
from portcullis.adapters.protocols.openai_chat import PROTOCOL as openai_chat  # noqa: E402
from portcullis.engine.governance import Limits  # noqa: E402
from portcullis.engine.pii.policy import PiiPolicy  # noqa: E402
from portcullis.engine.plan import DecisionPlan  # noqa: E402

ACTIONS = {"EMAIL": "pseudonymize", "PHONE": "pseudonymize", "CREDIT_CARD": "mask", "IP_ADDRESS": "redact", "KR_RRN": "block", "SECRET": "block"}
POLICY = {"bench-pii": {"teams": ["team1"], "actions": ACTIONS}}
PERSONAL = (
    "Please draft a reply to maria.garcia@example.com (cc kenji.tanaka@example.jp) confirming the refund to card 4111 1111 1111 1111; "
    "she called from +44 20 7946 0958 and the order was placed from 203.0.113.42. "
)


def chat_body(size: int) -> dict[str, Any]:
    """A chat request of about ``size`` bytes: agent-style context (code, logs) with six
    personal values in the last message."""
    code = (ROOT / "adapters" / "executor.py").read_text()
    filler = (code * (size // len(code) + 1))[: max(0, size - len(PERSONAL) - 200)]
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    if filler:
        messages.append({"role": "user", "content": f"Context:\n{filler}"})
    messages.append({"role": "user", "content": PERSONAL})
    return {"model": "gpt-m1", "messages": messages, "max_tokens": 64}


def stage_cost(samples: int) -> dict[str, dict[str, float]]:
    """PiiGuard.admit alone (parse excluded), per request, in this process."""
    detectors: dict[str, Detector] = {}
    try:
        from portcullis.adapters.pii.presidio import NerDetector

        ner = NerDetector()
        asyncio.run(ner.load())
        detectors["ner"] = ner
    except ImportError:
        ner = None
    guard = PiiGuard(MemoryVault(), detectors)
    patterns = PiiPolicy(("bench",), ACTIONS, ("patterns",), 0.6, frozenset({"text"}), "block", "fail_closed", False)
    with_ner = PiiPolicy(("bench",), {**ACTIONS, "PERSON": "pseudonymize"}, ("patterns", "ner"), 0.6, frozenset({"text"}), "block", "fail_closed", False)
    cases = [("2 KB chat", 2_000, None), ("2 KB chat", 2_000, patterns), ("85 KB agent request", 85_000, None), ("85 KB agent request", 85_000, patterns)]
    if ner is not None:
        cases += [("2 KB chat", 2_000, with_ner), ("20 KB agent request", 20_000, with_ner)]
    results = {}
    for label, size, policy in cases:
        raw = json.dumps(chat_body(size)).encode()
        runs = samples if size < 50_000 and (policy is None or "ner" not in policy.detectors) else max(20, samples // 20)

        async def timed(policy: PiiPolicy | None = policy, raw: bytes = raw, runs: int = runs) -> list[float]:
            timings = []
            for _ in range(runs):
                request = openai_chat.wire.parse(raw, {})
                plan = DecisionPlan(True, ({"code": "allowed", "message": ""},), "gpt-m1", "gpt-m1", (), (), Limits(), policy)
                principal = Principal("key_0000000000000001", "team1", None)
                exchange = Exchange("req_bench", openai_chat, 0.0, utc_now(), principal=principal, request=request, plan=plan, targets=plan.targets)
                started = time.perf_counter()
                admission = await guard.admit(exchange)
                if admission is not None and admission.body_changed:  # as the pipeline does once for every step
                    request.raw = await serialised(request.body, len(request.raw))
                timings.append((time.perf_counter() - started) * 1e6)
            return timings

        timings = asyncio.run(timed())
        mode = "no policy" if policy is None else "+".join(policy.detectors)
        timings.sort()
        results[f"{label}, {mode}"] = {"median_us": statistics.median(timings), "p99_us": timings[int(len(timings) * 0.99) - 1]}
    guard.close()
    return results


def through_gateways(duration: int, streams: int) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    with tempfile.TemporaryDirectory(prefix="portcullis-bench-pii-") as tmp:
        workdir = Path(tmp)
        bundles = {
            "no PII policy": bundle_gen.write(workdir / "plain", rules=False),
            "PII policy": bundle_gen.write(workdir / "pii", rules=False, pii=POLICY),
        }
        return side_by_side.compare(workdir, bundles, chat_body(2_000), duration, streams)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--streams", type=int, default=200, help="streamed requests timed for first-token latency")
    parser.add_argument("--samples", type=int, default=2000, help="filter-stage calls timed per case")
    args = parser.parse_args()
    stages = stage_cost(args.samples)
    rows, ttft = through_gateways(args.duration, args.streams)
    print(f"\nPII guard — {os.cpu_count()} cores; six personal values per request (pseudonymize, mask, redact)")
    print("\nthe filter stage alone (detect, judge, transform, re-serialise), per request:")
    for label, figures in stages.items():
        print(f"  {label:<46} median {figures['median_us']:9.1f} µs   p99 {figures['p99_us']:9.1f} µs")
    heading = "2 KB chat through the gateway (the answer echoes the placeholders, so they are restored):"
    side_by_side.report(rows, ttft, heading, args.streams, baseline="no PII policy", candidate="PII policy")


if __name__ == "__main__":
    main()
