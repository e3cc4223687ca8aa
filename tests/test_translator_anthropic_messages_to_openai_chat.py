"""Messages client → Chat provider: the translator on its own."""

from __future__ import annotations

import json

import pytest

from portcullis.adapters.protocols.sse import SSEParser, encode
from portcullis.adapters.protocols.translators import anthropic_messages_to_openai_chat as translator
from portcullis.engine.errors import GatewayError
from portcullis.engine.plan import Target

TARGET = Target("gpt-4o-mini", "openai", "gpt-4o-mini-2024-07-18", "us-east-1", 1, 128000, 16384, ("tools",))


def convert(**body) -> dict:
    document = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **body}
    return translator.convert_request(document, TARGET, bool(document.get("stream")))


def test_system_blocks_thinking_history_and_inline_system_turns() -> None:
    out = convert(
        system=[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "b"}],
        thinking={"type": "disabled"},
        messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "...", "signature": "s"}, {"type": "text", "text": "r"}]},
            {"role": "system", "content": "reminder"},
        ],
    )
    assert out["messages"][0] == {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert out["messages"][2] == {"role": "assistant", "content": "r"}
    assert out["messages"][3] == {"role": "system", "content": "reminder"}


def test_images_and_tool_choice() -> None:
    out = convert(
        messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AA"}}]}],
        tools=[{"name": "f", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "f", "disable_parallel_tool_use": True},
    )
    assert out["messages"][0]["content"][0]["image_url"]["url"] == "data:image/jpeg;base64,AA"
    assert out["tool_choice"] == {"type": "function", "function": {"name": "f"}} and out["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"top_k": 3}, "top_k"),
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]}, "only text tool results"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "only custom tools"),
    ],
)
def test_refusals(body: dict, message: str) -> None:
    with pytest.raises(GatewayError, match=message):
        convert(**body)


def test_response_and_invalid_tool_arguments() -> None:
    completion = {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"message": {"content": None, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 20}},
    }
    message = translator.convert_response(completion, created=1)
    assert message["id"] == "msg_chatcmpl-1" and message["content"] == [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]
    assert message["usage"] == {"input_tokens": 30, "output_tokens": 5, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 0}
    completion["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "{oops"
    with pytest.raises(GatewayError, match="not valid JSON"):
        translator.convert_response(completion, created=1)


def test_stream_with_text_then_two_tools() -> None:
    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return encode({"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    upstream = [
        chunk({"role": "assistant", "content": "Hi"}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
        encode({"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        b"data: [DONE]\n\n",
    ]
    converter = translator.StreamConverter(include_usage=True, created=1)
    events = [e for raw in SSEParser().feed(b"".join(upstream)) for e in SSEParser().feed(b"".join(converter.feed(raw)))]
    names = [e.event for e in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    starts = [json.loads(e.data)["content_block"] for e in events if e.event == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use", "tool_use"] and starts[2]["name"] == "g"
    partial = "".join(
        json.loads(e.data)["delta"].get("partial_json", "") for e in events if e.event == "content_block_delta" and json.loads(e.data)["index"] == 1
    )
    assert json.loads(partial) == {"x": 1}
    final = json.loads(events[-2].data)
    assert final["delta"]["stop_reason"] == "tool_use" and final["usage"]["output_tokens"] == 3 and final["usage"]["input_tokens"] == 7


def test_interleaved_tool_calls_cannot_be_expressed() -> None:
    converter = translator.StreamConverter(include_usage=True, created=1)
    for delta in ({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f"}}]}, {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g"}}]}):
        [event] = SSEParser().feed(encode({"id": "c", "choices": [{"delta": delta}]}))
        converter.feed(event)
    [back] = SSEParser().feed(encode({"id": "c", "choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}))
    with pytest.raises(GatewayError, match="interleaved"):
        converter.feed(back)


def test_tool_error_flag_survives_as_text() -> None:
    out = convert(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True}]}])
    assert out["messages"][0] == {"role": "tool", "tool_call_id": "t", "content": "[tool error] boom"}
