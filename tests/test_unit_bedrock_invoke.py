"""Bedrock InvokeModel for Anthropic models, the protocol on its own: the path names the
model and the stream, the envelope is checked as Bedrock checks it (a refusal names the
member), the rest is a Messages body; the Messages surfaces and tool calls read Invoke
bodies and unwrapped stream events; usage comes from the answer or Bedrock's invocation
metrics; errors are what boto3 reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import EventStreamError as BotoEventStreamError

from portcullis.adapters.protocols.anthropic_messages import wire as messages_wire
from portcullis.adapters.protocols.bedrock_invoke import PROTOCOL, wire
from portcullis.adapters.protocols.eventstream import INVOKE_FRAMING, exception_frame
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, ParsedRequest
from portcullis.adapters.protocols.text import ToolCall
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pricing import Usage
from tests.bedrock_streams import ANTHROPIC_EVENTS, TOOL_USE_EVENTS, chunk_frames, unwrapped
from tests.botocore_bedrock import boto3_error, boto3_invoke_events, boto3_invoke_stream

MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-20250929-v1:0"
BODY = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


def parse(body: Any = None, model: str = MODEL, action: str = "invoke", headers: dict[str, str] | None = None) -> ParsedRequest:
    raw = body if isinstance(body, bytes) else json.dumps(BODY if body is None else body).encode()
    return wire.parse(raw, headers or {}, "", DEFAULT_LIMITS, {"model": model, "action": action})


def refusal(**kwargs: Any) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse(**kwargs)
    return caught.value


# --- ingress ----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [MODEL, ARN, "us.anthropic.claude-3-7-sonnet-20250219-v1:0"])
def test_the_model_is_the_paths_and_the_stream_its_action(model: str) -> None:
    request = parse(model=model)
    assert (request.protocol, request.model, request.stream, request.max_tokens) == ("bedrock_invoke", model, False, 50)
    streamed = parse(model=model, action="invoke-with-response-stream")
    assert streamed.stream and "streaming" in streamed.requires


@pytest.mark.parametrize(
    ("model", "says"),
    [("", "modelId: the path names no model"), ("m" * 2049, "modelId: longer than 2048"), ("anthropic.claude\n", "modelId: contains characters")],
)
def test_a_path_without_a_usable_model_is_refused(model: str, says: str) -> None:
    error = refusal(model=model)
    assert error.kind is ErrorKind.INVALID_REQUEST and says in error.message
    assert parse(model="m" * 2048).model == "m" * 2048


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"model": MODEL}, "model: not permitted in an InvokeModel body"),
        ({"stream": True}, "stream: not permitted in an InvokeModel body"),
        ({"stream": False}, "stream: not permitted"),
        ({"anthropic_version": None}, "anthropic_version: field required"),
        ({"anthropic_version": ""}, "anthropic_version: expected a non-empty string"),
        ({"anthropic_version": 20230531}, "anthropic_version: expected a non-empty string"),
        ({"anthropic_beta": "context-1m-2025-08-07"}, "anthropic_beta: expected an array of strings"),
        ({"anthropic_beta": ["ok-1", "bad\r\nx-injected: 1"]}, "anthropic_beta[1]: expected a beta feature name"),
        ({"anthropic_beta": [7]}, "anthropic_beta[0]: expected a beta feature name"),
    ],
)
def test_the_envelope_is_checked_as_bedrock_checks_it(change: dict[str, Any], says: str) -> None:
    body = {**BODY, **change}
    body = {k: v for k, v in body.items() if v is not None}
    error = refusal(body=body)
    assert error.kind.status == 400 and says in error.message


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"max_tokens": None}, "max_tokens: field required"),
        ({"max_tokens": 0}, "max_tokens: expected a positive integer"),
        ({"messages": None}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"system": [{"type": "text"}]}, "system[0].text"),
        ({"tools": [{"name": 3}]}, "tools[0].name"),
    ],
)
def test_the_rest_is_validated_as_a_messages_body(change: dict[str, Any], says: str) -> None:
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    error = refusal(body=body)
    assert error.kind.status == 400 and says in error.message
    messages = {**{k: v for k, v in body.items() if k != "anthropic_version"}, "model": "m"}
    with pytest.raises(GatewayError) as same:  # the same words a Messages client gets
        messages_wire.parse(json.dumps(messages).encode(), {})
    assert same.value.message == error.message


def test_bad_json_and_duplicated_members_are_refused_before_the_envelope() -> None:
    assert "not valid JSON" in refusal(body=b"{").message
    assert (
        "duplicated member: max_tokens"
        in refusal(body=b'{"anthropic_version": "bedrock-2023-05-31", "max_tokens": 1, "max_tokens": 2, "messages": []}').message
    )


def test_no_client_header_is_forwarded_and_the_body_betas_stand_for_the_header() -> None:
    headers = {"anthropic-beta": "client-header-beta", "anthropic-version": "2023-06-01", "authorization": "Bearer vk", "x-api-key": "sk"}
    assert parse(headers=headers).forward_headers == {}
    with_betas = parse(body={**BODY, "anthropic_beta": ["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"]}, headers=headers)
    assert with_betas.forward_headers == {"anthropic-beta": "interleaved-thinking-2025-05-14,context-1m-2025-08-07"}


def test_betas_longer_than_a_forwarded_header_may_be_are_refused() -> None:
    betas = [f"beta-{i:04d}-" + "x" * 100 for i in range(DEFAULT_LIMITS.max_header_bytes // 100)]
    error = refusal(body={**BODY, "anthropic_beta": betas})
    assert error.kind is ErrorKind.HEADERS_TOO_LARGE and "anthropic_beta" in error.message


def test_the_requirements_are_read_as_for_messages() -> None:
    body = {**BODY, "tools": [{"name": "f", "input_schema": {"type": "object"}}], "thinking": {"type": "enabled", "budget_tokens": 10}}
    body["messages"] = [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]}]
    request = parse(body=body)
    assert request.requires == ["tools", "thinking", "vision"] and request.tools == ["f"]


# --- egress -----------------------------------------------------------------------------------


def test_the_upstream_path_keeps_ids_and_arns_one_segment() -> None:
    assert wire.upstream_path(MODEL, False) == "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    assert wire.upstream_path(ARN, True) == (
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"
    )


def test_nothing_of_the_client_goes_upstream_in_headers() -> None:
    forward = {"anthropic-beta": "b", "authorization": "Bearer vk"}
    assert wire.upstream_headers("provider-key", forward) == {"content-type": "application/json", "accept": "application/json"}


def test_the_policys_guardrail_goes_in_invokemodels_headers() -> None:
    headers = wire.upstream_headers(None, {})
    body = b'{"anthropic_version":"bedrock-2023-05-31"}'
    assert wire.require_guardrail(body, headers, {"identifier": "gr-1", "version": "3"}) == body
    assert headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "X-Amzn-Bedrock-GuardrailIdentifier": "gr-1",
        "X-Amzn-Bedrock-GuardrailVersion": "3",
    }


def test_the_policys_guardrail_drops_the_bodys_guardrail_configuration() -> None:
    """Its tag suffix would make the guardrail judge only tagged text; its asynchronous
    mode would stream text out before the guardrail judged it."""
    body = b'{"anthropic_version":"bedrock-2023-05-31","amazon-bedrock-guardrailConfig":{"tagSuffix":"x","streamProcessingMode":"ASYNCHRONOUS"}}'
    sent = json.loads(wire.require_guardrail(body, {}, {"identifier": "gr-1", "version": "3"}))
    assert sent == {"anthropic_version": "bedrock-2023-05-31"}


def test_a_guardrail_trace_is_refused_naming_the_header() -> None:
    raw = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()
    with pytest.raises(GatewayError) as refused:
        wire.parse(raw, {"X-Amzn-Bedrock-Trace": "ENABLED"}, "", DEFAULT_LIMITS, {"model": "anthropic.claude-v2", "action": "invoke"})
    assert refused.value.kind == ErrorKind.INVALID_REQUEST and "x-amzn-bedrock-trace" in refused.value.message


def test_passthrough_is_the_clients_bytes_unless_the_output_must_be_capped() -> None:
    raw = b'{"anthropic_version":"bedrock-2023-05-31",  "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]}'
    request = parse(body=raw)
    assert wire.passthrough_body(request, "other-model", None) == raw
    assert wire.passthrough_body(request, MODEL, 6000) == raw
    capped = wire.passthrough_body(request, MODEL, 1000)
    assert json.loads(capped)["max_tokens"] == 1000 and capped.endswith(b'"messages": [{"role": "user", "content": "hi"}]}')


def test_a_composed_request_is_an_invoke_body_its_own_parser_accepts() -> None:
    body = wire.compose(MODEL, "classify", "text", 5)
    assert "model" not in body and body["anthropic_version"] == "bedrock-2023-05-31" and body["temperature"] == 0
    assert parse(body=body).body["system"] == "classify"


# --- surfaces and tool calls on Invoke shapes --------------------------------------------------


def test_surfaces_read_and_insert_into_an_invoke_body() -> None:
    body = parse(body={**BODY, "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]}).body
    seen: list[tuple[str, str]] = []
    PROTOCOL.surfaces.visit_prompt(body, lambda surface, text: seen.append((surface, text)) or text)
    assert ("system", "be brief") in seen and ("user", "hi") in seen
    PROTOCOL.surfaces.insert_system_prompt(body, "policy")
    assert body["system"][0]["text"] == "policy" and body["system"][1] == {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}
    assert PROTOCOL.surfaces.leading_instructions(body) == "policy"


def test_unwrapped_stream_events_are_messages_events_to_the_surfaces() -> None:
    events = unwrapped(ANTHROPIC_EVENTS)
    assert [e.event for e in events] == [e["type"] for e in ANTHROPIC_EVENTS]
    texts = [t for e in events for t in PROTOCOL.surfaces.stream_texts(e.json())]
    assert "".join(t.holder[t.key] for t in texts) == "Hello"


def test_a_denied_tool_call_in_an_invoke_stream_is_reframed_as_a_chunk() -> None:
    judged: list[ToolCall] = []

    def judge(call: ToolCall) -> str | None:
        judged.append(call)
        return "not allowed"

    held = PROTOCOL.tools.ToolCallStream(judge)
    out = [e for event in unwrapped(TOOL_USE_EVENTS) for e in held.feed(event)] + held.finish()
    assert judged[0].name == "read" and judged[0].arguments == {"path": "/tmp/a"}
    received = boto3_invoke_events(b"".join(INVOKE_FRAMING.frame(e) for e in out))
    assert [e["type"] for e in received][1:4] == ["content_block_start", "content_block_delta", "content_block_stop"]
    assert received[1]["content_block"]["type"] == "text" and "tool `read`" in received[2]["delta"]["text"]
    assert received[4]["delta"]["stop_reason"] == "end_turn"


def test_answer_tool_calls_read_an_invoke_answer() -> None:
    answer = {"content": [{"type": "tool_use", "id": "tu_1", "name": "f", "input": {"a": 1}}], "usage": {"input_tokens": 1, "output_tokens": 1}}
    ((index, call),) = PROTOCOL.tools.answer_tool_calls(answer)
    assert (index, call.name, call.arguments) == (0, "f", {"a": 1})


# --- usage --------------------------------------------------------------------------------


def test_usage_from_the_answer_else_the_invocation_metrics() -> None:
    answer = {"usage": {"input_tokens": 10, "output_tokens": 3, "cache_creation_input_tokens": 2}}
    assert wire.usage_of(answer) == Usage(input=10, output=3, cache_write=2)
    metrics = {"amazon-bedrock-invocationMetrics": {"inputTokenCount": 8, "outputTokenCount": 4, "cacheReadInputTokenCount": 5, "invocationLatency": 100}}
    assert wire.usage_of(metrics) == Usage(input=8, output=4, cache_read=5)
    assert wire.usage_of({"content": []}) is None
    assert wire.usage_of({"amazon-bedrock-invocationMetrics": {"inputTokenCount": "8"}}) is None


def _metered(events: list[dict[str, Any]]) -> Any:
    meter = wire.StreamUsage()
    for event in unwrapped(events):
        meter.feed(event)
    return meter


def test_a_stream_is_metered_off_its_messages_events() -> None:
    stop = {"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 99, "outputTokenCount": 99}}
    meter = _metered([*ANTHROPIC_EVENTS[:-1], stop])
    assert meter.complete and meter.known and meter.usage == Usage(input=12, output=7, cache_read=4)


def test_a_stream_without_usage_falls_back_to_the_last_chunks_metrics() -> None:
    bare = [{**e, "usage": {}} if e["type"] == "message_delta" else e for e in ANTHROPIC_EVENTS[1:-1]]
    unknown = _metered([*bare, {"type": "message_stop"}])
    assert unknown.complete and not unknown.known
    stop = {"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 20, "outputTokenCount": 6, "firstByteLatency": 5}}
    meter = _metered([*bare, stop])
    assert meter.complete and meter.known and meter.usage == Usage(input=20, output=6)


def test_a_cut_stream_is_not_complete() -> None:
    meter = _metered(ANTHROPIC_EVENTS[:-1])
    assert not meter.complete and meter.known


# --- errors -------------------------------------------------------------------------------


def test_error_events_are_exception_frames_and_messages_errors() -> None:
    parser = INVOKE_FRAMING.Parser()
    (exception,) = parser.feed(exception_frame("throttlingException", "slow down"))
    assert wire.is_error_event(exception)
    (error,) = unwrapped([{"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}])
    assert wire.is_error_event(error)
    assert not any(wire.is_error_event(e) for e in unwrapped(ANTHROPIC_EVENTS))


@pytest.mark.parametrize(
    ("kind", "code"),
    [(ErrorKind.INVALID_REQUEST, "ValidationException"), (ErrorKind.RATE_LIMITED, "ThrottlingException"), (ErrorKind.PERMISSION, "AccessDeniedException")],
)
def test_errors_are_what_boto3_reads(kind: ErrorKind, code: str) -> None:
    error = GatewayError(kind, "max_tokens: field required")
    parsed = boto3_error(wire.error_body(error, "req-1"), wire.error_headers(error, "req-1"), kind.status)
    assert parsed["Error"] == {"Code": code, "Message": "max_tokens: field required"}
    assert parsed["ResponseMetadata"]["RequestId"] == "req-1"


def test_a_stream_error_ends_the_stream_as_boto3_raises_it() -> None:
    raw = b"".join(chunk_frames(ANTHROPIC_EVENTS[:2])) + wire.stream_error(GatewayError(ErrorKind.UPSTREAM, "the provider failed mid-stream"))
    with pytest.raises(BotoEventStreamError) as raised:
        boto3_invoke_stream(raw)
    assert raised.value.response["Error"] == {"Code": "modelStreamErrorException", "Message": "the provider failed mid-stream"}


def test_a_clients_own_guardrail_goes_to_bedrock_and_the_policys_replaces_it() -> None:
    raw = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()
    sent = {"X-Amzn-Bedrock-GuardrailIdentifier": "client-guard", "X-Amzn-Bedrock-GuardrailVersion": "2", "authorization": "Bearer pk-secret"}
    request = wire.parse(raw, sent, "", DEFAULT_LIMITS, {"model": "anthropic.claude-v2", "action": "invoke"})
    headers = wire.upstream_headers(None, request.forward_headers)
    assert headers["x-amzn-bedrock-guardrailidentifier"] == "client-guard" and headers["x-amzn-bedrock-guardrailversion"] == "2"
    assert "authorization" not in headers and "pk-secret" not in json.dumps(headers)
    body = wire.require_guardrail(raw, headers, {"identifier": "policy-guard", "version": "1"})
    assert body == raw
    guard = {name.lower(): value for name, value in headers.items() if "guardrail" in name.lower()}
    assert guard == {"x-amzn-bedrock-guardrailidentifier": "policy-guard", "x-amzn-bedrock-guardrailversion": "1"}
