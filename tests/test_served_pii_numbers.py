"""Numbers are data: JSON numbers in tool-call arguments and tool inputs go through the
PII filter like strings, with the official SDKs through a real gateway to the fake
provider. A blocked type refuses the request; a transformed number reaches the
provider as a JSON string (valid JSON, the rest of the document as it was); restored
answers stay valid JSON, in whole answers and in streams."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import openai
import pytest

from tests.conftest import Fakes
from tests.fakes import Reply, ToolCall
from tests.pii_helpers import MINI_UPSTREAM, SONNET_UPSTREAM, chat, claude, pii_bundle

pytestmark = pytest.mark.served

NUMBERS = {
    "teams": ["eng"],
    "actions": {"CREDIT_CARD": "mask", "US_SSN": "pseudonymize", "EMAIL": "pseudonymize", "KR_RRN": "block"},
}
CARD = 4111111111111111
OTHER_CARD = 5555555555554444
SSN = 412557391  # nine bare digits: an SSN only because its member's name says so
RRN = 9001011234568


def function_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_openai_tool_arguments_carry_numbers_that_are_masked_pseudonymised_or_refused(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b", {"numbers": NUMBERS}))
    client = chat(gateway, gateway.key("eng"))
    arguments = {"card": CARD, "ssn": SSN, "qty": 3, "price": 12.5, "cards": [OTHER_CARD, 7], "ok": True, "ticket": 884213307}

    def call_with(arguments_text: str) -> list[dict]:
        return [
            {"role": "user", "content": f"Charge the card again; customer {SSN}."},
            {"role": "assistant", "content": None, "tool_calls": [function_call("c1", "charge", arguments_text)]},
            {"role": "tool", "tool_call_id": "c1", "content": "declined"},
        ]

    fakes.openai_main.script(MINI_UPSTREAM, Reply(text="Retrying."))
    client.chat.completions.create(model="gpt-4o-mini", messages=call_with(json.dumps(arguments)))
    [sent] = [r.json for r in fakes.openai_main.received]
    upstream_arguments = sent["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(upstream_arguments) == {
        "card": "4111********1111",  # a replaced number is a JSON string
        "ssn": "<US_SSN_1>",
        "qty": 3,  # numbers nothing was found in stay numbers, as written
        "price": 12.5,
        "cards": ["5555********4444", 7],
        "ok": True,
        "ticket": 884213307,  # nine digits under a name that is no label
    }
    assert str(CARD) not in upstream_arguments and str(SSN) not in upstream_arguments
    # the value the member's name calls an SSN is that SSN wherever else the request holds it
    assert sent["messages"][0]["content"] == "Charge the card again; customer <US_SSN_1>."

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-4o-mini", messages=call_with(json.dumps({"holder": {"rrn": RRN}})))
    assert refused.value.body["code"] == "pii_blocked" and str(RRN) not in refused.value.body["message"]
    assert len(fakes.openai_main.received) == 1  # the refused request never left


def test_openai_answers_restore_numbers_into_valid_json_arguments(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b", {"numbers": NUMBERS}))
    client = chat(gateway, gateway.key("eng"))
    call = ToolCall("lookup", {"ssn": "<US_SSN_1>", "limit": 5})
    fakes.openai_main.script(MINI_UPSTREAM, Reply(tool_calls=(call,)), Reply(tool_calls=(call,), pieces=40))
    ask = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "user", "content": "Look the customer up."},
            {"role": "assistant", "content": None, "tool_calls": [function_call("c0", "find", json.dumps({"ssn": SSN}))]},
            {"role": "tool", "tool_call_id": "c0", "content": "ok"},
        ],
    }
    whole = client.chat.completions.create(**ask).choices[0].message
    assert json.loads(whole.tool_calls[0].function.arguments) == {"ssn": str(SSN), "limit": 5}
    streamed = ""
    for chunk in client.chat.completions.create(stream=True, **ask):
        for choice in chunk.choices:
            for tool_call in choice.delta.tool_calls or []:
                streamed += tool_call.function.arguments or ""
    assert json.loads(streamed) == {"ssn": str(SSN), "limit": 5}


def test_anthropic_tool_inputs_carry_numbers_that_are_masked_refused_and_restored(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b", {"numbers": NUMBERS}))
    client = claude(gateway, gateway.key("eng"))

    def ask(tool_input: dict) -> dict:
        return {
            "model": "claude-sonnet-4-5",
            "max_tokens": 100,
            "messages": [
                {"role": "user", "content": "Pay it."},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "pay", "input": tool_input}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "declined"}]},
            ],
        }

    call = ToolCall("pay", {"customer_ssn": "<US_SSN_1>", "amount": 12})
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(tool_calls=(call,)), Reply(tool_calls=(call,), pieces=30))
    tool_input = {"card": CARD, "amount": 12, "customer_ssn": SSN, "history": [{"card": OTHER_CARD, "amount": 3.25}]}
    whole = client.messages.create(**ask(tool_input))
    [sent] = [r.json for r in fakes.anthropic_us.received]
    assert sent["messages"][1]["content"][0]["input"] == {
        "card": "4111********1111",
        "amount": 12,
        "customer_ssn": "<US_SSN_1>",
        "history": [{"card": "5555********4444", "amount": 3.25}],
    }
    assert [block.input for block in whole.content if block.type == "tool_use"] == [{"customer_ssn": str(SSN), "amount": 12}]
    with client.messages.stream(**ask(tool_input)) as stream:
        final = stream.get_final_message()
    assert [block.input for block in final.content if block.type == "tool_use"] == [{"customer_ssn": str(SSN), "amount": 12}]

    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(**ask({"applicant": {"rrn": RRN}, "n": 1}))
    assert "KR_RRN (1)" in refused.value.body["error"]["message"] and str(RRN) not in refused.value.body["error"]["message"]
    assert len(fakes.anthropic_us.received) == 2


def test_a_number_where_no_filter_can_change_it_is_unsupported_content(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b", {"numbers": NUMBERS}))
    client = claude(gateway, gateway.key("eng"))
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "hi"}], extra_body={"x_billing": {"card": CARD}}
        )
    assert refused.value.body["error"]["message"].endswith("fields the filter cannot change") and str(CARD) not in refused.value.body["error"]["message"]
    assert fakes.anthropic_us.received == []


def test_folded_text_is_transformed_in_its_original_characters_only(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """A card grouped with no-break spaces, a percent-encoded and a full-width e-mail:
    each finding is replaced in the original characters; every other byte of the
    text goes upstream as the client wrote it."""
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b", {"numbers": NUMBERS}))
    text = "Karte 4111\u00a01111\u00a01111\u00a01111 · mailto:jane.doe%40example.com · ｔａｒｏ＠ｅｘａｍｐｌｅ．ｊｐ　です。SSN: 412557391"
    client = claude(gateway, gateway.key("eng"))
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": text}])
    [sent] = [r.json for r in fakes.anthropic_us.received]
    assert sent["messages"][0]["content"] == "Karte 4111\u00a0****\u00a0****\u00a01111 · mailto:<EMAIL_1> · <EMAIL_2>　です。SSN: <US_SSN_1>"
