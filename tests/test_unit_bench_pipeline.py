"""The headline benchmark's pure parts: the quickstart bundle it lifts (every policy
kept, only limits multiplied, a valid bundle the gateway activates), the INVALID rule,
and issue 14's targets as same-run ratios."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import yaml

from bench import quickstart_bundle, verdict
from bench.first_byte import CONTENT, client_bound, percentile
from portcullis.engine.activation import activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files

FAKES = {"fake-anthropic": None, "fake-openai": None, "fake-bedrock": "us-east-1", "fake-responses": None}


def section(bundle: Path, name: str) -> dict:
    return yaml.safe_load((bundle / "portcullis" / name / "data.yaml").read_text())


def test_lifting_multiplies_every_limit_and_keeps_the_rest_of_each_rule() -> None:
    rule = {
        "subject": {"team": "demo", "per": "user"},
        "rate": {"rpm": 120, "tpm": 2000000},
        "quota": {"tokens_per_day": 5000000},
        "budget": {"limit_usd": "100.00", "period": "CalendarMonth", "hard_cap": True, "thresholds": [80, 95]},
        "failure_policy": "Warn",
    }
    lifted = quickstart_bundle.lift_rule(rule, 1000)
    assert lifted["rate"] == {"rpm": 120_000, "tpm": 2_000_000_000}
    assert lifted["quota"] == {"tokens_per_day": 5_000_000_000}
    assert Decimal(lifted["budget"]["limit_usd"]) == Decimal("100000")
    assert {k: v for k, v in lifted["budget"].items() if k != "limit_usd"} == {"period": "CalendarMonth", "hard_cap": True, "thresholds": [80, 95]}
    assert (lifted["subject"], lifted["failure_policy"]) == (rule["subject"], "Warn")
    assert rule["rate"]["rpm"] == 120  # the source is not changed


def test_the_lifted_quickstart_keeps_every_policy_and_activates_on_the_fake(tmp_path: Path) -> None:
    bundle = quickstart_bundle.write(tmp_path / "lifted")
    source = quickstart_bundle.QUICKSTART
    for name in ("pii", "integrity", "budget_tiers", "cache_domains", "tenants", "intent"):
        assert section(bundle, name) == section(source, name), name
    original, lifted = section(source, "governance")["rules"], section(bundle, "governance")["rules"]
    assert set(lifted) == set(original) and original
    for name, rule in original.items():
        assert lifted[name] == quickstart_bundle.lift_rule(rule)
    catalog = section(bundle, "catalog")
    providers = {target["provider"] for spec in catalog["models"].values() for target in spec["targets"]}
    assert providers == {"fake-anthropic", "fake-openai"}
    assert {price["provider"] for price in catalog["prices"]} == providers
    assert catalog["models"][quickstart_bundle.CHAT_MODEL]["targets"][0]["provider"] == "fake-openai"
    active = activate(parse_bundle(read_bundle_files(bundle), []), FAKES, dt.date.today())
    assert active.revision == "quickstart-1"


def test_the_bare_bundle_has_no_team_policies(tmp_path: Path) -> None:
    bare = quickstart_bundle.write_bare(tmp_path / "bare")
    assert section(bare, "governance") == {"rules": {}}
    assert section(bare, "pii")["policies"] == {} and section(bare, "integrity")["policies"] == {}
    assert section(bare, "budget_tiers")["teams"] == {} and section(bare, "cache_domains")["pin"] is False
    assert section(bare, "integrity")["injection_rules"]  # the rules stay; no policy applies them
    assert section(bare, "tenants") == section(quickstart_bundle.QUICKSTART, "tenants")
    activate(parse_bundle(read_bundle_files(bare), []), FAKES, dt.date.today())


def row(target: str, scenario: str = verdict.CHAT, concurrency: int = 1, workers: str = "1", **figures: object) -> dict:
    measured = {"p50_ms": 1.0, "p99_ms": 2.0, "rps": 100.0, "requests": 100, "non_2xx": 0, "socket_errors": 0, **figures}
    return {"target": target, "scenario": scenario, "concurrency": concurrency, "workers": workers, **measured}


def test_any_non_2xx_or_socket_error_makes_a_row_invalid() -> None:
    assert verdict.invalid_reasons(row(verdict.QUICKSTART)) == []
    assert verdict.invalid_reasons(row(verdict.QUICKSTART, non_2xx=1)) == ["1 non-2xx"]
    assert verdict.invalid_reasons(row(verdict.QUICKSTART, socket_errors=3)) == ["3 socket errors"]
    assert verdict.invalid_reasons(row(verdict.QUICKSTART, socket_errors=3, timeouts=2)) == ["3 socket errors (2 of them timeouts)"]
    assert verdict.invalid_reasons(row(verdict.QUICKSTART, requests=0)) == ["no request completed"]
    assert verdict.invalid_reasons({**row(verdict.QUICKSTART), "refused": 429}) == ["warm-up answered 429"]
    streamed = row(verdict.QUICKSTART, verdict.CHAT_STREAM, first_byte={"non_2xx": 0, "socket_errors": 2})
    assert verdict.invalid_reasons(streamed) == ["2 streams cut or without content"]


def test_targets_are_same_run_ratios_and_skip_invalid_rows() -> None:
    stream = verdict.CHAT_STREAM
    rows = [
        row(verdict.DIRECT, p50_ms=0.10, workers="-"),
        row(verdict.FLOOR, concurrency=16, rps=4000.0, workers="-"),
        row(verdict.DIRECT, stream, workers="-", first_byte={"ttfb_p50_ms": 0.5}),
        row(verdict.QUICKSTART, p50_ms=0.70),
        row(verdict.QUICKSTART, concurrency=16, rps=1000.0),
        row(verdict.QUICKSTART, stream, first_byte={"ttfb_p50_ms": 2.0}),
        row(verdict.QUICKSTART_SHARED, p50_ms=1.2, non_2xx=5),  # INVALID: not measured
    ]
    gateways = [{"target": verdict.QUICKSTART, "memory": [{"peak_mb": 90.0}, {"peak_mb": 130.0}]}, {"target": verdict.LITELLM, "memory": [{"peak_mb": 400.0}]}]
    found = {goal.name: goal for goal in verdict.goals(rows, gateways)}
    embedded = found["added p50 at c=1, quickstart pipeline, embedded, workers 1"]
    assert round(embedded.value, 6) == 0.6 and embedded.passed is True
    ratio = found["c=16 req/s ÷ floor, quickstart pipeline, embedded, workers 1"]
    assert ratio.value == 0.25 and ratio.passed is False
    assert found["stream time to first content byte added at c=1, quickstart, embedded, workers 1"].value == 1.5
    shared = found["added p50 at c=1, quickstart pipeline, shared store, workers 1"]
    assert shared.value is None and shared.passed is None and "NOT MEASURED" in shared.line()
    memory = found["peak RSS of any gateway process"]
    assert memory.value == 130.0 and memory.passed is False


def test_first_byte_helpers() -> None:
    assert CONTENT.search(b'data: {"choices": [{"delta": {"content": "Hello"}}]}')
    assert not CONTENT.search(b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}')
    assert CONTENT.search(b'event: content_block_delta\ndata: {"delta": {"type": "text_delta", "text": "Hi"}}')
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.99) == 5.0 and percentile([], 0.5) == 0.0
    assert client_bound(700, 1000) and not client_bound(900, 1000)
