"""The PII guard end to end: the official SDKs through real gateway processes to the
fake provider, asserting on what the provider received (never an original value)
and on what the client got back (restored where the policy allows)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.bundles import CATALOG, TENANTS, deep_copy, target, write_bundle
from tests.conftest import Fakes, Services, private_redis
from tests.fakes import Reply, ToolCall

pytestmark = pytest.mark.served

SONNET_UPSTREAM = "claude-sonnet-4-5-20250929"
MINI_UPSTREAM = "gpt-4o-mini-2024-07-18"

EMAIL = "maria.garcia@example.com"
OTHER_EMAIL = "kenji.tanaka@example.jp"
CARD = "4111 1111 1111 1111"
IP = "203.0.113.42"
RRN = "900101-1234568"
IBAN = "DE89 3704 0044 0532 0130 00"
PHONE = "+44 20 7946 0958"
SECRET = "AKIAZ7QW3ERTY5UIOP12"
EVERY_VALUE = (EMAIL, OTHER_EMAIL, CARD, IP, RRN, IBAN, PHONE, SECRET, "4111111111111111", "900101")

REGULATED = {
    "teams": ["eng"],
    "actions": {
        "EMAIL": "pseudonymize",
        "PHONE": "pseudonymize",
        "CREDIT_CARD": "mask",
        "IP_ADDRESS": "redact",
        "IBAN": "tokenize",
        "KR_RRN": "block",
        "SECRET": "block",
    },
    "token_readers": ["eng/carol"],
}


def pii_bundle(directory: Path, policies: dict[str, Any] | None = None, catalog: dict[str, Any] | None = None) -> Path:
    return write_bundle(directory, deep_copy(TENANTS), catalog or deep_copy(CATALOG), pii=policies if policies is not None else {"regulated": REGULATED})


def claude(gateway: Any, key: str, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, default_headers=headers)


def chat(gateway: Any, key: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, default_headers=headers)


def received(fakes: Fakes) -> list[dict[str, Any]]:
    return [r.json for fake in fakes.all() for r in fake.received]


def assert_nothing_leaked(*documents: Any) -> None:
    text = json.dumps(documents, ensure_ascii=False)
    for value in EVERY_VALUE:
        assert value not in text, value


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


# --- sessions, scopes and the vault ---------------------------------------------------------


def test_session_pseudonyms_keep_the_upstream_prefix_byte_stable(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """Cache honesty: with a session, turn 2's upstream body begins with turn 1's bytes
    (less the closing brackets), and a value dropped from the context keeps its number."""
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = claude(gateway, gateway.key("eng"), **{"x-portcullis-session-id": "conv-1"})
    system = f"You help {OTHER_EMAIL}'s team."
    turn1 = [{"role": "user", "content": f"Mail {EMAIL} the card {CARD} summary"}]
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, system=system, messages=turn1)
    turn2 = [*turn1, {"role": "assistant", "content": "Sent."}, {"role": "user", "content": f"Also cc {OTHER_EMAIL} and {EMAIL}"}]
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, system=system, messages=turn2)
    first, second = (r.body for r in fakes.anthropic_us.received)
    shared = first[: first.index(b'"}]') + 2]  # up to the end of turn 1's last message
    assert second.startswith(shared)
    assert json.loads(second)["messages"][2]["content"] == "Also cc <EMAIL_1> and <EMAIL_2>"
    compacted = [{"role": "user", "content": f"Only {EMAIL} now"}]  # turn 1 summarised away
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, system="You help.", messages=compacted)
    assert fakes.anthropic_us.received[2].json["messages"][0]["content"] == "Only <EMAIL_2> now"


def test_without_a_session_numbering_follows_the_prompt(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = claude(gateway, gateway.key("eng"))
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"{OTHER_EMAIL} then {EMAIL}"}])
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"{EMAIL} alone"}])
    assert [r.json["messages"][0]["content"] for r in fakes.anthropic_us.received] == ["<EMAIL_1> then <EMAIL_2>", "<EMAIL_1> alone"]


def test_one_principal_never_restores_another_principals_values(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    session = {"x-portcullis-session-id": "shared-name"}
    alice, bob = claude(gateway, gateway.key("eng", "alice"), **session), claude(gateway, gateway.key("eng", "bob"), **session)
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(text="ok"), Reply(text="Your contact is <EMAIL_1>."), Reply(text="Your contact is <EMAIL_1>."))
    alice.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"remember {EMAIL}"}])
    with pytest.raises(anthropic.APIStatusError) as withheld:  # same session name, another principal: not Alice's vault
        bob.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "who is <EMAIL_1>?"}])
    assert withheld.value.status_code == 502 and "withheld" in withheld.value.body["error"]["message"]
    answer = alice.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "who was it?"}])
    assert answer.content[0].text == f"Your contact is {EMAIL}."  # her session's vault still knows


def test_a_lost_vault_withholds_the_answer(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """Embedded, the vault is in memory: after a restart a placeholder from an earlier
    turn cannot be restored, and the answer is withheld rather than shown wrong."""
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    key = gateway.key("eng")
    session = {"x-portcullis-session-id": "conv-9"}
    claude(gateway, key, **session).messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"hi {EMAIL}"}])
    gateway.stop()
    gateway.start()
    fakes.anthropic_us.script(SONNET_UPSTREAM, *[Reply(text="Reply to <EMAIL_1>.", pieces=5)] * 2)
    with pytest.raises(anthropic.APIStatusError) as withheld:
        claude(gateway, key, **session).messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "and?"}])
    assert withheld.value.body["error"]["type"] == "api_error" and "withheld" in withheld.value.body["error"]["message"]
    shown: list[str] = []
    with (
        pytest.raises(anthropic.APIError),
        claude(gateway, key, **session).messages.stream(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "and?"}]) as stream,
    ):
        shown.extend(event.delta.text for event in stream if event.type == "content_block_delta")
    assert "Reply to ".startswith("".join(shown)) and "<" not in "".join(shown)  # the stream ends in an error before the placeholder
    failed = [r for r in gateway.settled() if r["event"] == "request_failed"]
    assert [r["error"]["code"] for r in failed] == ["pii_restore_failed", "pii_restore_failed"]
    # The provider's work is still charged: the whole answer's usage, or the stream's bound
    # kept pending when the guard stopped it before its usage arrived. Never released.
    assert failed[0]["settlement"] == "settled" and failed[1]["settlement"] in ("settled", "pending")


def test_tokens_are_restored_only_for_readers(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True))
    claude(gateway, gateway.key("eng", "alice")).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"pay {IBAN}"}]
    )
    token = fakes.anthropic_us.received[0].json["messages"][0]["content"].removeprefix("pay ")
    assert token.startswith("<IBAN_TKN_") and IBAN not in fakes.anthropic_us.received[0].body.decode()
    answer = Reply(text=f"The account is {token}.")
    fakes.anthropic_eu.script("claude-haiku-4-5-20251001", answer)  # carol may only use haiku
    fakes.anthropic_us.script(SONNET_UPSTREAM, answer)
    ask = {"max_tokens": 10, "messages": [{"role": "user", "content": "which?"}]}
    carol = claude(gateway, gateway.key("eng", "carol")).messages.create(model="claude-haiku-4-5", **ask)
    erin = claude(gateway, gateway.key("eng", "erin")).messages.create(model="claude-sonnet-4-5", **ask)
    assert carol.content[0].text == f"The account is {IBAN}."  # a reader, in another session: the team's vault
    assert erin.content[0].text == f"The account is {token}."  # not a reader: the token stays a token


# --- failures ----------------------------------------------------------------------------------


def test_a_vault_that_cannot_be_reached_refuses_or_degrades_as_the_policy_says(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    ask = {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": f"mail {EMAIL}"}]}
    session = {"x-portcullis-session-id": "s1"}
    with private_redis() as redis_url:
        env = {"DATABASE_URL": services.database_url, "REDIS_URL": redis_url}
        shared = {"store": {"kind": "shared", "redis_prefix": services.redis_prefix}, "auth": {"key_cache_seconds": 300}}
        closed = fresh_gateway(bundle=pii_bundle(tmp_path / "closed"), env=env, **shared)
        fail_open = {"regulated": {**REGULATED, "on_error": "fail_open"}}
        opened = fresh_gateway(bundle=pii_bundle(tmp_path / "open", fail_open), env=env, **shared)
        clients = [claude(g, g.key("eng", env=env), **session) for g in (closed, opened)]
        for client in clients:  # keys verified and the vault used while Redis is up
            client.messages.create(**ask)
    for fake in fakes.all():
        fake.reset()
    with pytest.raises(anthropic.APIStatusError) as refused:
        clients[0].messages.create(**ask)
    assert refused.value.status_code == 503 and refused.value.body["error"]["message"].startswith("the PII guard could not inspect")
    assert received(fakes) == []
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True))
    answer = clients[1].messages.create(**ask)  # the policy chose availability: this request's own mapping
    assert fakes.anthropic_us.received[0].json["messages"][0]["content"] == "mail <EMAIL_1>"
    assert answer.content[0].text == f"mail {EMAIL}"
    started = [r for r in opened.audit_records() if r["event"] == "request_started"][-1]
    assert started["pii"]["degraded"] == ["vault"] and started["pii"]["session"] is False


def test_replicas_share_a_session_through_the_redis_vault(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    env = {"DATABASE_URL": services.database_url, "REDIS_URL": services.redis_url, "VAULT_KEY": "11" * 32}
    settings = {"store": {"kind": "shared", "redis_prefix": services.redis_prefix}, "pii": {"vault": {"key_env": "VAULT_KEY"}}}
    bundle = pii_bundle(tmp_path / "b")
    first, second = fresh_gateway(bundle=bundle, env=env, **settings), fresh_gateway(bundle=bundle, env=env, **settings)
    key = first.key("eng", "alice", env=env)
    session = {"x-portcullis-session-id": f"conv-{uuid.uuid4().hex}"}
    claude(first, key, **session).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"{OTHER_EMAIL} and {EMAIL}"}]
    )
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(text="Answer <EMAIL_2> first."))
    answer = claude(second, key, **session).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"who is {EMAIL}?"}]
    )
    assert fakes.anthropic_us.received[1].json["messages"][0]["content"] == "who is <EMAIL_2>?"  # the other replica's numbering
    assert answer.content[0].text == f"Answer {EMAIL} first."


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


def classifier_bundle(directory: Path, governance: dict[str, Any] | None = None) -> Path:
    catalog = deep_copy(CATALOG)
    catalog["models"]["pii-classifier"] = {"targets": [target("openai-main", "pii-classifier-8b", "us-east-1", internal=True)]}
    price = {"provider": "openai-main", "model": "pii-classifier-8b", "effective_from": "2025-01-01", "usd_per_mtok": {"input": "1", "output": "2"}}
    catalog["prices"].append(price)
    policies = {"contextual": {"teams": ["eng"], "actions": {"PERSON": "pseudonymize", "EMAIL": "pseudonymize"}, "detectors": ["classifier"]}}
    bundle = write_bundle(directory, deep_copy(TENANTS), catalog, governance=governance, pii=policies)
    data = bundle / "portcullis" / "pii" / "data.yaml"
    data.write_text(data.read_text() + "classifier: {model: pii-classifier, max_output_tokens: 200}\n")
    return bundle


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


@pytest.mark.parametrize("action", ["mask", "redact", "tokenize", "pseudonymize"])
def test_every_action_keeps_the_prefix_byte_stable_across_turns(action: str, tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """Cache honesty, per action and without a session: replacements are deterministic,
    so turn 2's upstream body begins with turn 1's bytes."""
    policy = {"p": {"teams": ["eng"], "actions": {"EMAIL": action, "CREDIT_CARD": action}}}
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b", policy))
    client = claude(gateway, gateway.key("eng"))
    turn1 = [{"role": "user", "content": f"Card {CARD} belongs to {EMAIL}"}]
    turn2 = [*turn1, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": f"And {OTHER_EMAIL}?"}]
    for messages in (turn1, turn2):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=10, system=f"Escalate to {OTHER_EMAIL}", messages=messages)
    first, second = (r.body for r in fakes.anthropic_us.received)
    assert second.startswith(first[: first.index(b'"}]') + 2]) and CARD.encode() not in second


# --- what a review found: every field, strict parsing, the stricter action -----------------------


def test_every_field_the_provider_reads_is_covered_in_both_protocols(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    chat(gateway, gateway.key("eng")).chat.completions.create(
        model="gpt-4o-mini",
        user=EMAIL,
        metadata={"owner": EMAIL},
        stop=[OTHER_EMAIL],
        prediction={"type": "content", "content": f"Dear {EMAIL}"},
        response_format={"type": "json_schema", "json_schema": {"name": "r", "description": f"for {OTHER_EMAIL}", "schema": {"type": "object"}}},
        messages=[{"role": "user", "content": "hi", "name": "maria"}, {"role": "assistant", "content": None, "refusal": f"not for {EMAIL}"}],
    )
    claude(gateway, gateway.key("eng")).messages.create(
        model="claude-sonnet-4-5",
        max_tokens=10,
        metadata={"user_id": EMAIL},
        stop_sequences=[OTHER_EMAIL],
        messages=[
            {"role": "user", "content": "what did it say?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "text",
                        "text": "It said so.",
                        "citations": [
                            {
                                "type": "char_location",
                                "cited_text": f"mail {EMAIL}",
                                "document_index": 0,
                                "document_title": OTHER_EMAIL,
                                "start_char_index": 0,
                                "end_char_index": 5,
                            }
                        ],
                    }
                ],
            },
            {"role": "user", "content": "thanks"},
        ],
    )
    [to_openai] = [r.json for r in fakes.openai_main.received]
    [to_anthropic] = [r.json for r in fakes.anthropic_us.received]
    assert_nothing_leaked(to_openai, to_anthropic)
    assert to_openai["user"] == "<EMAIL_2>" and to_openai["metadata"] == {"owner": "<EMAIL_2>"} and to_openai["stop"] == ["<EMAIL_1>"]
    assert to_anthropic["metadata"] == {"user_id": "<EMAIL_1>"} and to_anthropic["stop_sequences"] == ["<EMAIL_2>"]


def test_personal_data_where_no_filter_can_change_it_is_refused(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """A field this gateway does not know, or an object key, is read but not rewritten:
    personal data there is unsupported content, never sent as is."""
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = claude(gateway, gateway.key("eng"))
    cases = [
        {"extra_body": {"some_future_field": {"note": f"owner {EMAIL}"}}},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {EMAIL: 1}}]}]},
    ]
    for case in cases:
        ask = {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **case}
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(**ask)
        assert refused.value.body["error"]["message"].endswith("cannot inspect or transform: fields the filter cannot change")
    assert received(fakes) == []


def test_tool_arguments_are_parsed_as_strictly_as_the_body(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = chat(gateway, gateway.key("eng"))
    for arguments in ('{"to": "' + EMAIL + '", "to": "x"}', '{"note": "\\ud800", "to": "' + EMAIL + '"}'):
        call = {"id": "c", "type": "function", "function": {"name": "send", "arguments": arguments}}
        with pytest.raises(openai.BadRequestError):  # a 400, never a 500
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
            )
    assert received(fakes) == []
    call = {"id": "c", "type": "function", "function": {"name": "send", "arguments": '{"to": "' + EMAIL + '", "amount": 1e400, "n": 12345678901234567890}'}}
    client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    )
    assert (
        fakes.openai_main.received[0].json["messages"][1]["tool_calls"][0]["function"]["arguments"]
        == '{"to": "<EMAIL_1>", "amount": 1e400, "n": 12345678901234567890}'
    )


def test_an_identifier_of_two_types_gets_the_stricter_action(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """4001011100033 is a valid Korean RRN and passes Luhn with a card prefix: the card
    would only be masked, the RRN is blocked, so it is blocked."""
    from portcullis.engine.pii.validators import kr_rrn_valid, luhn_valid

    assert kr_rrn_valid("4001011100033") and luhn_valid("4001011100033")
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(gateway, gateway.key("eng")).messages.create(
            model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "주민번호 4001011100033"}]
        )
    assert "KR_RRN (1)" in refused.value.body["error"]["message"] and received(fakes) == []


def test_a_token_is_never_shown_to_a_non_reader_even_the_one_who_sent_it(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True))
    answer = claude(gateway, gateway.key("eng", "alice")).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"pay {IBAN}"}]
    )
    assert answer.content[0].text.startswith("pay <IBAN_TKN_") and IBAN not in answer.content[0].text


def test_angle_bracket_words_that_are_no_entity_do_not_withhold_answers(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(text="Do <STEP_1>, then <STEP_2>."))
    answer = claude(gateway, gateway.key("eng")).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"plan for {EMAIL}"}]
    )
    assert answer.content[0].text == "Do <STEP_1>, then <STEP_2>."


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
