"""Converse client → Messages provider: the translator on its own. Requests are the
bodies boto3 serializes; converted answers and event streams are read by botocore's
own parsers for ``converse`` and ``converse_stream``."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from anthropic.types import Message
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from pydantic import TypeAdapter

from portcullis.adapters.protocols.sse import event_of as sse_event
from portcullis.adapters.protocols.translators import anthropic_messages_to_bedrock_converse as back
from portcullis.adapters.protocols.translators import bedrock_converse_to_anthropic_messages as translator
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.plan import Target
from tests.anthropic_sdk import sdk_message, sdk_stream
from tests.bedrock_streams import converse_events, converted
from tests.botocore_bedrock import MODEL_ID, boto3_body, boto3_converse, boto3_converse_stream

TARGET = Target("claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5-20250929", "us-east-1", 1, 200000, 64000, ("tools",))
PNG = b"\x89PNG\r\n\x1a\n"
PDF = b"%PDF-1.4"
SPEC = {"name": "weather", "description": "Weather for a city", "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}}}}
_PARAMS = TypeAdapter(MessageCreateParamsStreaming)


def convert(params: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    body = json.loads(boto3_body({"modelId": MODEL_ID, "messages": [{"role": "user", "content": [{"text": "hi"}]}], **params}, stream)[0])
    out = translator.convert_request(body, TARGET, stream)
    _PARAMS.validate_python({**out, "stream": True})  # the anthropic SDK's own request type
    return out


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_defaults_inference_config_and_model_fields() -> None:
    assert convert({}) == {"model": TARGET.model, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 64000}
    out = convert(
        {
            "system": [{"text": "a"}, {"cachePoint": {"type": "default", "ttl": "1h"}}, {"text": "b"}],
            "inferenceConfig": {"maxTokens": 500, "temperature": 0.3, "topP": 0.8, "stopSequences": ["END"]},
            "additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 1024}, "top_k": 5},
            "requestMetadata": {"team": "search"},
            "performanceConfig": {"latency": "standard"},
        },
        stream=True,
    )
    assert out == {
        "model": TARGET.model,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_tokens": 500,
        "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "1h"}}, {"type": "text", "text": "b"}],
        "temperature": 0.3,
        "top_p": 0.8,
        "stop_sequences": ["END"],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "top_k": 5,
        "stream": True,
    }


def test_conversation_with_media_tools_results_and_reasoning() -> None:
    out = convert(
        {
            "toolConfig": {"tools": [{"toolSpec": SPEC}, {"cachePoint": {"type": "default"}}], "toolChoice": {"tool": {"name": "weather"}}},
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"text": "look"},
                        {"cachePoint": {"type": "default"}},
                        {"image": {"format": "jpeg", "source": {"bytes": PNG}}},
                        {"document": {"format": "pdf", "name": "report", "source": {"bytes": PDF}}},
                        {"document": {"format": "txt", "name": "notes", "source": {"bytes": "plain é".encode()}, "context": "ctx"}},
                        {"document": {"format": "txt", "name": "inline", "source": {"text": "inline text"}}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "c2ln"}}},
                        {"reasoningContent": {"redactedContent": b"secret"}},
                        {"toolUse": {"toolUseId": "tooluse_1", "name": "weather", "input": {"city": "Paris"}}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"toolResult": {"toolUseId": "tooluse_1", "content": [{"json": {"temp": 21}}, {"text": "sunny"}]}},
                        {"toolResult": {"toolUseId": "tooluse_1", "content": [{"image": {"format": "gif", "source": {"bytes": PNG}}}], "status": "error"}},
                    ],
                },
            ],
        }
    )
    assert out["tools"] == [
        {"name": "weather", "input_schema": SPEC["inputSchema"]["json"], "description": "Weather for a city", "cache_control": {"type": "ephemeral"}}
    ]
    assert out["tool_choice"] == {"type": "tool", "name": "weather"}
    assert out["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(PNG)}},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)}, "title": "report"},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain é"}, "title": "notes", "context": "ctx"},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "inline text"}, "title": "inline"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "c2ln"},
                {"type": "redacted_thinking", "data": b64(b"secret")},
                {"type": "tool_use", "id": "tooluse_1", "name": "weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "tooluse_1", "content": [{"type": "text", "text": '{"temp": 21}'}, {"type": "text", "text": "sunny"}]},
                {
                    "type": "tool_result",
                    "tool_use_id": "tooluse_1",
                    "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": b64(PNG)}}],
                    "is_error": True,
                },
            ],
        },
    ]
    auto = convert({"toolConfig": {"tools": [{"toolSpec": SPEC}], "toolChoice": {"any": {}}}})
    assert auto["tool_choice"] == {"type": "any"} and convert({"toolConfig": {"tools": [{"toolSpec": SPEC}]}}).get("tool_choice") is None


def _user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(blocks)}]}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"guardrailConfig": {"guardrailIdentifier": "g", "guardrailVersion": "1"}}, "guardrailConfig"),
        ({"promptVariables": {"x": {"text": "y"}}}, "promptVariables"),
        ({"additionalModelResponseFieldPaths": ["/stop_sequence"]}, "additionalModelResponseFieldPaths"),
        ({"performanceConfig": {"latency": "optimized"}}, "performanceConfig"),
        ({"additionalModelRequestFields": {"anthropic_beta": ["x"]}}, "additionalModelRequestFields.anthropic_beta"),
        ({"additionalModelRequestFields": {"thinking": {"type": "sometimes"}}}, "additionalModelRequestFields.thinking.type"),
        ({"system": [{"guardContent": {"text": {"text": "x"}}}]}, "system[0].guardContent"),
        ({"system": [{"cachePoint": {"type": "default"}}]}, "system[0].cachePoint"),
        (_user({"image": {"format": "png", "source": {"s3Location": {"uri": "s3://b/k"}}}}), "messages[0].content[0].image.source"),
        (_user({"video": {"format": "mp4", "source": {"bytes": b"x"}}}), "messages[0].content[0].video"),
        (_user({"document": {"format": "html", "name": "d", "source": {"bytes": b"<p>"}}}), "messages[0].content[0].document"),
        (_user({"document": {"format": "txt", "name": "d", "source": {"bytes": b"\xff\xfe"}}}), "messages[0].content[0].document.source.bytes"),
        (_user({"guardContent": {"text": {"text": "x"}}}), "messages[0].content[0].guardContent"),
        (
            _user({"toolResult": {"toolUseId": "t", "content": [{"video": {"format": "mp4", "source": {"bytes": b"x"}}}]}}),
            "messages[0].content[0].toolResult.content[0].video",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"reasoningContent": {"reasoningText": {"text": "unsigned"}}}]}]},
            "messages[0].content[0].reasoningContent.reasoningText.signature",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"reasoningContent": {"redactedContent": b"x"}}, {"cachePoint": {"type": "default"}}]}]},
            "messages[0].content[1].cachePoint",
        ),
        ({"toolConfig": {"tools": [{"systemTool": {"name": "nova_grounding"}}]}}, "toolConfig.tools[0].systemTool"),
        ({"toolConfig": {"tools": [{"cachePoint": {"type": "default"}}]}}, "toolConfig.tools[0].cachePoint"),
    ],
)
def test_refusals_name_their_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(GatewayError) as refused:
        convert(params)
    assert refused.value.message.startswith(field + ":") and refused.value.kind is ErrorKind.INVALID_REQUEST


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "user", "content": [{"text": "a"}]}], "inferenceConfig": {"topK": 3}}, "inferenceConfig.topK"),
        ({"messages": [{"role": "user", "content": [{"text": "a", "image": {}}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "system", "content": [{"text": "a"}]}]}, "messages[0].role"),
    ],
)
def test_shapes_boto3_would_not_send_are_refused_too(body: dict[str, Any], field: str) -> None:
    with pytest.raises(GatewayError) as refused:
        translator.convert_request(body, TARGET, False)
    assert refused.value.message.startswith(field + ":")


# --- answers ------------------------------------------------------------------------

ANSWER = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": TARGET.model,
    "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": b64(b"secret")},
        {"type": "text", "text": "Calling.", "citations": None},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Rome"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 30, "output_tokens": 8, "cache_read_input_tokens": 70, "cache_creation_input_tokens": 10},
}


def test_answer_as_boto3_converse_returns_it() -> None:
    Message.model_validate(ANSWER)
    parsed = boto3_converse(translator.convert_response(ANSWER, created=1))
    assert parsed == {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "c2ln"}}},
                    {"reasoningContent": {"redactedContent": b"secret"}},
                    {"text": "Calling."},
                    {"toolUse": {"toolUseId": "toolu_1", "name": "weather", "input": {"city": "Rome"}}},
                ],
            }
        },
        "stopReason": "tool_use",
        "usage": {"inputTokens": 30, "outputTokens": 8, "totalTokens": 118, "cacheReadInputTokens": 70, "cacheWriteInputTokens": 10},
        "metrics": {"latencyMs": 0},
    }


@pytest.mark.parametrize(
    ("reason", "expected"), [("end_turn", "end_turn"), ("max_tokens", "max_tokens"), ("stop_sequence", "stop_sequence"), ("refusal", "content_filtered")]
)
def test_answer_stop_reasons(reason: str, expected: str) -> None:
    assert boto3_converse(translator.convert_response({**ANSWER, "stop_reason": reason}, 1))["stopReason"] == expected


def test_an_answer_through_converse_and_back_keeps_its_content_and_usage() -> None:
    message = sdk_message(back.convert_response(translator.convert_response(ANSWER, 1), 1))
    original = Message.model_validate(ANSWER)
    assert (
        message.content == original.content
        and message.stop_reason == "tool_use"
        and message.usage.model_dump(exclude_none=True)
        == {
            "input_tokens": 30,
            "output_tokens": 8,
            "cache_read_input_tokens": 70,
            "cache_creation_input_tokens": 10,
        }
    )


def test_server_tool_blocks_in_an_answer_are_upstream_errors() -> None:
    answer = {**ANSWER, "content": [{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}]}
    with pytest.raises(GatewayError, match="server_tool_use") as failed:
        translator.convert_response(answer, 1)
    assert failed.value.kind is ErrorKind.UPSTREAM


# --- streams ------------------------------------------------------------------------


def _events(*documents: dict[str, Any]) -> list[Any]:
    return [sse_event(document, document["type"]) for document in documents]


def _message_start() -> dict[str, Any]:
    message = {**ANSWER, "content": [], "stop_reason": None, "usage": {"input_tokens": 40, "output_tokens": 1, "cache_read_input_tokens": 2}}
    return {"type": "message_start", "message": message}


def _block(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def test_stream_as_boto3_converse_stream_yields_it() -> None:
    events = _events(
        _message_start(),
        _block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        _delta(0, {"type": "thinking_delta", "thinking": "let me see"}),
        _delta(0, {"type": "signature_delta", "signature": "c2ln"}),
        _stop(0),
        _block(1, {"type": "redacted_thinking", "data": b64(b"secret")}),
        _stop(1),
        _block(2, {"type": "text", "text": ""}),
        _delta(2, {"type": "text_delta", "text": "Hello"}),
        _stop(2),
        _block(3, {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}}),
        _delta(3, {"type": "input_json_delta", "partial_json": '{"city":'}),
        _delta(3, {"type": "input_json_delta", "partial_json": ' "Oslo"}'}),
        _stop(3),
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 12}},
        {"type": "message_stop"},
    )
    events.insert(1, sse_event({"type": "ping"}, "ping"))
    parsed = boto3_converse_stream(converted(translator.StreamConverter(True, 1), events))
    latency = parsed[-1]["metadata"]["metrics"]["latencyMs"]
    assert isinstance(latency, int) and latency >= 0
    assert parsed == [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"delta": {"reasoningContent": {"text": "let me see"}}, "contentBlockIndex": 0}},
        {"contentBlockDelta": {"delta": {"reasoningContent": {"signature": "c2ln"}}, "contentBlockIndex": 0}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"contentBlockDelta": {"delta": {"reasoningContent": {"redactedContent": b"secret"}}, "contentBlockIndex": 1}},
        {"contentBlockStop": {"contentBlockIndex": 1}},
        {"contentBlockDelta": {"delta": {"text": "Hello"}, "contentBlockIndex": 2}},
        {"contentBlockStop": {"contentBlockIndex": 2}},
        {"contentBlockStart": {"start": {"toolUse": {"toolUseId": "toolu_2", "name": "weather"}}, "contentBlockIndex": 3}},
        {"contentBlockDelta": {"delta": {"toolUse": {"input": '{"city":'}}, "contentBlockIndex": 3}},
        {"contentBlockDelta": {"delta": {"toolUse": {"input": ' "Oslo"}'}}, "contentBlockIndex": 3}},
        {"contentBlockStop": {"contentBlockIndex": 3}},
        {"messageStop": {"stopReason": "tool_use"}},
        {
            "metadata": {
                "usage": {"inputTokens": 40, "outputTokens": 12, "totalTokens": 54, "cacheReadInputTokens": 2, "cacheWriteInputTokens": 0},
                "metrics": {"latencyMs": latency},
            }
        },
    ]


def test_stream_through_converse_and_back_accumulates_in_the_anthropic_sdk() -> None:
    events = _events(
        _message_start(),
        _block(0, {"type": "text", "text": ""}),
        _delta(0, {"type": "text_delta", "text": "Hi "}),
        _delta(0, {"type": "text_delta", "text": "there"}),
        _stop(0),
        {"type": "message_delta", "delta": {"stop_reason": "refusal", "stop_sequence": None}, "usage": {"output_tokens": 3}},
        {"type": "message_stop"},
    )
    frames = converted(translator.StreamConverter(True, 1), events)
    _, message = sdk_stream(converted(back.StreamConverter(True, 1), converse_events([frames])))
    assert message.content[0].type == "text" and message.content[0].text == "Hi there"
    assert message.stop_reason == "refusal" and message.usage.input_tokens == 40 and message.usage.output_tokens == 3


def test_server_tool_blocks_in_a_stream_are_upstream_errors() -> None:
    converter = translator.StreamConverter(True, 1)
    converter.feed(_events(_message_start())[0])
    with pytest.raises(GatewayError, match="web_search_tool_result"):
        converter.feed(_events(_block(0, {"type": "web_search_tool_result", "tool_use_id": "s", "content": []}))[0])
