"""Messages client → Bedrock InvokeModel provider: the body goes as the client wrote it
(members in order, every cache_control) in the Invoke envelope, the answer and the
stream come back as Messages, read by the anthropic SDK."""

from __future__ import annotations

import json
from typing import Any

from portcullis.adapters.protocols import anthropic_messages, bedrock_invoke, openai_chat
from portcullis.adapters.protocols.registry import route
from portcullis.adapters.protocols.request import DEFAULT_LIMITS
from portcullis.adapters.protocols.sse import SSEParser, event_of
from portcullis.adapters.protocols.translators import anthropic_messages_to_bedrock_invoke as translator
from portcullis.engine.plan import Target
from tests.anthropic_sdk import sdk_message, sdk_stream_events
from tests.bedrock_streams import ANTHROPIC_EVENTS, TOOL_USE_EVENTS, converted, unwrapped

MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
TARGET = Target("claude-sonnet-4-5", "bedrock-usw2", MODEL, "us-west-2", 1, 200000, 64000, ("tools", "streaming"))
METRICS = {"inputTokenCount": 12, "outputTokenCount": 7, "invocationLatency": 420, "firstByteLatency": 80}

CLIENT_BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "system": [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Zürich — 東京", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ],
    "stream": True,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
    "tools": [{"name": "read", "description": "reads", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
    "thinking": {"type": "enabled", "budget_tokens": 512},
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    "metadata": {"user_id": "u-1"},
}


def _compact(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def _sent(body: dict[str, Any], headers: dict[str, str] | None = None, cap_output: bool = False) -> bytes:
    request = anthropic_messages.PROTOCOL.wire.parse(_compact(body), headers or {}, "", DEFAULT_LIMITS)
    return route("anthropic_messages", "bedrock_invoke").upstream_body(request, TARGET, cap_output)


def test_the_body_is_the_clients_byte_for_byte_in_the_invoke_envelope() -> None:
    rest = {name: value for name, value in CLIENT_BODY.items() if name not in ("model", "stream")}
    assert _sent(CLIENT_BODY) == b'{"anthropic_version":"bedrock-2023-05-31",' + _compact(rest)[1:]
    out = translator.convert_request(CLIENT_BODY, TARGET, True)
    assert list(out) == ["anthropic_version", "max_tokens", "system", "messages", "tools", "thinking", "context_management", "metadata"]
    assert [block["cache_control"] for block in out["system"]] == [{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}]
    assert out["tools"][0]["cache_control"] == {"type": "ephemeral"} and out["messages"] is CLIENT_BODY["messages"]


def test_what_is_sent_is_an_invoke_body_bedrocks_parser_accepts() -> None:
    sent = _sent(CLIENT_BODY)
    request = bedrock_invoke.PROTOCOL.wire.parse(sent, {}, "", DEFAULT_LIMITS, {"model": MODEL, "action": "invoke-with-response-stream"})
    assert request.model == MODEL and request.stream and request.body["system"] == CLIENT_BODY["system"]
    assert bedrock_invoke.PROTOCOL.wire.upstream_path(TARGET.model, True) == "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"


def test_the_anthropic_beta_header_becomes_the_body_list_bedrock_reads() -> None:
    sent = json.loads(_sent(CLIENT_BODY, {"anthropic-beta": "interleaved-thinking-2025-05-14, context-management-2025-06-27,"}))
    assert sent["anthropic_beta"] == ["interleaved-thinking-2025-05-14", "context-management-2025-06-27"] and list(sent)[-1] == "anthropic_beta"
    assert "anthropic_beta" not in json.loads(_sent(CLIENT_BODY))
    assert bedrock_invoke.PROTOCOL.wire.upstream_headers(None, {"anthropic-beta": "x"}) == {"content-type": "application/json", "accept": "application/json"}


def test_the_output_cap_lands_in_max_tokens() -> None:
    assert json.loads(_sent({**CLIENT_BODY, "max_tokens": 100000}, cap_output=True))["max_tokens"] == 64000


def test_a_chat_client_reaches_invoke_through_messages() -> None:
    chat = {"model": "claude", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 10}
    request = openai_chat.PROTOCOL.wire.parse(_compact(chat), {}, "", DEFAULT_LIMITS)
    sent = json.loads(route("openai_chat", "bedrock_invoke").upstream_body(request, TARGET, cap_output=False))
    assert sent == {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "system": [{"type": "text", "text": "be brief"}],
    }


def test_the_answer_is_bedrocks_without_its_metrics() -> None:
    answer = {
        "id": "msg_bdrk_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
        "amazon-bedrock-invocationMetrics": METRICS,
    }
    converted = translator.convert_response(answer, 0)
    assert list(converted) == list(answer)[:-1]
    message = sdk_message(converted)
    assert message.content[0].text == "Hello" and message.usage.output_tokens == 1


def _translated(events: list[dict[str, Any]]) -> bytes:
    """The Messages stream a Bedrock stream of ``events`` (in chunk frames) becomes."""
    return converted(translator.StreamConverter(True, 0), unwrapped(events))


def test_the_stream_is_the_unwrapped_events_as_server_sent_events() -> None:
    stop = {"type": "message_stop", "amazon-bedrock-invocationMetrics": METRICS}
    raw = _translated([*ANTHROPIC_EVENTS[:-1], stop])
    events = SSEParser().feed(raw)
    assert [(e.event, json.loads(e.data)) for e in events] == [(e["type"], e) for e in ANTHROPIC_EVENTS]
    sdk_events, message = sdk_stream_events(raw)
    assert [e.type for e in sdk_events if e.type == "text"] == ["text", "text"]
    assert message.content[0].text == "Hello" and message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens, message.usage.cache_read_input_tokens) == (12, 7, 4)


def test_an_event_a_guard_rewrote_goes_out_as_its_new_text() -> None:
    converter = translator.StreamConverter(True, 0)
    rewritten = event_of({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "[redacted]"}}, "content_block_delta")
    assert converter.feed(rewritten) == [
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"[redacted]"}}\n\n'
    ]


def test_a_tool_use_stream_reaches_the_sdk_whole() -> None:
    tool = [*TOOL_USE_EVENTS[:-1], {"type": "message_stop", "amazon-bedrock-invocationMetrics": METRICS}]
    _, message = sdk_stream_events(_translated(tool))
    assert message.stop_reason == "tool_use" and message.content[0].input == {"path": "/tmp/a"}
