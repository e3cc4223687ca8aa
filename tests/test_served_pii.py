"""The PII guard end to end: the official SDKs through real gateway processes to the
fake provider, asserting on what the provider received (never an original value)
and on what the client got back (restored where the policy allows): every surface,
refusals, restored answers and what the gateway writes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.bundles import CATALOG, deep_copy, target
from tests.conftest import Fakes
from tests.fakes import Reply, ToolCall
from tests.pii_helpers import (
    CARD,
    EMAIL,
    IBAN,
    IP,
    MINI_UPSTREAM,
    OTHER_EMAIL,
    PHONE,
    REGULATED,
    RRN,
    SECRET,
    SONNET_UPSTREAM,
    assert_nothing_leaked,
    chat,
    claude,
    pii_bundle,
    received,
)

pytestmark = pytest.mark.served


# --- the request side: every surface, one representation ----------------------------------


def test_every_surface_is_transformed_before_it_leaves(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(text="Done."))
    client = claude(gateway, gateway.key("eng"))
    client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=100,
        system=[{"type": "text", "text": f"Escalations go to {OTHER_EMAIL}.", "cache_control": {"type": "ephemeral"}}],
        tools=[
            {
                "name": "send_email",
                "description": f"Sends mail from {OTHER_EMAIL}",
                "input_schema": {"type": "object", "properties": {"to": {"type": "string", "description": f"e.g. {EMAIL}"}}},
            }
        ],
        messages=[
            {"role": "user", "content": f"Mail {EMAIL} about card {CARD}; the login came from {IP}. Call me on {PHONE}."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "send_email", "input": {"to": EMAIL, "cc": [OTHER_EMAIL], "n": 3}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": f"queued for {EMAIL}"}]},
        ],
    )
    [sent] = [r.json for r in fakes.anthropic_us.received]
    assert_nothing_leaked(sent)
    assert sent["system"] == [{"type": "text", "text": "Escalations go to <EMAIL_1>.", "cache_control": {"type": "ephemeral"}}]
    assert sent["tools"][0]["description"] == "Sends mail from <EMAIL_1>"
    assert sent["tools"][0]["input_schema"]["properties"]["to"]["description"] == "e.g. <EMAIL_2>"
    assert sent["messages"][0]["content"] == "Mail <EMAIL_2> about card 4111 **** **** 1111; the login came from [REDACTED]. Call me on <PHONE_1>."
    assert sent["messages"][1]["content"][0]["input"] == {"to": "<EMAIL_2>", "cc": ["<EMAIL_1>"], "n": 3}  # JSON stays JSON
    assert sent["messages"][2]["content"][0]["content"] == "queued for <EMAIL_2>"
    started = next(r for r in gateway.audit_records() if r["event"] == "request_started")
    assert started["pii"]["found"] == {"EMAIL": 7, "CREDIT_CARD": 1, "IP_ADDRESS": 1, "PHONE": 1}
    assert started["pii"]["actions"] == {"pseudonymize": 8, "mask": 1, "redact": 1}


def test_openai_surfaces_and_tool_arguments_stay_valid_json(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = chat(gateway, gateway.key("eng"))
    client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[
            {"role": "developer", "content": f"Support inbox: {OTHER_EMAIL}"},
            {"role": "user", "content": [{"type": "text", "text": f"Refund card {CARD} for {EMAIL}"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "refund", "arguments": json.dumps({"email": EMAIL, "amount": 12.5})}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": f"refund queued, receipt sent to {EMAIL} from {IP}"},
        ],
        tools=[{"type": "function", "function": {"name": "refund", "description": f"Refunds; owner {OTHER_EMAIL}", "parameters": {"type": "object"}}}],
    )
    [sent] = [r.json for r in fakes.openai_main.received]
    assert_nothing_leaked(sent)
    assert sent["tools"][0]["function"]["description"] == "Refunds; owner <EMAIL_1>"
    assert sent["messages"][0]["content"] == "Support inbox: <EMAIL_1>"
    assert sent["messages"][1]["content"][0]["text"] == "Refund card 4111 **** **** 1111 for <EMAIL_2>"
    assert json.loads(sent["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {"email": "<EMAIL_2>", "amount": 12.5}
    assert sent["messages"][3]["content"] == "refund queued, receipt sent to <EMAIL_2> from [REDACTED]"


def test_a_request_without_personal_data_goes_upstream_byte_for_byte(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    raw = b'{"model": "claude-sonnet-4-5-exact",  "max_tokens": 50, "messages": [{"role": "user", "content": "nothing personal here"}]}'
    response = httpx.post(f"{gateway.url}/v1/messages", content=raw, headers={"x-api-key": gateway.key("eng"), "anthropic-version": "2023-06-01"})
    assert response.status_code == 200
    assert fakes.anthropic_us.received[0].body == raw


# --- refusals --------------------------------------------------------------------------------


def test_blocked_entities_refuse_the_request_naming_the_type_not_the_value(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(gateway, gateway.key("eng")).messages.create(
            model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"My RRN is {RRN} and my key {SECRET}"}]
        )
    message = refused.value.body["error"]["message"]
    assert "KR_RRN (1)" in message and "SECRET (1)" in message and RRN not in message and SECRET not in message
    with pytest.raises(openai.BadRequestError) as refused_chat:
        chat(gateway, gateway.key("eng")).chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": f"RRN {RRN}"}])
    assert refused_chat.value.body["code"] == "pii_blocked"
    assert received(fakes) == []
    denied = [r for r in gateway.audit_records() if r["event"] == "request_denied"]
    assert [r["error"]["code"] for r in denied] == ["pii_blocked", "pii_blocked"]
    assert denied[0]["pii"] == {"policies": ["regulated"], "found": {"KR_RRN": 1, "SECRET": 1}, "refused": "pii_blocked"}


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def test_content_that_cannot_be_inspected_is_refused_or_routed_internally(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    ask = {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": "what is this?"}]}]}
    blocking = fresh_gateway(bundle=pii_bundle(tmp_path / "blocking"))
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(blocking, blocking.key("eng")).messages.create(**ask)
    assert refused.value.body["error"]["message"].endswith("cannot inspect or transform: image")
    assert received(fakes) == []

    catalog = deep_copy(CATALOG)
    catalog["models"]["claude-sonnet-4-5"]["targets"].append(target("anthropic-eu", "claude-sonnet-4-5-private", "eu-west-1", 3, internal=True))
    catalog["prices"].append(
        {"provider": "anthropic-eu", "model": "claude-sonnet-4-5-private", "effective_from": "2025-01-01", "usd_per_mtok": {"input": "1", "output": "1"}}
    )
    internal_policy = {"regulated": {**REGULATED, "scope": {"unsupported_sensitive_content": "internal"}}}
    routing = fresh_gateway(bundle=pii_bundle(tmp_path / "routing", internal_policy, catalog))
    claude(routing, routing.key("eng")).messages.create(**ask)
    assert [r.json["model"] for r in fakes.anthropic_eu.received] == ["claude-sonnet-4-5-private"] and fakes.anthropic_us.received == []
    claude(routing, routing.key("eng")).messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "plain text"}])
    assert len(fakes.anthropic_us.received) == 1  # inspectable requests keep their normal route


def test_personal_data_on_an_unsupported_surface_is_unsupported_content(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    narrow = {"regulated": {**REGULATED, "scope": {"supported_egress_fields": ["text"]}}}
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b", narrow))
    client = claude(gateway, gateway.key("eng"))
    messages = [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": f"owner: {EMAIL}"}]},
    ]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=messages)
    assert refused.value.body["error"]["message"].endswith("cannot inspect or transform: tool_results")
    messages[2]["content"][0]["content"] = "owner unknown"  # the surface itself is fine when it holds nothing
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=messages)


def test_personal_data_in_signed_reasoning_cannot_be_transformed_so_it_is_refused(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    thinking = {"type": "thinking", "thinking": f"the user is {EMAIL}", "signature": "c2lnbmF0dXJl"}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "hello"}]},
        {"role": "user", "content": "again"},
    ]
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(gateway, gateway.key("eng")).messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=messages)
    assert "signed reasoning (thinking)" in refused.value.body["error"]["message"]
    thinking["thinking"] = "the user said hi"  # placeholders or plain reasoning pass, signature intact
    claude(gateway, gateway.key("eng")).messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=messages)
    assert fakes.anthropic_us.received[0].json["messages"][1]["content"][0] == thinking


# --- restoring answers ---------------------------------------------------------------------


def test_answers_are_restored_whole_and_streamed_one_character_at_a_time(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = claude(gateway, gateway.key("eng"))
    ask = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": f"Write to {EMAIL} and {OTHER_EMAIL} <b>now</b>"}]}
    call = ToolCall("send_email", {"to": "<EMAIL_1>", "cc": "<EMAIL_2>"})
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True, tool_calls=(call,)), Reply(echo=True, tool_calls=(call,), pieces=400))
    whole = client.messages.create(**ask)
    assert whole.content[0].text == f"Write to {EMAIL} and {OTHER_EMAIL} <b>now</b>"
    assert whole.content[1].input == {"to": EMAIL, "cc": OTHER_EMAIL}
    with client.messages.stream(**ask) as stream:
        deltas = [event.delta.text for event in stream if event.type == "content_block_delta" and event.delta.type == "text_delta"]
        final = stream.get_final_message()
    assert "".join(deltas) == f"Write to {EMAIL} and {OTHER_EMAIL} <b>now</b>"
    assert final.content[1].input == {"to": EMAIL, "cc": OTHER_EMAIL}
    assert all(f"<{p}" not in "".join(deltas) for p in ("EMAIL",))
    outcomes = [r for r in gateway.settled() if r["event"] == "request_finished"]
    assert [r["pii"]["restored"] for r in outcomes] == [4, 4]


def test_openai_answers_and_streamed_tool_arguments_are_restored(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = chat(gateway, gateway.key("eng"))
    call = ToolCall("send_email", {"to": "<EMAIL_1>", "note": 'say "hi"'})
    fakes.openai_main.script(MINI_UPSTREAM, Reply(echo=True, tool_calls=(call,)), Reply(echo=True, tool_calls=(call,), pieces=200))
    ask = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"Contact {EMAIL}"}]}
    whole = client.chat.completions.create(**ask).choices[0].message
    assert whole.content == f"Contact {EMAIL}"
    assert json.loads(whole.tool_calls[0].function.arguments) == {"to": EMAIL, "note": 'say "hi"'}
    text, arguments = "", ""
    for chunk in client.chat.completions.create(stream=True, **ask):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for tool_call in choice.delta.tool_calls or []:
                arguments += tool_call.function.arguments or ""
    assert text == f"Contact {EMAIL}" and json.loads(arguments) == {"to": EMAIL, "note": 'say "hi"'}


def test_cross_protocol_answers_are_restored(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """A Chat client served by a Messages provider: the guard restores in the
    provider's events, the translator then converts what it restored."""
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True, pieces=50))
    stream = chat(gateway, gateway.key("eng")).chat.completions.create(
        model="claude-sonnet-4-5", stream=True, messages=[{"role": "user", "content": f"Contact {EMAIL}"}]
    )
    assert "".join(choice.delta.content or "" for chunk in stream for choice in chunk.choices) == f"Contact {EMAIL}"
    assert_nothing_leaked(received(fakes))


# --- what the gateway writes ------------------------------------------------------------------


def test_no_original_value_reaches_logs_audit_or_errors(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """Every kind of outcome, with debug logging on; then everything the gateway wrote
    is searched for the values it was given."""
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"), env={"PORTCULLIS_LOG_LEVEL": "DEBUG"})
    client = claude(gateway, gateway.key("eng"), **{"x-portcullis-session-id": "leak-check"})
    everything = f"{EMAIL} {OTHER_EMAIL} {CARD} {IP} {IBAN} {PHONE}"
    bodies: list[Any] = []
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True), Reply(echo=True, pieces=60), Reply(text="bad <EMAIL_9>"))
    bodies.append(client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": everything}]).to_dict())
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": everything}]) as stream:
        bodies.append(stream.get_final_message().to_dict())
    for content in (f"{everything} {RRN}", f"{everything} {SECRET}", f"{everything} who?"):
        try:
            client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": content}])
        except anthropic.APIStatusError as error:
            bodies.append(error.body)
    assert "maria.garcia@example.com" in json.dumps(bodies)  # the client itself got its values back
    assert_nothing_leaked([r.json for r in fakes.anthropic_us.received])
    assert_nothing_leaked(gateway.logs(), gateway.audit_path.read_text(), [b for b in bodies if "error" in b])
    subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", "audit", "verify", str(gateway.audit_path)], check=True, capture_output=True)
    gateway.signal(signal.SIGTERM)
