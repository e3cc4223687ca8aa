"""`portcullis policy eval`: a request's decision as the gateway makes it, with which
rule decided, every candidate target and why it was kept or rejected, the routing
layer that substituted a model, the governance rule that governs a merged limit and
the PII policies behind each merged action; as text or one JSON document; and a
request the gateway would refuse to parse is a clear error, never a traceback."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.budget_tier_helpers import CHEAP, CHEAP_UPSTREAM, TIERED, TIERED_UPSTREAM, tiered_bundle, yellow_then_red
from tests.bundles import CATALOG, target, write_bundle
from tests.governance_helpers import metered_bundle
from tests.intent_helpers import write_intent_bundle
from tests.pii_helpers import pii_bundle

ROOT = Path(__file__).resolve().parent.parent
SONNET_US = "anthropic-us/claude-sonnet-4-5-20250929@us-east-1"
SONNET_EU = "anthropic-eu/claude-sonnet-4-5-20250929@eu-west-1"
HAIKU_EU = "anthropic-eu/claude-haiku-4-5-20251001@eu-west-1"


def policy_eval(tmp_path: Path, body: Any, *args: str, facts: Any = None) -> subprocess.CompletedProcess:
    request = tmp_path / "body.json"
    request.write_text(body if isinstance(body, str) else json.dumps(body))
    extra = list(args)
    if facts is not None:
        (tmp_path / "facts.json").write_text(json.dumps(facts))
        extra += ["--facts", str(tmp_path / "facts.json")]
    command = [sys.executable, "-m", "portcullis.adapters.cli", "policy", "eval", "--request", str(request), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)


def as_json(result: subprocess.CompletedProcess) -> dict[str, Any]:
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def messages(model: str = "sonnet", max_tokens: int = 100, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hello"}], **extra}


def test_a_model_the_user_is_not_granted_names_the_rule_and_the_narrowing(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    result = policy_eval(tmp_path, messages(), "--principal", "eng/carol", "--bundle", str(bundle))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "DENY  model_not_allowed: the requested model is not allowed for this key" in text
    assert "decided by   data.portcullis._authorisation: the model is not in data.portcullis.access.entitlements" in text
    assert "NO  grant      team eng grants claude-sonnet-4-5 (['claude-*', 'gpt-*', 'local-*']), but user carol's ['claude-haiku-*'] narrows it out" in text
    assert "client sees  403 model_not_allowed" in text
    report = as_json(policy_eval(tmp_path, messages(), "--principal", "eng/carol", "--bundle", str(bundle), "--format", "json"))
    explanation = report["explanation"]
    assert explanation["decided_by"]["check"] == "grant"
    assert [check["passed"] for check in explanation["checks"][:3]] == [True, True, False]
    rows = {row["target"]: row for row in explanation["targets"]}
    assert rows[SONNET_US]["reasons"] == ["model_not_allowed"] and not rows[SONNET_US]["checks"]["grant"]["passed"]
    assert rows[HAIKU_EU]["status"] == "passed, but the request is refused"  # carol may use the fallback, not the model she asked for


def test_every_candidate_says_why_it_was_kept_or_rejected(tmp_path: Path) -> None:
    """dave is locked to eu-west-1; a request with thinking needs a capability only one
    target (a small-window one) has, which then does not hold the request (L5)."""
    catalog = copy.deepcopy(CATALOG)
    catalog["models"]["claude-sonnet-4-5"]["targets"][1] = target(
        "anthropic-eu", "claude-sonnet-4-5-20250929", "eu-west-1", 2, capabilities=["streaming", "thinking"], context_window=300, max_output_tokens=8192
    )
    bundle = write_bundle(tmp_path / "b", catalog=catalog)
    body = messages(max_tokens=1000, thinking={"type": "enabled", "budget_tokens": 100})
    report = as_json(policy_eval(tmp_path, body, "--principal", "eng/dave", "--bundle", str(bundle), "--format", "json"))
    rows = {row["target"]: row for row in report["explanation"]["targets"]}
    assert rows[SONNET_US]["reasons"] == ["region_not_allowed", "capability_unsupported"]
    assert "not all within the lock ['eu-west-1']" in rows[SONNET_US]["checks"]["region"]["detail"]
    assert rows[SONNET_US]["checks"]["capability"]["missing"] == ["thinking"]
    assert rows[SONNET_EU]["status"] == "rejected" and rows[SONNET_EU]["reasons"] == ["context_exceeded"]
    assert rows[SONNET_EU]["checks"]["region"]["passed"] and not rows[SONNET_EU]["checks"]["context_fit"]["passed"]
    assert "> context window 300" in rows[SONNET_EU]["checks"]["context_fit"]["detail"]
    assert rows[HAIKU_EU]["reasons"] == ["capability_unsupported"] and rows[HAIKU_EU]["via"] == "fallback"


def test_a_fallback_that_serves_because_breakers_are_open_is_failover(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    facts = {"breakers": {SONNET_US: {"state": "open", "until": 1900000000}, SONNET_EU: {"state": "open", "until": 1900000100}}}
    result = policy_eval(tmp_path, messages(), "--principal", "eng", "--bundle", str(bundle), facts=facts)
    assert result.returncode == 0, result.stderr
    assert "failover: a fallback of claude-sonnet-4-5 serves (claude-haiku-4-5): its own targets were all rejected" in result.stdout
    assert "NO breaker: open until 1900000000" in result.stdout
    report = as_json(policy_eval(tmp_path, messages(), "--principal", "eng", "--bundle", str(bundle), "--format", "json", facts=facts))
    routing = report["explanation"]["routing"]
    assert routing["substitution"] == {"from": "claude-sonnet-4-5", "to": "claude-haiku-4-5", "layer": "failover"}
    assert [row["status"] for row in report["explanation"]["targets"]] == ["rejected", "rejected", "kept"]


def test_a_budget_tier_substitution_names_its_layer_tier_and_budget(tmp_path: Path) -> None:
    bundle = tiered_bundle(tmp_path / "b", {"pay": yellow_then_red()})
    args = ("--principal", "pay/alice", "--bundle", str(bundle), "--format", "json")
    report = as_json(policy_eval(tmp_path, messages(TIERED), *args, facts={"budgets": {"pay-cap": {"percent": 85}}}))
    routing = report["explanation"]["routing"]
    assert report["decision"]["model"] == CHEAP
    assert routing["substitution"] == {"from": TIERED, "to": CHEAP, "layer": "budget_tier"}
    [layer] = routing["layers"]
    assert layer["tier"] == "yellow" and layer["applied"] is True
    assert layer["why"] == f"budget pay-cap at 85% (facts.budgets) reached tier yellow (from 80%); {CHEAP} replaced {TIERED}"
    assert [row["target"] for row in routing["replaced_targets"]] == [f"anthropic-us/{TIERED_UPSTREAM}@us-east-1"]
    assert [row["target"] for row in report["explanation"]["targets"]] == [f"anthropic-us/{CHEAP_UPSTREAM}@us-east-1"]
    below = as_json(policy_eval(tmp_path, messages(TIERED), *args, facts={"budgets": {"pay-cap": {"percent": 50}}}))
    assert below["explanation"]["routing"]["substitution"] is None and below["decision"]["model"] == TIERED
    assert any(note.startswith("budget_tier: no tier reached") for note in below["explanation"]["routing"]["not_proposing"])


def test_an_intent_tier_names_its_router_and_rule(tmp_path: Path) -> None:
    """A short, code-free first turn: the reference router's rule for small requests picks
    the light tier; only the targets the substitute's chain does not share are set aside."""
    bundle = write_intent_bundle(tmp_path / "b")
    features = {"input_tokens": 50, "tools": 0, "turns": 1, "first_turn": True, "reasoning": False, "client": "other", "text_chars": 5, "code": False}
    args = ("--principal", "eng", "--bundle", str(bundle), "--format", "json")
    report = as_json(policy_eval(tmp_path, messages(), *args, facts={"features": {**features, "keywords": []}}))
    routing = report["explanation"]["routing"]
    assert routing["substitution"] == {"from": "claude-sonnet-4-5", "to": "claude-haiku-4-5", "layer": "intent"}
    [layer] = routing["layers"]
    assert layer["by"] == "rule" and layer["router"] == "reference"
    assert layer["why"].startswith(f"router reference: rule {layer['rule']} (when {{") and "chose tier light from facts.features" in layer["why"]
    assert [row["target"] for row in routing["replaced_targets"]] == [SONNET_US, SONNET_EU]
    pinned = as_json(policy_eval(tmp_path, messages(), *args, facts={"features": {**features, "keywords": []}, "session": {"tier": "standard"}}))
    [layer] = pinned["explanation"]["routing"]["layers"]
    assert layer["why"] == "router reference: the session's pinned tier standard (facts.session); it names the model the request already had"


def test_two_rules_on_one_counter_say_which_governs(tmp_path: Path) -> None:
    rules = {
        "acme-rate": {"subject": {"team": "acme"}, "rate": {"rpm": 100}},
        "acme-rate-strict": {"subject": {"team": "acme"}, "rate": {"rpm": 40}},
        "acme-warn": {"subject": {"team": "acme"}, "rate": {"rpm": 20}, "failure_policy": "Warn"},
        "acme-late-warn": {"subject": {"team": "acme"}, "rate": {"rpm": 60}, "failure_policy": "Warn"},
    }
    bundle = metered_bundle(tmp_path / "b", "acme", rules)
    result = policy_eval(tmp_path, messages(), "--principal", "acme", "--bundle", str(bundle))
    assert result.returncode == 0, result.stderr
    assert "team:acme requests/minute: block 40 warn 20 (hard)" in result.stdout
    assert "governs  acme-rate-strict: 40 (Block)" in result.stdout
    report = as_json(policy_eval(tmp_path, messages(), "--principal", "acme", "--bundle", str(bundle), "--format", "json"))
    [counter] = [c for c in report["explanation"]["limits"]["counters"] if c["metric"] == "requests"]
    assert counter["governed_by"] == ["acme-rate-strict"] and counter["warned_by"] == ["acme-warn"]
    parts = {entry["rule"]: entry["part"] for entry in counter["rules"]}
    assert parts == {
        "acme-rate": "looser",
        "acme-rate-strict": "governs",
        "acme-warn": "warns",
        "acme-late-warn": "warns no sooner than the block limit: ignored",
    }
    assert report["explanation"]["limits"]["effective"]["requests_per_minute"] == {"limit": 40, "counters": ["team:acme"], "rules": ["acme-rate-strict"]}


def test_two_pii_policies_merge_with_their_sources(tmp_path: Path) -> None:
    policies = {
        "one": {"teams": ["eng"], "actions": {"EMAIL": "mask", "PHONE": "redact"}},
        "two": {"teams": ["*"], "actions": {"EMAIL": "redact", "US_SSN": "block"}, "min_score": 0.4},
        "other": {"teams": ["eu-team"], "actions": {"EMAIL": "block"}},
    }
    bundle = pii_bundle(tmp_path / "b", policies)
    result = policy_eval(tmp_path, messages(), "--principal", "eng", "--bundle", str(bundle))
    assert result.returncode == 0, result.stderr
    assert "PII policies one, two (not applying: other)" in result.stdout
    assert "EMAIL            redact        from two  (one: mask, two: redact)" in result.stdout
    pii = as_json(policy_eval(tmp_path, messages(), "--principal", "eng", "--bundle", str(bundle), "--format", "json"))["explanation"]["pii"]
    assert pii["actions"]["EMAIL"] == {"action": "redact", "from": ["two"], "proposed": {"one": "mask", "two": "redact"}}
    assert pii["actions"]["PHONE"]["from"] == ["one"] and pii["actions"]["US_SSN"]["from"] == ["two"]
    assert pii["min_score"] == {"value": 0.4, "from": ["two"]}
    assert pii["on_error"] == {"value": "fail_closed", "from": ["one", "two"]}


def test_json_is_one_document_with_the_plan_as_audited(tmp_path: Path) -> None:
    config = ROOT / "examples" / "quickstart" / "config.yaml"
    report = as_json(policy_eval(tmp_path, messages(), "--principal", "demo/alice", "--config", str(config), "--format", "json"))
    assert set(report) == {"bundle", "input", "decision", "explanation"}
    assert report["input"]["principal"] == {"key_id": "policy-eval", "team": "demo", "user": "alice"}
    assert report["input"]["request"]["protocol"] == "anthropic_messages" and report["input"]["request"]["model"] == "sonnet"
    decision = report["decision"]
    assert decision["allow"] is True and decision["plan"]["reasons"] == ["allowed"] and decision["refusal"] is None
    assert decision["plan"]["targets"] == [row["target"] for row in report["explanation"]["targets"] if row["status"] == "kept"]
    assert report["explanation"]["targets"][0]["checks"]["context_fit"]["passed"] is True
    assert report["explanation"]["decided_by"]["rule"] == "data.portcullis._authorisation: every check passed"


def test_a_raw_input_document_is_decided_as_it_is(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    document = {"principal": {"team": "nobody", "user": None, "key_id": "k"}, "request": {"protocol": "openai_chat", "model": "mini", "stream": False}}
    (tmp_path / "input.json").write_text(json.dumps(document))
    command = [sys.executable, "-m", "portcullis.adapters.cli", "policy", "eval", "--input", str(tmp_path / "input.json"), "--bundle", str(bundle)]
    report = as_json(subprocess.run([*command, "--format", "json"], capture_output=True, text=True, timeout=120))
    assert report["input"] == document
    assert report["decision"]["code"] == "unknown_team" and report["explanation"]["decided_by"]["check"] == "team"
    assert report["explanation"]["checks"][0]["detail"] == "team 'nobody' is not defined; the bundle's teams: eng, eu-team, sonnet-only"
    known = {**document, "principal": {"team": "eng", "user": None, "key_id": "k"}}
    (tmp_path / "input.json").write_text(json.dumps(known))
    allowed = as_json(subprocess.run([*command, "--format", "json"], capture_output=True, text=True, timeout=120))
    assert allowed["decision"]["model"] == "gpt-4o-mini" and allowed["decision"]["allow"] is True
    assert "context_fit" not in allowed["explanation"]["targets"][0]["checks"]  # no body to size


def test_a_bad_request_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    broken = policy_eval(tmp_path, '{"model": "sonnet", "messages": ', "--principal", "eng", "--bundle", str(bundle))
    assert broken.returncode == 1 and broken.stdout == ""
    assert broken.stderr.startswith("portcullis: the request is refused (invalid_request): request body is not valid JSON")
    wrong = policy_eval(tmp_path, {"model": "sonnet", "max_tokens": 10, "messages": "hi"}, "--principal", "eng", "--bundle", str(bundle))
    assert wrong.returncode == 1 and "messages: expected an array" in wrong.stderr
    no_model = policy_eval(tmp_path, {"messages": []}, "--protocol", "converse", "--principal", "eng", "--bundle", str(bundle))
    assert no_model.returncode == 1 and "give --model" in no_model.stderr
    for result in (broken, wrong, no_model):
        assert "Traceback" not in result.stderr


def test_a_converse_request_reads_its_model_from_the_path(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    body = {"messages": [{"role": "user", "content": [{"text": "hi"}]}], "inferenceConfig": {"maxTokens": 50}}
    args = ("--protocol", "converse", "--model", "haiku", "--stream", "--principal", "eu-team", "--bundle", str(bundle), "--format", "json")
    report = as_json(policy_eval(tmp_path, body, *args))
    assert report["input"]["request"] | {"tools": []} == {
        "protocol": "bedrock_converse",
        "model": "haiku",
        "stream": True,
        "max_tokens": 50,
        "requires": ["streaming"],
        "tools": [],
    }
    assert report["decision"]["model"] == "claude-haiku-4-5" and report["decision"]["allow"] is True


def test_the_gateway_never_loads_the_explanation() -> None:
    """The explanation costs the request path nothing: serving imports none of it."""
    probe = "import sys, portcullis.adapters.app, portcullis.adapters.runtime; print(sorted(m for m in sys.modules if 'explain' in m or 'policy_eval' in m))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
