"""Chat client → Messages provider: the translator on its own."""

from __future__ import annotations

import json

import pytest

from portcullis.adapters.protocols.sse import SSEParser, encode
from portcullis.adapters.protocols.translators import openai_chat_to_anthropic_messages as translator
from portcullis.engine.errors import GatewayError
from portcullis.engine.plan import Target

TARGET = Target("claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5-20250929", "us-east-1", 1, 200000, 64000, ("tools",))


def convert(**body) -> dict:
    document = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return translator.convert_request(document, TARGET, bool(document.get("stream")))


def test_defaults_and_sampling() -> None:
    out = convert(temperature=0.5, top_p=1, user="u-1", n=1, presence_penalty=0)
    assert out["model"] == TARGET.model and out["max_tokens"] == 64000  # the target's ceiling when the client sets none
    assert out["temperature"] == 0.5 and out["metadata"] == {"user_id": "u-1"}


def test_system_and_developer_messages_lead_the_conversation_only() -> None:
    out = convert(
        messages=[{"role": "developer", "content": [{"type": "text", "text": "a"}]}, {"role": "system", "content": "b"}, {"role": "user", "content": "c"}]
    )
    assert out["system"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    with pytest.raises(GatewayError, match="after the conversation started"):
        convert(messages=[{"role": "user", "content": "c"}, {"role": "system", "content": "late"}])


def test_images() -> None:
    out = convert(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                ],
            }
        ]
    )
    assert out["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
    ]


def test_parallel_tool_calls_off_and_named_tool_choice() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert convert(tools=tools, parallel_tool_calls=False)["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert convert(tools=tools, tool_choice={"type": "function", "function": {"name": "f"}})["tool_choice"] == {"type": "tool", "name": "f"}
    assert convert(tools=tools)["tools"] == [{"name": "f", "input_schema": {"type": "object", "properties": {}}}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"temperature": 1.5}, "temperature"),
        ({"seed": 1}, "seed: cannot be converted"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input_audio"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]},
            "not valid JSON",
        ),
        ({"tools": [{"type": "custom", "custom": {}}]}, "only function tools"),
        ({"messages": [{"role": "function", "content": "x"}]}, "role"),
    ],
)
def test_refusals(body: dict, message: str) -> None:
    with pytest.raises(GatewayError, match=message):
        convert(**body)


def test_response_usage_counts_cached_input_once() -> None:
    message = {
        "id": "msg_1",
        "model": "m",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20},
    }
    completion = translator.convert_response(message, created=1)
    assert completion["choices"][0]["message"]["content"] == "ab" and completion["choices"][0]["finish_reason"] == "length"
    assert completion["usage"] == {"prompt_tokens": 130, "completion_tokens": 5, "total_tokens": 135, "prompt_tokens_details": {"cached_tokens": 100}}


def test_stream_ignores_thinking_and_ends_with_done() -> None:
    events = [
        encode({"type": "message_start", "message": {"id": "msg_1", "model": "m", "usage": {"input_tokens": 3}}}, "message_start"),
        encode({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}, "content_block_start"),
        encode({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}, "content_block_delta"),
        encode({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}, "content_block_start"),
        encode({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "ok"}}, "content_block_delta"),
        encode({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}, "message_delta"),
        encode({"type": "message_stop"}, "message_stop"),
    ]
    converter = translator.StreamConverter(include_usage=True, created=1)
    out = b"".join(b"".join(converter.feed(e)) for e in SSEParser().feed(b"".join(events)))
    chunks = [json.loads(e.data) for e in SSEParser().feed(out) if e.data != "[DONE]"]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "ok"
    assert chunks[-1]["usage"]["prompt_tokens"] == 3 and chunks[-1]["usage"]["completion_tokens"] == 2
    assert out.endswith(b"data: [DONE]\n\n")


def test_context_window_stop_reads_as_length() -> None:
    message = {"id": "m", "model": "m", "content": [{"type": "text", "text": "a"}], "stop_reason": "model_context_window_exceeded", "usage": {}}
    assert translator.convert_response(message, created=1)["choices"][0]["finish_reason"] == "length"
