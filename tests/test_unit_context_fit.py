"""Routing layer L5, context fit, in parts: the bundle's verdicts on real counts, the
second count only for a byte bound that refused, the refusal's wording, the bundle's
data checked by its schema, and each protocol's parser naming the reasoning it asks for."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import pytest

from portcullis.adapters.context_fit import judge
from portcullis.adapters.protocols.anthropic_messages import wire as messages
from portcullis.adapters.protocols.bedrock_converse import wire as converse
from portcullis.adapters.protocols.openai_chat import wire as chat
from portcullis.adapters.protocols.openai_responses import wire as responses
from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import BundleError, parse_bundle, read_bundle_files
from portcullis.engine.context_fit import CODE, ESTIMATE, EXACT, UPPER_BOUND, Generation, Sized, Verdict, fit_input, read_verdicts, refusal
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.target import Target
from tests.bundles import write_bundle

ROOT = Path(__file__).resolve().parent.parent
TODAY = dt.date(2026, 11, 30)
PROVIDERS = {"anthropic-us", "anthropic-eu", "openai-main"}


@pytest.fixture(scope="module")
def bundle() -> ActiveBundle:
    return activate(parse_bundle(read_bundle_files(ROOT / "policies"), []), {"mock"}, TODAY)


def window(size: int, max_output: int = 4096) -> Target:
    return Target("m", "p", f"model-{size}", "r", 1, size, max_output, ())


def request(body: dict, protocol=messages, **path: str):
    return protocol.parse(json.dumps(body).encode(), {}, path=path) if path else protocol.parse(json.dumps(body).encode(), {})


def run_judge(bundle: ActiveBundle, sized: list[Sized], body: dict, estimate_tokens: int) -> tuple[list[Verdict], int]:
    calls = []

    async def estimate() -> int:
        calls.append(1)
        return estimate_tokens

    verdicts = asyncio.run(judge(bundle, request(body), sized, estimate))
    return verdicts, len(calls)


CONVERSE_HI = [{"role": "user", "content": [{"text": "hi"}]}]
BODY = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


def test_targets_that_fit_cost_no_second_count(bundle: ActiveBundle) -> None:
    verdicts, counted = run_judge(bundle, [Sized(window(1000), 800, UPPER_BOUND), Sized(window(1000), 900, EXACT)], BODY, 1)
    assert [v.fits for v in verdicts] == [True, True] and counted == 0


def test_a_byte_bound_that_refuses_is_counted_again_as_an_estimate_with_its_margin(bundle: ActiveBundle) -> None:
    verdicts, counted = run_judge(bundle, [Sized(window(1000), 5000, UPPER_BOUND), Sized(window(200000), 5000, UPPER_BOUND)], BODY, 800)
    assert counted == 1  # once, however many targets need it
    first, second = verdicts
    assert first.method == ESTIMATE and first.input_tokens == 800 and first.margin_tokens == 80 and first.fits  # 800 + 80 + 100 <= 1000
    assert second.method == UPPER_BOUND and second.fits  # its bound fitted: never recounted


def test_an_estimate_that_still_does_not_fit_is_refused_with_its_numbers(bundle: ActiveBundle) -> None:
    [verdict], counted = run_judge(bundle, [Sized(window(1000), 5000, UPPER_BOUND)], BODY, 950)
    assert counted == 1 and not verdict.fits and verdict.reasons == ("context_exceeded",)
    assert verdict.rejected() == {
        "provider": "p",
        "model": "model-1000",
        "region": "r",
        "reasons": ["context_exceeded"],
        "input_tokens": 950,
        "margin_tokens": 95,
        "output_tokens": 100,
        "reasoning_tokens": 0,
        "context_window": 1000,
        "max_output_tokens": 4096,
        "method": ESTIMATE,
    }


def test_an_exact_count_is_never_counted_again(bundle: ActiveBundle) -> None:
    [verdict], counted = run_judge(bundle, [Sized(window(1000), 5000, EXACT)], BODY, 1)
    assert counted == 0 and not verdict.fits and verdict.method == EXACT


def test_a_verdict_list_of_the_wrong_length_fails_closed() -> None:
    with pytest.raises(ValueError):
        read_verdicts([Sized(window(10), 1, EXACT)], [])
    with pytest.raises(ValueError):
        read_verdicts([Sized(window(10), 1, EXACT)], [{"fits": "yes"}])


def test_the_refusal_names_the_largest_window_and_what_the_request_needs() -> None:
    small = Verdict(window(1000), False, ("context_exceeded",), 3000, 300, 100, 0, ESTIMATE)
    large = Verdict(window(2000), False, ("context_exceeded",), 3000, 0, 100, 0, EXACT)
    error = refusal([small, large])
    assert isinstance(error, GatewayError) and error.kind is ErrorKind.INVALID_REQUEST and error.code == CODE
    assert "maximum context length is 2000 tokens" in error.message and "needs 3100" in error.message
    budget = refusal([Verdict(window(1000, 512), False, ("output_exceeded",), 10, 0, 512, 600, EXACT)])
    assert "reasoning budget of 600 tokens" in budget.message and "512" in budget.message


def fit_bundle(directory: Path, context_fit: dict[str, object]) -> ActiveBundle:
    return activate(parse_bundle(read_bundle_files(write_bundle(directory, sections={"context_fit": context_fit})), []), PROVIDERS, TODAY)


def test_the_margins_are_schema_checked_bundle_data(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"context_fit\.estimate_margin_percent"):
        fit_bundle(tmp_path / "b", {"estimate_margin_percent": -1})
    with pytest.raises(BundleError, match="Additional properties"):
        fit_bundle(tmp_path / "c", {"margin": 5})


def test_the_margin_a_bundle_declares_is_the_one_applied(tmp_path: Path) -> None:
    declared = fit_bundle(tmp_path / "b", {"estimate_margin_percent": 25})
    [verdict], _ = run_judge(declared, [Sized(window(1300), 1000, ESTIMATE)], BODY, 1)
    assert verdict.margin_tokens == 250 and not verdict.fits  # 1000 + 250 + 100 > 1300; 10% would have fitted


def test_a_bundle_without_the_entry_point_is_refused(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b")
    decision = directory / "portcullis" / "decision.rego"
    source = decision.read_text()
    decision.write_text(source.replace("context_fit_verdicts := data.portcullis.context_fit.verdicts(input)", ""))
    with pytest.raises(BundleError, match="context_fit_verdicts"):
        activate(parse_bundle(read_bundle_files(directory), []), PROVIDERS, TODAY)


def test_each_protocol_names_the_reasoning_it_asks_for() -> None:
    thinking = request({**BODY, "thinking": {"type": "enabled", "budget_tokens": 2048}})
    assert (thinking.reasoning_tokens, thinking.reasoning_effort) == (2048, None)
    assert request({**BODY, "thinking": {"type": "adaptive"}}).reasoning_tokens is None
    assert request({"model": "m", "messages": BODY["messages"], "reasoning_effort": "high"}, chat).reasoning_effort == "high"
    assert request({"model": "m", "input": "hi", "reasoning": {"effort": "low"}}, responses).reasoning_effort == "low"
    claude_on_bedrock = {"messages": CONVERSE_HI, "additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 1024}}}
    assert request(claude_on_bedrock, converse, model="x").reasoning_tokens == 1024
    nova = {"messages": CONVERSE_HI, "additionalModelRequestFields": {"reasoningConfig": {"type": "enabled", "maxReasoningEffort": "medium"}}}
    assert request(nova, converse, model="x").reasoning_effort == "medium"
    assert request({"model": "m", "messages": BODY["messages"]}, chat).reasoning_effort is None


def test_a_reasoning_budget_that_is_not_a_number_is_refused_by_name() -> None:
    with pytest.raises(GatewayError, match=r"thinking\.budget_tokens: expected a positive integer"):
        request({**BODY, "thinking": {"type": "enabled", "budget_tokens": "lots"}})
    bad = {"messages": CONVERSE_HI, "additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 0}}}
    with pytest.raises(GatewayError, match=r"additionalModelRequestFields\.thinking\.budget_tokens"):
        request(bad, converse, model="x")


def test_the_screen_admits_only_what_the_rule_admits(bundle: ActiveBundle) -> None:
    """Over a grid of windows, counts and requests: whenever the bundle's screen skips
    the rule, the rule (evaluated anyway here) fits every target too."""
    screen = bundle.fit_screen
    assert screen is not None and screen.margin_percent == 10
    admitted = 0
    for window_size in (3000, 5000, 9000, 70000):
        for tokens in (100, 2000, 2700, 4000):
            for method in (EXACT, UPPER_BOUND, ESTIMATE):
                for cap in (None, 100, 1024, 5000):
                    for effort in (None, "low", "high"):
                        sized = [Sized(window(window_size, 2048), tokens, method)]
                        generation = Generation(cap, None, effort)
                        if screen.admits(sized, generation):
                            admitted += 1
                            [verdict] = read_verdicts(sized, bundle.context_fit(fit_input(sized, generation)))
                            assert verdict.fits, (window_size, tokens, method, cap, effort)
    assert admitted > 50  # the screen does skip the rule for most requests with room


def test_the_screen_leaves_a_declared_budget_and_a_near_window_to_the_rule(bundle: ActiveBundle) -> None:
    screen = bundle.fit_screen
    assert screen is not None
    roomy = [Sized(window(200000), 1000, EXACT)]
    assert screen.admits(roomy, Generation(100))
    assert not screen.admits(roomy, Generation(100, reasoning_tokens=50))  # a budget may not fit the output ceiling
    assert not screen.admits([Sized(window(1150), 1000, EXACT)], Generation(100))  # 1000 + 100 margin + 100 > 1150: the rule decides
    verdicts, counted = run_judge(bundle, roomy, BODY, 1)
    assert verdicts[0].screened and verdicts[0].fits and counted == 0


def test_a_bundle_without_a_screen_has_every_request_judged(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b")
    module = directory / "portcullis" / "context_fit.rego"
    module.write_text(module.read_text().replace('"screen": {', '"no_screen": {'))
    unscreened = activate(parse_bundle(read_bundle_files(directory), []), PROVIDERS, TODAY)
    assert unscreened.fit_screen is None
    [verdict], _ = run_judge(unscreened, [Sized(window(200000), 1000, EXACT)], BODY, 1)
    assert verdict.fits and not verdict.screened
