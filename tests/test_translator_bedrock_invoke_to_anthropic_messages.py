"""Bedrock InvokeModel client → Anthropic provider: the Invoke body becomes a Messages
body (the target's model, ``stream`` when the path asked for one, the beta list as the
``anthropic-beta`` header), the answer goes back as Anthropic wrote it and the stream in
``chunk`` frames that boto3 and ``anthropic.AnthropicBedrock`` read, the last one with
Bedrock's invocation metrics."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

import anthropic
import httpx2
import pytest

from portcullis.adapters.protocols import anthropic_messages, bedrock_invoke
from portcullis.adapters.protocols.registry import route
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, ParsedRequest
from portcullis.adapters.protocols.sse import SSEParser, encode
from portcullis.adapters.protocols.translators import bedrock_invoke_to_anthropic_messages as translator
from portcullis.engine.plan import Target
from tests.anthropic_sdk import bedrock_sdk_stream
from tests.bedrock_streams import ANTHROPIC_EVENTS, TOOL_USE_EVENTS, converted
from tests.botocore_bedrock import boto3_invoke_events, boto3_invoke_stream

TARGET = Target("claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5-20250929", "us-east-1", 3, 200000, 64000, ("tools", "streaming"))
PATH_MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"

CLIENT_BODY: dict[str, Any] = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 1024,
    "system": [{"type": "text", "text": "Zürich — 東京", "cache_control": {"type": "ephemeral"}}],
    "anthropic_beta": ["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}],
    "temperature": 0.2,
}


def _compact(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def _request(body: dict[str, Any], stream: bool) -> ParsedRequest:
    action = "invoke-with-response-stream" if stream else "invoke"
    return bedrock_invoke.PROTOCOL.wire.parse(_compact(body), {"anthropic-beta": "from-a-header"}, "", DEFAULT_LIMITS, {"model": PATH_MODEL, "action": action})


@pytest.mark.parametrize("stream", [False, True])
def test_the_body_is_the_clients_with_the_targets_model(stream: bool) -> None:
    sent = route("bedrock_invoke", "anthropic_messages").upstream_body(_request(CLIENT_BODY, stream), TARGET, cap_output=False)
    rest = {name: value for name, value in CLIENT_BODY.items() if name not in ("anthropic_version", "anthropic_beta")}
    expected = _compact({"model": TARGET.model, **rest, **({"stream": True} if stream else {})})
    assert sent == expected  # members in the client's order, cache_control as sent
    accepted = anthropic_messages.PROTOCOL.wire.parse(sent, {}, "", DEFAULT_LIMITS)
    assert accepted.stream is stream and accepted.model == TARGET.model


def test_the_beta_list_goes_to_anthropic_as_its_header_and_nothing_else_of_the_client() -> None:
    request = _request(CLIENT_BODY, stream=False)
    headers = anthropic_messages.PROTOCOL.wire.upstream_headers("sk-provider", request.forward_headers)
    assert headers["anthropic-beta"] == "interleaved-thinking-2025-05-14,context-1m-2025-08-07"
    assert headers["x-api-key"] == "sk-provider" and headers["anthropic-version"] == "2023-06-01"
    without = _request({k: v for k, v in CLIENT_BODY.items() if k != "anthropic_beta"}, stream=False)
    assert "anthropic-beta" not in anthropic_messages.PROTOCOL.wire.upstream_headers("sk", without.forward_headers)


def test_the_output_cap_lands_in_max_tokens() -> None:
    body = {**CLIENT_BODY, "max_tokens": 100000}
    sent = route("bedrock_invoke", "anthropic_messages").upstream_body(_request(body, True), TARGET, cap_output=True)
    assert json.loads(sent)["max_tokens"] == 64000


def _bedrock_client(status: int, content: bytes, content_type: str, seen: list[httpx2.Request]) -> anthropic.AnthropicBedrock:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(status, content=content, headers={"content-type": content_type})

    return anthropic.AnthropicBedrock(
        aws_access_key="AKIDEXAMPLE",
        aws_secret_key="secret",
        aws_region="us-east-1",
        base_url="http://fake",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )


def test_the_answer_is_anthropics_as_anthropic_bedrock_reads_it() -> None:
    answer = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": TARGET.model,
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    converted = translator.convert_response(answer, 0)
    assert converted == answer
    seen: list[httpx2.Request] = []
    client = _bedrock_client(200, json.dumps(converted).encode(), "application/json", seen)
    message = client.messages.create(model=PATH_MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}], extra_headers={"anthropic-beta": "b-1,b-2"})
    assert message.content[0].text == "Hello" and message.usage.input_tokens == 3
    # what the SDK sent is what the ingress parser reads
    sent = seen[0]
    model, action = sent.url.path.removeprefix("/model/").split("/")
    parsed = bedrock_invoke.PROTOCOL.wire.parse(sent.content, dict(sent.headers), "", DEFAULT_LIMITS, {"model": unquote(model), "action": action})
    assert (parsed.model, parsed.stream, parsed.body["anthropic_beta"]) == (PATH_MODEL, False, ["b-1", "b-2"])
    assert parsed.forward_headers == {"anthropic-beta": "b-1,b-2"}  # from the body: the SDK's own header is not forwarded


def _sse(events: list[dict[str, Any]], ping: bool = True) -> list[bytes]:
    out = [encode(event, event["type"]) for event in events]
    return [out[0], encode({"type": "ping"}, "ping"), *out[1:]] if ping else out


def _translated(upstream: list[bytes]) -> bytes:
    return converted(translator.StreamConverter(True, 0), SSEParser().feed(b"".join(upstream)))


def test_the_stream_is_chunk_frames_boto3_reads_with_the_metrics_last() -> None:
    raw = _translated(_sse(ANTHROPIC_EVENTS))
    parts = boto3_invoke_stream(raw)  # botocore checks each frame's CRCs
    assert all(set(part) == {"chunk"} for part in parts)
    events = boto3_invoke_events(raw)
    assert [e["type"] for e in events] == [e["type"] for e in ANTHROPIC_EVENTS]  # Bedrock sends no ping
    assert events[:-1] == ANTHROPIC_EVENTS[:-1]
    assert events[-1] == {
        "type": "message_stop",
        "amazon-bedrock-invocationMetrics": {"inputTokenCount": 12, "outputTokenCount": 7, "cacheReadInputTokenCount": 4},
    }


def test_the_stream_is_what_anthropic_bedrock_streams() -> None:
    raw = _translated(_sse(ANTHROPIC_EVENTS))
    events, message = bedrock_sdk_stream(raw)
    assert "".join(e.text for e in events if e.type == "text") == "Hello"
    assert message.content[0].text == "Hello" and message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 7)


def test_a_tool_use_stream_reaches_anthropic_bedrock_whole() -> None:
    _, message = bedrock_sdk_stream(_translated(_sse(TOOL_USE_EVENTS, ping=False)))
    assert message.stop_reason == "tool_use" and message.content[0].input == {"path": "/tmp/a"} and message.usage.output_tokens == 9


def test_a_boto3_client_reaches_a_chat_provider_through_messages() -> None:
    served = route("bedrock_invoke", "openai_chat")
    sent = json.loads(served.upstream_body(_request(CLIENT_BODY, stream=True), TARGET, cap_output=False))
    assert sent["model"] == TARGET.model and sent["stream"] is True and sent["messages"][-1]["role"] == "user"
    assert "anthropic_version" not in sent and "anthropic_beta" not in sent

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return encode({"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    upstream = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        encode({"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        b"data: [DONE]\n\n",
    ]
    converter = served.stream_converter(_request(CLIENT_BODY, stream=True), 0)
    out = [c for event in SSEParser().feed(b"".join(upstream)) for c in converter.feed(event)]
    raw = b"".join(out + converter.finish())
    events = boto3_invoke_events(raw)
    assert events[-1]["amazon-bedrock-invocationMetrics"] == {"inputTokenCount": 7, "outputTokenCount": 3}
    _, message = bedrock_sdk_stream(raw)
    assert message.content[0].text == "Hello" and message.usage.output_tokens == 3
