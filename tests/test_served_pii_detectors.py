"""The PII guard's detector layers end to end: NER, the classifier as a billed sub-call
on an internal target, and what happens when a layer fails or is missing."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest

from tests.bundles import deep_copy
from tests.conftest import Fakes
from tests.fakes import Reply
from tests.pii_helpers import EMAIL, SECRET, SONNET_UPSTREAM, classifier_bundle, claude, pii_bundle, received

pytestmark = pytest.mark.served


# --- detector layers: NER and the classifier ---------------------------------------------------


def test_a_policy_needing_a_detector_this_gateway_lacks_is_refused(tmp_path: Path, fresh_gateway) -> None:
    needs_ner = {"names": {"teams": ["eng"], "actions": {"PERSON": "pseudonymize"}, "detectors": ["ner"]}}
    with pytest.raises(RuntimeError, match="pii policy 'names' asks for the ner detector, which this gateway has not enabled"):
        fresh_gateway(bundle=pii_bundle(tmp_path / "b", needs_ner))


def test_names_are_found_by_the_ner_layer(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    names = {"names": {"teams": ["eng"], "actions": {"PERSON": "pseudonymize", "LOCATION": "redact", "EMAIL": "pseudonymize"}, "detectors": ["ner"]}}
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b", names), pii={"ner": {"enabled": True}})
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True))
    answer = claude(gateway, gateway.key("eng")).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"Sarah Connor moved to Los Angeles; write to {EMAIL}."}]
    )
    assert fakes.anthropic_us.received[0].json["messages"][0]["content"] == "<PERSON_1> moved to [REDACTED]; write to <EMAIL_1>."
    assert answer.content[0].text == f"Sarah Connor moved to [REDACTED]; write to {EMAIL}."


def test_the_classifier_is_a_billed_sub_call_on_an_internal_target(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    rules = {"eng-day": {"subject": {"team": "eng"}, "budget": {"limit_usd": "5", "period": "CalendarDay"}}}
    gateway = fresh_gateway(bundle=classifier_bundle(tmp_path / "b", rules))
    answer = json.dumps({"findings": [{"text": 0, "type": "PERSON", "value": "김민수"}, {"text": 0, "type": "PERSON", "value": "nobody here"}]})
    fakes.openai_main.script("pii-classifier-8b", Reply(text=answer, input_tokens=300, output_tokens=40))
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True))
    reply = claude(gateway, gateway.key("eng")).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"김민수 씨에게 {EMAIL}로 연락해 주세요"}]
    )
    [asked] = [r.json for r in fakes.openai_main.received]
    assert asked["model"] == "pii-classifier-8b" and json.loads(asked["messages"][1]["content"]) == [f"김민수 씨에게 {EMAIL}로 연락해 주세요"]
    assert fakes.anthropic_us.received[0].json["messages"][0]["content"] == "<PERSON_1> 씨에게 <EMAIL_1>로 연락해 주세요"
    assert reply.content[0].text == f"김민수 씨에게 {EMAIL}로 연락해 주세요"
    import sqlite3

    with sqlite3.connect(gateway.directory / "state.db") as db:
        rows = db.execute("SELECT subcall, state, cost_micro_usd FROM reservations ORDER BY created_at").fetchall()
    assert rows == [("pii_classifier", "settled", 380), ("main", "settled", rows[1][2])]  # 300 × $1 + 40 × $2 per million tokens


def test_a_classifier_refused_by_the_budget_refuses_the_request(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    rules = {"eng-day": {"subject": {"team": "eng"}, "budget": {"limit_usd": "0.0001", "period": "CalendarDay"}}}
    gateway = fresh_gateway(bundle=classifier_bundle(tmp_path / "b", rules))
    with pytest.raises(anthropic.APIStatusError) as refused:
        claude(gateway, gateway.key("eng")).messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "Ann Lee"}])
    assert refused.value.status_code == 402 and received(fakes) == []  # the classifier's own bound does not fit


def test_when_a_layer_fails_the_policy_decides_and_patterns_still_apply(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """The classifier answers garbage: fail_closed refuses; fail_open serves with the
    pattern layer's findings, blocks included, and records what was missing."""
    bundle = classifier_bundle(tmp_path / "b")
    data = bundle / "portcullis" / "pii" / "data.yaml"
    import yaml

    document = yaml.safe_load(data.read_text())
    document["policies"]["contextual"]["actions"]["SECRET"] = "block"
    document["policies"]["lenient"] = {**deep_copy(document["policies"]["contextual"]), "teams": ["eu-team"], "on_error": "fail_open"}
    data.write_text(yaml.safe_dump(document))
    gateway = fresh_gateway(bundle=bundle)
    fakes.openai_main.script("pii-classifier-8b", *[Reply(text="I cannot help with that.")] * 4)
    with pytest.raises(anthropic.APIStatusError) as refused:
        claude(gateway, gateway.key("eng")).messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"mail {EMAIL}"}])
    assert refused.value.status_code == 503
    lenient = claude(gateway, gateway.key("eu-team"))
    with pytest.raises(anthropic.BadRequestError):  # the pattern layer's block still holds
        lenient.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"key {SECRET}"}])
    lenient.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"mail {EMAIL}"}])
    assert fakes.anthropic_eu.received[0].json["messages"][0]["content"] == "mail <EMAIL_1>"
    started = [r for r in gateway.audit_records() if r["event"] == "request_started"][-1]
    assert started["pii"]["degraded"] == ["classifier"]
