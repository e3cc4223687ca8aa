"""Messages client → Converse provider: the translator on its own. Converted requests
are judged by botocore's validator, answers and streams by the ``anthropic`` SDK."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletionChunk

from portcullis.adapters.protocols.eventstream import event_frame
from portcullis.adapters.protocols.sse import SSE_FRAMING, SSEParser
from portcullis.adapters.protocols.translators import anthropic_messages_to_bedrock_converse as translator
from portcullis.adapters.protocols.translators import bedrock_converse_to_anthropic_messages as back
from portcullis.adapters.protocols.translators import openai_chat_to_anthropic_messages
from portcullis.adapters.protocols.translators.composed import Composed
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.plan import Target
from tests.anthropic_sdk import sdk_message, sdk_stream
from tests.bedrock_streams import converse_events, converted
from tests.botocore_bedrock import assert_valid_converse_request

TARGET = Target("claude-sonnet-4-5", "bedrock", "anthropic.claude-sonnet-4-5-20250929-v1:0", "us-east-1", 1, 200000, 64000, ("tools",))
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
PDF = base64.b64encode(b"%PDF-1.4").decode()
TOOL = {"name": "weather", "description": "Weather for a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def convert(stream: bool = False, **body: Any) -> dict[str, Any]:
    document = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **body}
    out = translator.convert_request(document, TARGET, stream)
    assert_valid_converse_request(out, stream)
    return out


def test_system_sampling_and_model_fields_without_model_or_stream() -> None:
    out = convert(
        stream=True,
        system=[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "1h"}}, {"type": "text", "text": "b"}],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END"],
        thinking={"type": "enabled", "budget_tokens": 2048},
        metadata={"user_id": "u-1"},
    )
    assert out == {
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "system": [{"text": "a"}, {"cachePoint": {"type": "default", "ttl": "1h"}}, {"text": "b"}],
        "inferenceConfig": {"maxTokens": 10, "temperature": 0.5, "topP": 0.9, "stopSequences": ["END"]},
        "additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 2048}, "top_k": 40},
    }
    assert convert(system="s", thinking={"type": "disabled"}) == {
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "system": [{"text": "s"}],
        "inferenceConfig": {"maxTokens": 10},
    }


def test_conversation_with_media_tools_results_and_reasoning() -> None:
    out = convert(
        tools=[{**TOOL, "cache_control": {"type": "ephemeral"}}],
        tool_choice={"type": "any"},
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}, "title": "Q3 report (draft)"},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain é"}, "context": "notes"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should call it", "signature": "sig=="},
                    {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "late", "cache_control": {"type": "ephemeral"}}],
                        "is_error": True,
                    },
                ],
            },
        ],
    )
    assert out["toolConfig"] == {
        "tools": [
            {"toolSpec": {"name": "weather", "inputSchema": {"json": TOOL["input_schema"]}, "description": "Weather for a city"}},
            {"cachePoint": {"type": "default"}},
        ],
        "toolChoice": {"any": {}},
    }
    assert out["messages"] == [
        {
            "role": "user",
            "content": [
                {"text": "look"},
                {"cachePoint": {"type": "default"}},
                {"image": {"format": "png", "source": {"bytes": PNG}}},
                {"document": {"format": "pdf", "source": {"bytes": PDF}, "name": "Q3 report (draft)"}},
                {"document": {"format": "txt", "source": {"bytes": base64.b64encode("plain é".encode()).decode()}, "name": "document-2", "context": "notes"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "I should call it", "signature": "sig=="}}},
                {"reasoningContent": {"redactedContent": "ZW5jcnlwdGVk"}},
                {"toolUse": {"toolUseId": "toolu_1", "name": "weather", "input": {"city": "Paris"}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "toolu_1", "content": [{"text": "sunny"}]}},
                {"toolResult": {"toolUseId": "toolu_1", "content": [{"text": "late"}], "status": "error"}},
                {"cachePoint": {"type": "default"}},  # Converse has no marker inside a result: it follows the result
            ],
        },
    ]


def test_consecutive_turns_of_one_role_become_one() -> None:
    out = convert(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "b"}]}])
    assert out["messages"] == [{"role": "user", "content": [{"text": "a"}, {"text": "b"}]}]


def test_tool_choice() -> None:
    bare = {"name": "f", "input_schema": {"type": "object"}, "strict": True}
    assert convert(tools=[bare])["toolConfig"] == {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object"}}, "strict": True}}]}
    assert convert(tools=[TOOL], tool_choice={"type": "auto"})["toolConfig"]["toolChoice"] == {"auto": {}}
    assert convert(tools=[TOOL], tool_choice={"type": "tool", "name": "weather"})["toolConfig"]["toolChoice"] == {"tool": {"name": "weather"}}
    assert "toolConfig" not in convert(tools=[TOOL], tool_choice={"type": "none"})  # Converse forbids calls by offering no tools
    assert "toolConfig" not in convert(tool_choice={"type": "auto"})


HISTORY = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
]


def _blocks(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(blocks)}]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"service_tier": "auto"}, "service_tier"),
        ({"container": "c"}, "container"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"top_k": -1}, "top_k"),
        ({"temperature": 2}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"system": [{"type": "image"}]}, "system[0]"),
        ({"system": [{"type": "text", "text": "a", "cache_control": {"type": "persistent"}}]}, "system[0].cache_control"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        (_blocks({"type": "image", "source": {"type": "url", "url": "https://x/i.png"}}), "messages[0].content[0].source"),
        (_blocks({"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA"}}), "messages[0].content[0].source.media_type"),
        (_blocks({"type": "document", "source": {"type": "url", "url": "https://x/d.pdf"}}), "messages[0].content[0].source"),
        (_blocks({"type": "document", "source": {"type": "base64", "media_type": "text/html", "data": "AA"}}), "messages[0].content[0].source"),
        (
            _blocks({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}, "title": "a.pdf"}),
            "messages[0].content[0].title",
        ),
        (_blocks({"type": "search_result", "source": "s", "title": "t", "content": []}), "messages[0].content[0]"),
        (_blocks({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "search_result"}]}), "messages[0].content[0].content[0]"),
        ({"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "not base64!"}]}]}, "messages[0].content[0].data"),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
        ({"tools": [{**TOOL, "input_examples": [{}]}]}, "tools[0].input_examples"),
        ({"tools": [{**TOOL, "name": "n" * 65}]}, "tools[0].name"),
        ({"tools": [TOOL], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}, "tool_choice.disable_parallel_tool_use"),
        ({"tools": [TOOL], "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"messages": HISTORY}, "tools"),
        ({"messages": HISTORY, "tools": [TOOL], "tool_choice": {"type": "none"}}, "tool_choice"),
    ],
)
def test_refusals_name_their_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(GatewayError) as refused:
        convert(**body)
    assert refused.value.message.startswith(field + ":") and refused.value.kind is ErrorKind.INVALID_REQUEST


def test_a_messages_request_through_converse_and_back_keeps_its_meaning() -> None:
    request = {
        "model": "m",
        "max_tokens": 300,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "tools": [TOOL],
        "tool_choice": {"type": "tool", "name": "weather"},
        "temperature": 0.2,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": PNG}},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "checking"}, {"type": "tool_use", "id": "toolu_9", "name": "weather", "input": {"city": "Oslo"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": [{"type": "text", "text": "-3C"}], "is_error": True}]},
        ],
    }
    converse = translator.convert_request(request, TARGET, stream=False)
    assert_valid_converse_request(converse)
    again = back.convert_request(converse, TARGET, stream=True)
    assert again == {**request, "model": TARGET.model, "stream": True}


# --- answers ------------------------------------------------------------------------


def test_answer_with_reasoning_text_and_tool_call() -> None:
    answer = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {"reasoningContent": {"reasoningText": {"text": "think", "signature": "c2ln"}}},
                    {"reasoningContent": {"redactedContent": "ZW5j"}},
                    {"text": "Calling."},
                    {"toolUse": {"toolUseId": "tooluse_a1", "name": "weather", "input": {"city": "Rome"}}},
                ],
            }
        },
        "stopReason": "tool_use",
        "usage": {"inputTokens": 30, "outputTokens": 8, "totalTokens": 118, "cacheReadInputTokens": 70, "cacheWriteInputTokens": 10},
        "metrics": {"latencyMs": 412},
    }
    message = sdk_message(translator.convert_response(answer, created=1))
    assert message.id.startswith("msg_bdrk_") and message.stop_reason == "tool_use" and message.stop_sequence is None
    assert [block.type for block in message.content] == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert message.content[0].thinking == "think" and message.content[0].signature == "c2ln" and message.content[1].data == "ZW5j"
    assert (message.content[3].id, message.content[3].name, message.content[3].input) == ("tooluse_a1", "weather", {"city": "Rome"})
    usage = message.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (30, 8, 70, 10)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("end_turn", "end_turn"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("guardrail_intervened", "refusal"),
        ("content_filtered", "refusal"),
    ],
)
def test_answer_stop_reasons(reason: str, expected: str) -> None:
    answer = {"output": {"message": {"role": "assistant", "content": [{"text": "x"}]}}, "stopReason": reason, "usage": {}, "metrics": {"latencyMs": 1}}
    assert sdk_message(translator.convert_response(answer, 1)).stop_reason == expected


def test_untranslatable_answers_are_upstream_errors() -> None:
    malformed = {"output": {"message": {"role": "assistant", "content": []}}, "stopReason": "malformed_tool_use", "usage": {}, "metrics": {"latencyMs": 1}}
    with pytest.raises(GatewayError, match="malformed") as failed:
        translator.convert_response(malformed, 1)
    assert failed.value.kind is ErrorKind.UPSTREAM
    video = {**malformed, "stopReason": "end_turn", "output": {"message": {"role": "assistant", "content": [{"video": {}}]}}}
    with pytest.raises(GatewayError, match="cannot express"):
        translator.convert_response(video, 1)


# --- streams ------------------------------------------------------------------------


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return event_frame("contentBlockDelta", {"delta": delta, "contentBlockIndex": index})


def test_stream_of_reasoning_text_and_a_tool_call_accumulates_in_the_sdk() -> None:
    frames = [
        event_frame("messageStart", {"role": "assistant"}),
        _delta(0, {"reasoningContent": {"text": "let me "}}),
        _delta(0, {"reasoningContent": {"text": "see"}}),
        _delta(0, {"reasoningContent": {"signature": "c2ln"}}),
        event_frame("contentBlockStop", {"contentBlockIndex": 0}),
        _delta(1, {"text": "Hello "}),
        _delta(1, {"text": "there"}),
        event_frame("contentBlockStop", {"contentBlockIndex": 1}),
        event_frame("contentBlockStart", {"start": {"toolUse": {"toolUseId": "tooluse_x", "name": "weather"}}, "contentBlockIndex": 2}),
        _delta(2, {"toolUse": {"input": '{"city":'}}),
        _delta(2, {"toolUse": {"input": ' "Paris"}'}}),
        event_frame("contentBlockStop", {"contentBlockIndex": 2}),
        event_frame("messageStop", {"stopReason": "tool_use"}),
        event_frame("metadata", {"usage": {"inputTokens": 40, "outputTokens": 9, "totalTokens": 51, "cacheReadInputTokens": 2}, "metrics": {"latencyMs": 300}}),
    ]
    kinds, message = sdk_stream(converted(translator.StreamConverter(True, 1), converse_events(frames)))
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == 3 == kinds.count("content_block_stop")
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == "let me see" and message.content[0].signature == "c2ln"
    assert message.content[1].text == "Hello there"
    assert (message.content[2].id, message.content[2].name, message.content[2].input) == ("tooluse_x", "weather", {"city": "Paris"})
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens, message.usage.cache_read_input_tokens) == (40, 9, 2)


def test_stream_numbers_blocks_from_zero_and_ends_without_metadata() -> None:
    frames = [
        event_frame("messageStart", {"role": "assistant"}),
        _delta(3, {"reasoningContent": {"redactedContent": "ZW5j"}}),
        event_frame("contentBlockStop", {"contentBlockIndex": 3}),
        _delta(5, {"text": "no"}),
        event_frame("messageStop", {"stopReason": "guardrail_intervened"}),
    ]
    kinds, message = sdk_stream(converted(translator.StreamConverter(True, 1), converse_events(frames)))
    assert [block.type for block in message.content] == ["redacted_thinking", "text"] and message.content[0].data == "ZW5j"
    assert message.content[1].text == "no" and message.stop_reason == "refusal" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == 2 == kinds.count("content_block_stop")


def test_tool_input_for_a_call_never_started_is_an_upstream_error() -> None:
    converter = translator.StreamConverter(True, 1)
    with pytest.raises(GatewayError, match="never started"):
        for event in converse_events([event_frame("messageStart", {"role": "assistant"}), _delta(0, {"toolUse": {"input": "{}"}})]):
            converter.feed(event)


def test_a_chat_client_composes_through_messages_to_converse() -> None:
    composed = Composed(openai_chat_to_anthropic_messages, translator, SSE_FRAMING)
    chat = {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], "max_tokens": 7, "stream": True}
    body = composed.convert_request(chat, TARGET, stream=True)
    assert_valid_converse_request(body, stream=True)
    assert body == {"messages": [{"role": "user", "content": [{"text": "hi"}]}], "system": [{"text": "s"}], "inferenceConfig": {"maxTokens": 7}}
    frames = [
        event_frame("messageStart", {"role": "assistant"}),
        _delta(0, {"text": "Hel"}),
        _delta(0, {"text": "lo"}),
        event_frame("contentBlockStop", {"contentBlockIndex": 0}),
        event_frame("messageStop", {"stopReason": "max_tokens"}),
        event_frame("metadata", {"usage": {"inputTokens": 4, "outputTokens": 2, "totalTokens": 6}, "metrics": {"latencyMs": 9}}),
    ]
    chunks = [
        json.loads(event.data) for event in SSEParser().feed(converted(composed.StreamConverter(True, 1), converse_events(frames))) if event.data != "[DONE]"
    ]
    ChatCompletionChunk.model_validate(chunks[0])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Hello"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length" and chunks[-1]["usage"]["total_tokens"] == 6
