"""Bedrock guardrails the policy requires: set on the call whatever the client sent,
and their interventions noticed in answers and streams (that they happened, no content)."""

from __future__ import annotations

import base64
import json

from portcullis.adapters.protocols.bedrock_converse import wire as converse
from portcullis.adapters.protocols.bedrock_invoke import wire as invoke
from portcullis.adapters.protocols.eventstream import CONVERSE_FRAMING, INVOKE_FRAMING, event_frame

POLICY = {"identifier": "gr-policy", "version": "3", "trace": "enabled"}


def test_converse_gets_the_policys_guardrail_in_place_of_the_clients() -> None:
    body = json.dumps({"messages": [], "guardrailConfig": {"guardrailIdentifier": "mine", "guardrailVersion": "1", "streamProcessingMode": "async"}}).encode()
    sent = json.loads(converse.require_guardrail(body, {}, POLICY))
    assert sent["guardrailConfig"] == {"guardrailIdentifier": "gr-policy", "guardrailVersion": "3", "trace": "enabled"}


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
