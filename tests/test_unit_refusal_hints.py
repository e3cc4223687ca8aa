"""What a refusal tells the user: the closest names a key may use, and client-chosen
names echoed only when they cannot carry personal data."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from portcullis.engine.activation import activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files
from portcullis.engine.errors import printable
from portcullis.engine.policy_tests import run_policy_tests
from portcullis.engine.suggestions import closest_names

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bundle():
    return activate(parse_bundle(read_bundle_files(ROOT / "policies"), []), {"mock"}, dt.date(2026, 11, 30))


def request(user: str | None, model: object) -> dict:
    return {"principal": {"team": "demo", "user": user, "key_id": "k"}, "request": {"model": model, "requires": [], "protocol": "openai_chat", "stream": False}}


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        ("claude-opus-4-9", ["claude-opus-4-8", "claude-opus-5-5"]),
        ("CLAUDE-SONNET-5", ["claude-sonnet-5"]),
        ("gpt-4o-mine", ["gpt-4o-mini"]),
        ("llama-3-70b", []),
        ("claude-opus-4-8" * 1000, []),  # a client can send any length: no quadratic comparison
        ("", []),
    ],
)
def test_closest_names(requested: str, expected: list[str]) -> None:
    served = ["claude-opus-4-8", "claude-opus-5-5", "claude-sonnet-5", "claude-sonnet-4-6", "gpt-4o-mini", "sonnet", "mini"]
    assert closest_names(requested, served)[: len(expected)] == expected
    assert len(closest_names(requested, served)) <= 3


def test_unknown_model_suggests_only_what_the_principal_may_use(bundle) -> None:
    alice = bundle.decide(request("alice", "claude-opus-4-9"))
    assert alice.reasons[0]["code"] == "unknown_model" and alice.suggestions[:2] == ("claude-opus-4-8", "claude-opus-5-5")
    message = alice.refusal().message
    assert message.startswith("the requested model is not served by this gateway: claude-opus-4-9; GET /v1/models")
    assert "(closest: claude-opus-4-8, claude-opus-5-5" in message
    bob = bundle.decide(request("bob", "claude-opus-4-9"))  # bob may use gpt-4o-mini only
    assert not any(name.startswith("claude") for name in bob.suggestions)
    variant = bundle.decide(request("alice", "claude-opus-4-8[2m]"))  # asked for a variant: variants may be suggested
    assert "claude-opus-4-8[1m]" in variant.suggestions
    assert bundle.decide(request("alice", 42)).suggestions == ()  # not a name at all: nothing to compare


def test_allowed_and_other_refusals_carry_no_suggestions(bundle) -> None:
    assert bundle.decide(request("alice", "sonnet")).suggestions == ()
    refused = bundle.decide(request("bob", "claude-opus-4-8"))
    assert refused.reasons[0]["code"] == "model_not_allowed" and refused.suggestions == ()
    assert "GET /v1/models" in refused.refusal().message


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("claude-opus-4-8[1m]", "claude-opus-4-8[1m]"),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5@20250929"),
        ("anthropic.claude-3-5-sonnet-20241022-v2:0", "anthropic.claude-3-5-sonnet-20241022-v2:0"),
        ("jane.doe@example.com", "<unprintable name>"),
        ("4111111111111111", "<unprintable name>"),
        ("+821012345678", "<unprintable name>"),
        ("two words", "<unprintable name>"),
        ("x" * 129, "<unprintable name>"),
    ],
)
def test_printable_names(name: str, shown: str) -> None:
    assert printable(name) == shown


def test_failure_explanation_follows_with_and_every_definition() -> None:
    source = 'package t\n\nlimit := 3\n\ntest_with if {\n\tx := input.n with input as {"n": 5}\n\tx < limit\n}\n\ntest_passes if limit == 3\n'
    results = {result.path: result for result in run_policy_tests({"t_test.rego": source}, {})}
    assert results["data.t.test_passes"].passed and results["data.t.test_passes"].output == []
    failing = results["data.t.test_with"]
    assert not failing.passed and failing.line == 5
    assert failing.output == ["t_test.rego:7: x < limit", "  x = 5", "  limit = 3"]


def test_a_failing_test_with_prints_is_explained_and_prints_once(capfd: pytest.CaptureFixture[str]) -> None:
    source = 'package p\n\ntest_printed if {\n\tprint("value was", 1)\n\t1 == 2\n}\n'
    [result] = run_policy_tests({"p_test.rego": source}, {})
    assert result.output == ["p_test.rego:4: value was 1", "p_test.rego:5: 1 == 2"]
    assert "value was" not in capfd.readouterr().out  # the explanation's own evaluations print nothing
