"""Messages client → Responses provider: the translator on its own, its answers and
streams read by the ``anthropic`` SDK itself."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message

from portcullis.adapters.protocols.sse import SSEParser
from portcullis.adapters.protocols.translators import anthropic_messages_to_openai_responses as translator
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.plan import Target
from tests.anthropic_sdk import sdk_message, sdk_stream
from tests.fakes import openai_responses as fake
from tests.fakes.behaviours import Reply, ToolCall
from tests.translator_helpers import translated_stream

TARGET = Target("gpt-5", "openai", "gpt-5-2025-08-07", "us-east-1", 1, 400000, 128000, ("tools",))
PAYLOAD = {"model": "gpt-5", "input": []}


def convert(**body: Any) -> dict[str, Any]:
    document = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **body}
    return translator.convert_request(document, TARGET, bool(document.get("stream")))


def stream(upstream: list[bytes]) -> tuple[list[str], Message]:
    """The translated stream as the ``anthropic`` SDK reads it."""
    return sdk_stream(translated_stream(translator.StreamConverter(True, 5), upstream))


def test_system_sampling_stream_and_cost_only_hints() -> None:
    out = convert(
        system=[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "b"}],
        max_tokens=200000,
        temperature=0.5,
        top_p=0.9,
        stream=True,
        metadata={"user_id": "u"},
        thinking={"type": "disabled"},
        stop_sequences=[],
    )
    assert out == {
        "model": TARGET.model,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "max_output_tokens": 128000,  # the target's ceiling
        "store": False,
        "instructions": "a\n\nb",
        "temperature": 0.5,
        "top_p": 0.9,
        "stream": True,
    }
    assert convert(system="s")["instructions"] == "s" and convert()["max_output_tokens"] == 10


def test_conversation_with_images_documents_tools_and_thinking_history() -> None:
    png = {"type": "base64", "media_type": "image/png", "data": "AA"}
    out = convert(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                    {"type": "image", "source": png},
                    {"type": "image", "source": {"type": "url", "url": "https://x/i.png"}},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}, "title": "a.pdf"},
                    {"type": "document", "source": {"type": "url", "url": "https://x/d.pdf"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "...", "signature": "s"},
                    {"type": "redacted_thinking", "data": "x"},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"q": "é"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "image", "source": png}], "is_error": True},
                    {"type": "text", "text": "and?"},
                ],
            },
        ]
    )
    assert out["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "auto"},
                {"type": "input_image", "image_url": "https://x/i.png", "detail": "auto"},
                {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"},
                {"type": "input_file", "file_url": "https://x/d.pdf"},
            ],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
        {"type": "function_call", "call_id": "toolu_1", "name": "f", "arguments": '{"q": "é"}'},
        {"type": "function_call", "call_id": "toolu_2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "toolu_1", "output": "ab"},
        {
            "type": "function_call_output",
            "call_id": "toolu_2",
            "output": [{"type": "input_text", "text": "[tool error]"}, {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "auto"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and?"}]},
    ]


def test_tools_and_tool_choice() -> None:
    cached = {"name": "f", "description": "d", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}
    out = convert(tools=[cached, {"type": "custom", "name": "g"}])
    assert out["tools"] == [
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": False, "description": "d"},
        {"type": "function", "name": "g", "parameters": {"type": "object", "properties": {}}, "strict": False},
    ]
    assert convert(tool_choice={"type": "auto"})["tool_choice"] == "auto"
    assert convert(tool_choice={"type": "any"})["tool_choice"] == "required"
    assert convert(tool_choice={"type": "none"})["tool_choice"] == "none"
    chosen = convert(tool_choice={"type": "tool", "name": "f", "disable_parallel_tool_use": True})
    assert chosen["tool_choice"] == {"type": "function", "name": "f"} and chosen["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stop_sequences": ["END"]}, "stop_sequences"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2000}}, "thinking"),
        ({"top_k": 5}, "top_k"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"system": [{"type": "image"}]}, "system[0]"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "search_result"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "assistant", "content": [{"type": "server_tool_use"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}, "messages[0].content[0].source"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]},
            "messages[0].content[0].source",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "url", "url": "u"}, "citations": {"enabled": True}}]}]},
            "messages[0].content[0].citations",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}]}]},
            "messages[0].content[0].content[0]",
        ),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_refusals_name_their_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(GatewayError) as refused:
        convert(**body)
    assert refused.value.message.startswith(field + ":") and refused.value.kind is ErrorKind.INVALID_REQUEST


def _response(output: list[dict[str, Any]], reply: Reply, status: str = "completed") -> dict[str, Any]:
    return fake.response("resp_abc", PAYLOAD, output, reply, status)


def test_response_with_reasoning_text_and_function_call() -> None:
    call = ToolCall("f", {"q": 1}, "call_1")
    reply = Reply(text="Calling.", tool_calls=(call,), input_tokens=30, cache_read_tokens=70, output_tokens=8, reasoning="thinking")
    message = sdk_message(translator.convert_response(_response(fake.output_items(reply, PAYLOAD), reply), created=1))
    assert message.id == "msg_abc" and message.model == "gpt-5" and message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use"]  # the reasoning summary is dropped
    assert message.content[0].text == "Calling."
    assert message.content[1].id == "call_1" and message.content[1].name == "f" and message.content[1].input == {"q": 1}
    assert message.usage.input_tokens == 30 and message.usage.cache_read_input_tokens == 70 and message.usage.output_tokens == 8


def test_response_stop_reasons() -> None:
    reply = Reply(text="a")
    document = _response(fake.output_items(reply, PAYLOAD), reply)
    assert translator.convert_response(document, 1)["stop_reason"] == "end_turn"
    cut = {**document, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    assert sdk_message(translator.convert_response(cut, 1)).stop_reason == "max_tokens"
    refusal = {"id": "m", "type": "message", "role": "assistant", "status": "completed", "content": [{"type": "refusal", "refusal": "no"}]}
    refused = translator.convert_response({**document, "output": [refusal]}, 1)
    assert refused["stop_reason"] == "refusal" and refused["content"] == [{"type": "text", "text": "no"}]


def test_untranslatable_answers_are_upstream_errors() -> None:
    reply = Reply(text="", tool_calls=(ToolCall("apply_patch", {}, "call_p", raw="*** Begin Patch"),))
    with pytest.raises(GatewayError, match="custom_tool_call"):
        translator.convert_response(_response(fake.output_items(reply, PAYLOAD), reply), 1)
    bad = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{nope"}
    with pytest.raises(GatewayError, match="not valid JSON"):
        translator.convert_response(_response([bad], Reply()), 1)
    with pytest.raises(GatewayError, match="failed"):
        translator.convert_response({**_response([], Reply()), "status": "failed"}, 1)


def test_stream_of_reasoning_text_and_tool_calls_accumulates_in_the_sdk() -> None:
    reply = Reply(
        text="Hello there, world",
        tool_calls=(ToolCall("f", {"city": "Paris"}, "call_a"), ToolCall("g", {"n": [1, 2]}, "call_b")),
        input_tokens=40,
        cache_read_tokens=2,
        output_tokens=9,
        reasoning="hmm",
    )
    kinds, message = stream(fake.events("resp_s1", PAYLOAD, fake.output_items(reply, PAYLOAD), reply))
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == 3 == kinds.count("content_block_stop")
    assert message.id == "msg_s1" and message.stop_reason == "tool_use"
    assert message.content[0].type == "text" and message.content[0].text == "Hello there, world"
    assert [(b.id, b.name, b.input) for b in message.content[1:]] == [("call_a", "f", {"city": "Paris"}), ("call_b", "g", {"n": [1, 2]})]
    assert message.usage.input_tokens == 40 and message.usage.cache_read_input_tokens == 2 and message.usage.output_tokens == 9


def test_stream_cut_by_the_output_limit_and_done_only_text() -> None:
    reply = Reply(text="partial", pieces=1)
    upstream = fake.events("resp_s2", PAYLOAD, fake.output_items(reply, PAYLOAD), reply)
    # A provider that streams no deltas, and stops at the limit.
    upstream = [e for e in upstream if b"output_text.delta" not in e]
    last = json.loads(SSEParser().feed(upstream[-1])[0].data)
    last.update(type="response.incomplete", response={**last["response"], "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}})
    upstream[-1] = f"event: response.incomplete\ndata: {json.dumps(last)}\n\n".encode()
    _, message = stream(upstream)
    assert message.content[0].text == "partial" and message.stop_reason == "max_tokens"


def test_stream_of_a_custom_tool_call_is_an_upstream_error() -> None:
    reply = Reply(text="", tool_calls=(ToolCall("apply_patch", {}, "call_p", raw="x"),))
    converter = translator.StreamConverter(True, 5)
    with pytest.raises(GatewayError, match="custom_tool_call"):
        for event in SSEParser().feed(b"".join(fake.events("resp_c", PAYLOAD, fake.output_items(reply, PAYLOAD), reply))):
            converter.feed(event)


def test_finish_closes_what_the_provider_left_open() -> None:
    reply = Reply(text="abc")
    upstream = fake.events("resp_f", PAYLOAD, fake.output_items(reply, PAYLOAD), reply)[:5]  # created, in_progress, item, part, first delta
    kinds, message = stream(upstream)
    assert message.content[0].text == "a" and message.stop_reason == "end_turn" and kinds[-1] == "message_stop"
