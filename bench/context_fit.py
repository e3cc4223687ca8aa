"""What routing layer L5 (context fit) adds per request, beside the request's main
decision, measured in one run so the figures compare.

    .venv/bin/python bench/context_fit.py

On the generated 50-team / 500-user / 40-model bundle (bench/bundle_gen.py), each
round times, interleaved: the main decision (``data.portcullis.decision``, uncached,
as a first request sees it), the context-fit entry point for 1, 2 and 3 targets, and
the whole layer as governance runs it: for targets with room to spare (the bundle's
screen admits them, the rule is not evaluated) and for targets within the screen's
margin of their window (input document, evaluation, verdicts read).
Figures are medians per call, median over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bundle_gen  # noqa: E402


def main() -> None:
    from portcullis.adapters.context_fit import judge
    from portcullis.adapters.protocols.openai_chat import wire as chat
    from portcullis.engine.activation import CONTEXT_FIT_RULE, DECISION_RULE, activate
    from portcullis.engine.bundle import parse_bundle, read_bundle_files
    from portcullis.engine.context_fit import EXACT, UPPER_BOUND, Generation, Sized, fit_input
    from portcullis.engine.target import Target

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per round and measurement")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="portcullis-fit-") as tmp:
        directory = bundle_gen.write(Path(tmp) / "bundle")
        active = activate(parse_bundle(read_bundle_files(directory), []), bundle_gen.provider_names(), dt.date.today())
    tenants, catalog, _ = bundle_gen.generate()
    rng = random.Random(11)
    teams, names = list(tenants["teams"]), list(catalog["models"]) + list(catalog["aliases"])
    decisions = []
    for _ in range(args.calls):
        team = rng.choice(teams)
        request = {"model": rng.choice(names), "requires": ["streaming", "tools"], "protocol": "openai_chat", "stream": True}
        principal = {"team": team, "user": rng.choice([None, *tenants["teams"][team]["users"]]), "key_id": f"key_{rng.randrange(1 << 40):016x}"}
        decisions.append(json.dumps({"principal": principal, "request": request}))
    targets = [Target("m", "p", f"model-{n}", "r", 1, 200000, 8192, ()) for n in range(3)]
    sized = [Sized(target, 1200 + n, EXACT if n % 2 else UPPER_BOUND) for n, target in enumerate(targets)]
    fits = {n: json.dumps(fit_input(sized[:n], Generation(1024, None, "low"))) for n in (1, 2, 3)}
    # within the screen's margin of the window, though inside it: the rule is evaluated
    close = [Target("m", "p", f"close-{n}", "r", 1, 1200 + 1024 + 60, 8192, ()) for n in range(2)]
    near = [Sized(target, 1200, EXACT if n % 2 else UPPER_BOUND) for n, target in enumerate(close)]
    parsed = chat.parse(json.dumps({"model": "m", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}]}).encode(), {})

    async def no_estimate() -> int:
        raise AssertionError("every target fits on its first count")

    loop = asyncio.new_event_loop()
    screen, generation = active.fit_screen, Generation(1024, None, "low")
    assert screen is not None and screen.admits(sized[:2], generation) and not screen.admits(near, generation)

    def layer_in_loop(targets: list[Sized]) -> None:
        verdicts = loop.run_until_complete(judge(active, parsed, targets, no_estimate))
        assert all(verdict.fits for verdict in verdicts)

    measurements = {
        "main decision": lambda i: active.policy.evaluate_json(DECISION_RULE, decisions[i]),
        "context fit, 1 target": lambda i: active.policy.evaluate_json(CONTEXT_FIT_RULE, fits[1]),
        "context fit, 2 targets": lambda i: active.policy.evaluate_json(CONTEXT_FIT_RULE, fits[2]),
        "context fit, 3 targets": lambda i: active.policy.evaluate_json(CONTEXT_FIT_RULE, fits[3]),
        "screen alone, 2 targets": lambda i: screen.admits(sized[:2], generation),
        "layer, 2 targets, screened": lambda i: layer_in_loop(sized[:2]),
        "layer, 2 targets near window": lambda i: layer_in_loop(near),
    }
    figures: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for label, call in measurements.items():
            timings = []
            for i in range(args.calls):
                started = time.perf_counter_ns()
                call(i)
                timings.append((time.perf_counter_ns() - started) / 1000)
            figures.setdefault(label, []).append(statistics.median(timings))
    loop.close()
    print(f"per request, {args.calls} calls x {args.rounds} rounds (regorus, one thread), median of the rounds' medians:")
    baseline = statistics.median(figures["main decision"])
    for label, values in figures.items():
        median = statistics.median(values)
        print(f"  {label:<28} {median:8.1f} µs   {100 * median / baseline:5.1f}% of the main decision")


if __name__ == "__main__":
    main()
