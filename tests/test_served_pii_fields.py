"""What a review of the PII guard found, end to end: every field the provider reads,
strict parsing of tool arguments, the stricter action, tokens and readers, and
answers that only look like placeholders."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest

from tests.conftest import Fakes
from tests.fakes import Reply
from tests.pii_helpers import EMAIL, IBAN, OTHER_EMAIL, SONNET_UPSTREAM, assert_nothing_leaked, chat, claude, pii_bundle, received

pytestmark = pytest.mark.served


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
