"""Bedrock guardrails the policy requires: set on the call whatever the client sent,
and their interventions noticed in answers and streams (that they happened, no content)."""

from __future__ import annotations

import base64
import json

import pytest

from portcullis.adapters.protocols.bedrock_converse import wire as converse
from portcullis.adapters.protocols.bedrock_invoke import wire as invoke
from portcullis.adapters.protocols.eventstream import CONVERSE_FRAMING, INVOKE_FRAMING, event_frame
from portcullis.adapters.protocols.request import DEFAULT_LIMITS
from portcullis.engine.errors import ErrorKind, GatewayError

POLICY = {"identifier": "gr-policy", "version": "3"}


def test_converse_gets_the_policys_guardrail_in_place_of_the_clients() -> None:
    body = json.dumps({"messages": [], "guardrailConfig": {"guardrailIdentifier": "mine", "guardrailVersion": "1", "streamProcessingMode": "async"}}).encode()
    sent = json.loads(converse.require_guardrail(body, {}, POLICY))
    assert sent["guardrailConfig"] == {"guardrailIdentifier": "gr-policy", "guardrailVersion": "3"}


def test_with_the_policys_guardrail_guard_content_blocks_are_plain_content() -> None:
    """Bedrock judges only guardContent blocks when a request has any: a decoy in one
    would leave the real prompt unjudged."""
    decoy = {"guardContent": {"text": {"text": "a harmless decoy"}}}
    body = {"system": [decoy, {"text": "sys"}], "messages": [{"role": "user", "content": [decoy, {"text": "the real prompt"}]}]}
    sent = json.loads(converse.require_guardrail(json.dumps(body).encode(), {}, POLICY))
    assert sent["system"] == [{"text": "a harmless decoy"}, {"text": "sys"}]
    assert sent["messages"][0]["content"] == [{"text": "a harmless decoy"}, {"text": "the real prompt"}]
    assert "guardContent" not in json.dumps(sent)


def test_a_clients_guardrail_trace_is_refused_naming_the_field() -> None:
    guardrail = {"guardrailIdentifier": "g", "guardrailVersion": "1", "trace": "enabled"}
    raw = json.dumps({"messages": [{"role": "user", "content": [{"text": "hi"}]}], "guardrailConfig": guardrail})
    with pytest.raises(GatewayError) as refused:
        converse.parse(raw.encode(), {}, "", DEFAULT_LIMITS, {"model": "m", "action": "converse"})
    assert refused.value.kind == ErrorKind.INVALID_REQUEST and "guardrailConfig.trace" in refused.value.message


def test_interventions_are_noticed_in_converse_answers_and_streams() -> None:
    assert converse.intervened({"stopReason": "guardrail_intervened", "output": {}})
    assert not converse.intervened({"stopReason": "end_turn"})
    for reason, expected in (("guardrail_intervened", True), ("end_turn", False)):
        meter = converse.StreamUsage()
        for event in CONVERSE_FRAMING.Parser().feed(event_frame("messageStop", {"stopReason": reason})):
            meter.feed(event)
        assert meter.intervened is expected


def test_interventions_are_noticed_in_invoke_answers_and_streams() -> None:
    assert invoke.intervened({"type": "message", "amazon-bedrock-guardrailAction": "INTERVENED"})
    assert not invoke.intervened({"type": "message", "amazon-bedrock-guardrailAction": "NONE"})
    for action, expected in (("INTERVENED", True), ("NONE", False)):
        stop = {"type": "message_stop", "amazon-bedrock-guardrailAction": action}
        frame = event_frame("chunk", {"bytes": base64.b64encode(json.dumps(stop).encode()).decode()})
        meter = invoke.StreamUsage()
        for event in INVOKE_FRAMING.Parser().feed(frame):
            meter.feed(event)
        assert meter.intervened is expected
