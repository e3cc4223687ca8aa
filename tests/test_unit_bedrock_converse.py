"""The Bedrock Converse protocol on the wire: parsing and validation of what boto3
sends (every refusal a 400 naming the field), errors as boto3 reads them, the egress
path, headers and body edits, the gateway's own requests, answers and usage.
Surfaces and tool calls: test_unit_bedrock_converse_surfaces.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import EventStreamError

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols.bedrock_converse import PROTOCOL, wire
from portcullis.adapters.protocols.eventstream import FramedEvent
from portcullis.adapters.protocols.registry import route
from portcullis.adapters.protocols.request import DEFAULT_LIMITS
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.plan import Target
from portcullis.engine.pricing import Usage
from tests.bedrock_streams import parsed
from tests.botocore_bedrock import boto3_body, boto3_converse_stream, boto3_error, shape_errors

MODEL_ID = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-20250929-v1:0"
CONVERSE = {"model": MODEL_ID, "action": "converse"}
STREAM = {"model": MODEL_ID, "action": "converse-stream"}

# Every content block kind the gateway accepts, as boto3 takes them (bytes as bytes).
EVERY_BLOCK: dict[str, Any] = {
    "modelId": MODEL_ID,
    "system": [{"text": "Be brief."}, {"guardContent": {"text": {"text": "policy", "qualifiers": ["guard_content"]}}}, {"cachePoint": {"type": "default"}}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"text": "look"},
                {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}},
                {"document": {"format": "txt", "name": "notes", "source": {"text": "the notes"}, "context": "ctx", "citations": {"enabled": True}}},
                {"document": {"format": "pdf", "name": "scan", "source": {"bytes": b"%PDF"}}},
                {"document": {"name": "parts", "source": {"content": [{"text": "part one"}]}}},
                {"video": {"format": "mp4", "source": {"bytes": b"\x00"}}},
                {"audio": {"format": "mp3", "source": {"bytes": b"\x00"}}},
                {"guardContent": {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}}},
                {"cachePoint": {"type": "default"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "thinking", "signature": "sig"}}},
                {"reasoningContent": {"redactedContent": b"\x01"}},
                {
                    "citationsContent": {
                        "content": [{"text": "cited"}],
                        "citations": [
                            {"title": "t", "sourceContent": [{"text": "src"}], "location": {"documentChar": {"documentIndex": 0, "start": 0, "end": 3}}}
                        ],
                    }
                },
                {"toolUse": {"toolUseId": "t1", "name": "lookup", "input": {"q": "x"}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "success",
                        "content": [
                            {"text": "found"},
                            {"json": {"rows": [1, "two"]}},
                            {"image": {"format": "gif", "source": {"bytes": b"GIF"}}},
                            {"document": {"name": "d", "source": {"text": "doc"}}},
                            {"searchResult": {"source": "s", "title": "t", "content": [{"text": "r"}]}},
                        ],
                    }
                },
                {"searchResult": {"source": "s", "title": "t", "content": [{"text": "r"}]}},
            ],
        },
    ],
    "inferenceConfig": {"maxTokens": 512, "temperature": 0.2, "topP": 0.9, "stopSequences": ["END"]},
    "toolConfig": {
        "tools": [
            {"toolSpec": {"name": "lookup", "description": "Looks up.", "inputSchema": {"json": {"type": "object"}}, "strict": True}},
            {"systemTool": {"name": "nova_grounding"}},
            {"cachePoint": {"type": "default"}},
        ],
        "toolChoice": {"auto": {}},
    },
    "guardrailConfig": {"guardrailIdentifier": "g", "guardrailVersion": "1"},
    "additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 1024}},
    "additionalModelResponseFieldPaths": ["/stop_sequence"],
    "requestMetadata": {"team": "a"},
    "promptVariables": {"topic": {"text": "tides"}},
}


def parse(body: dict[str, Any] | bytes, path: dict[str, str] = CONVERSE, limits: RequestLimits = DEFAULT_LIMITS) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return wire.parse(raw, {"authorization": "AWS4-HMAC-SHA256 Credential=AKIA...", "x-amz-date": "20261201T000000Z"}, "", limits, path)


def refusal(body: dict[str, Any] | bytes, path: dict[str, str] = CONVERSE, limits: RequestLimits = DEFAULT_LIMITS) -> GatewayError:
    with pytest.raises(GatewayError) as raised:
        parse(body, path, limits)
    assert raised.value.kind.status < 500
    return raised.value


def hello(**members: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"text": "hi"}]}], **members}


def test_the_body_boto3_sends_with_every_block_kind_is_accepted() -> None:
    raw, url = boto3_body(EVERY_BLOCK, stream=True)
    assert url == "/model/" + MODEL_ID.replace(":", "%3A").replace("/", "%2F") + "/converse-stream"
    request = parse(raw, STREAM)
    assert (request.protocol, request.model, request.stream, request.max_tokens) == ("bedrock_converse", MODEL_ID, True, 512)
    assert request.requires == ["streaming", "tools", "thinking", "documents", "vision"]
    assert request.tools == ["lookup", "server:nova_grounding"]
    assert request.forward_headers == {}  # the client's credentials never go upstream
    assert request.raw == raw


def test_a_minimal_body_needs_nothing_and_names_no_output_limit() -> None:
    request = parse(hello())
    assert (request.stream, request.max_tokens, request.requires, request.tools) == (False, None, [], [])
    assert parse(hello(additionalModelRequestFields={"thinking": {"type": "disabled"}})).requires == []
    assert parse(hello(additionalModelRequestFields={"reasoningConfig": {"type": "enabled"}})).requires == ["thinking"]


REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({}, "messages: field required"),
    ({"messages": []}, "messages: must contain at least one message"),
    ({"messages": {}}, "messages: expected an array"),
    (hello(inferenceConfig=[]), "inferenceConfig: expected an object"),
    (hello(inferenceConfig={"maxTokens": 0}), "inferenceConfig.maxTokens: expected a positive integer"),
    (hello(inferenceConfig={"maxTokens": "5"}), "inferenceConfig.maxTokens: expected a positive integer"),
    (hello(inferenceConfig={"temperature": "hot"}), "inferenceConfig.temperature: expected a number"),
    (hello(inferenceConfig={"stopSequences": [1]}), "inferenceConfig.stopSequences[0]: expected a string"),
    ({"messages": [{"role": "system", "content": [{"toolAddition": {"tool": {}}}]}]}, "messages[0].role: expected 'user' or 'assistant'"),
    ({"messages": [{"role": "user"}]}, "messages[0].content: field required"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "messages[0].content: expected an array of content blocks"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}, {"x": {}}]}]}, "messages[0].content[1]: unsupported content block 'x'"),
    ({"messages": [{"role": "user", "content": [{"text": "a", "cachePoint": {"type": "default"}}]}]}, "messages[0].content[0]: expected exactly one member"),
    ({"messages": [{"role": "user", "content": [{"text": 5}]}]}, "messages[0].content[0].text: expected a string"),
    (
        {"messages": [{"role": "user", "content": [{"image": {"format": "png", "source": {"s3Location": {"uri": "s3://b/k"}}}}]}]},
        "messages[0].content[0].image.source.s3Location: content in S3 cannot be inspected",
    ),
    (
        {"messages": [{"role": "user", "content": [{"document": {"name": "d", "source": {"s3Location": {"uri": "s3://b/k"}}}}]}]},
        "messages[0].content[0].document.source.s3Location",
    ),
    ({"messages": [{"role": "user", "content": [{"document": {"source": {"text": "t"}}}]}]}, "messages[0].content[0].document.name: field required"),
    (
        {"messages": [{"role": "user", "content": [{"document": {"name": "d", "source": {"text": 1}}}]}]},
        "messages[0].content[0].document.source.text: expected a string",
    ),
    ({"messages": [{"role": "assistant", "content": [{"toolUse": {"toolUseId": "t", "name": "n"}}]}]}, "messages[0].content[0].toolUse.input: field required"),
    (
        {"messages": [{"role": "user", "content": [{"toolResult": {"toolUseId": "t", "content": [{"html": "<b>"}]}}]}]},
        "messages[0].content[0].toolResult.content[0]: unsupported tool result block 'html'",
    ),
    (
        {"messages": [{"role": "assistant", "content": [{"reasoningContent": {"reasoningText": {"signature": "s"}}}]}]},
        "messages[0].content[0].reasoningContent.reasoningText.text: field required",
    ),
    (
        {"messages": [{"role": "user", "content": [{"guardContent": {"text": {"text": 1}}}]}]},
        "messages[0].content[0].guardContent.text.text: expected a string",
    ),
    (hello(system="be brief"), "system: expected an array"),
    (hello(system=[{"image": {}}]), "system[0]: unsupported system block 'image'"),
    (hello(toolConfig={"tools": {}}), "toolConfig.tools: expected an array"),
    (hello(toolConfig={"tools": [{"mcp": {}}]}), "toolConfig.tools[0]: unsupported tool 'mcp'"),
    (hello(toolConfig={"tools": [{"toolSpec": {"name": "n"}}]}), "toolConfig.tools[0].toolSpec.inputSchema: field required"),
    (
        hello(toolConfig={"tools": [{"toolSpec": {"name": "n", "inputSchema": {"json": []}}}]}),
        "toolConfig.tools[0].toolSpec.inputSchema.json: expected an object",
    ),
    (hello(toolConfig={"tools": [], "toolChoice": {"tool": {}}}), "toolConfig.toolChoice.tool.name: field required"),
    (hello(additionalModelRequestFields=[]), "additionalModelRequestFields: expected an object"),
    (hello(requestMetadata={"team": 1}), "requestMetadata.team: expected a string"),
    (hello(promptVariables={"topic": {"text": 1}}), "promptVariables.topic.text: expected a string"),
]


@pytest.mark.parametrize(("body", "message"), REFUSALS, ids=[message for _, message in REFUSALS])
def test_each_refusal_is_a_400_that_names_its_field(body: dict[str, Any], message: str) -> None:
    error = refusal(body)
    assert error.kind is ErrorKind.INVALID_REQUEST and error.message.startswith(message), error.message


def test_unknown_top_level_members_pass_through_to_the_provider() -> None:
    body = hello(serviceTier={"type": "priority"}, outputConfig={"textFormat": {"type": "json"}}, newMember=[1])
    assert parse(body).body["newMember"] == [1]


def test_the_model_comes_from_the_path_and_is_bounded() -> None:
    assert refusal(hello(), {"action": "converse"}).message == "modelId: the path names no model"
    assert "longer than 2048" in refusal(hello(), {"model": "m" * 2049, "action": "converse"}).message
    assert refusal(hello(), {"model": "anthropic.claude\n", "action": "converse"}).message == "modelId: contains characters no model id has"
    assert parse(hello(), {"model": "m" * 2048, "action": "converse"}).model == "m" * 2048


def test_bad_json_and_oversized_requests_are_client_errors() -> None:
    assert "not valid JSON" in refusal(b'{"messages": [').message
    assert "duplicated member" in refusal(b'{"messages": [], "messages": []}').message
    many = {"messages": [{"role": "user", "content": [{"text": "a"}]}] * 3}
    assert refusal(many, limits=RequestLimits(max_messages=2)).kind is ErrorKind.REQUEST_TOO_LARGE
    tools = hello(toolConfig={"tools": [{"systemTool": {"name": "t"}}] * 3})
    assert refusal(tools, limits=RequestLimits(max_tools=2)).kind is ErrorKind.REQUEST_TOO_LARGE
    blocks = {"messages": [{"role": "user", "content": [{"text": "a"}] * 3}]}
    assert refusal(blocks, limits=RequestLimits(max_content_blocks=2)).kind is ErrorKind.REQUEST_TOO_LARGE


# --- errors ---------------------------------------------------------------------------


def test_a_refusal_is_an_error_boto3_reads_by_type_and_message() -> None:
    error = refusal({"messages": [{"role": "user", "content": [{"x": {}}]}]})
    body, headers = wire.error_body(error, "req-1"), wire.error_headers(error, "req-1")
    assert json.loads(body) == {"message": error.message}
    read = boto3_error(body, headers)
    assert read["Error"]["Code"] == "ValidationException" and read["Error"]["Message"] == error.message
    assert read["ResponseMetadata"]["RequestId"] == "req-1"
    limited = GatewayError(ErrorKind.RATE_LIMITED, "slow down", code="rate_limited")
    assert boto3_error(wire.error_body(limited, "r"), wire.error_headers(limited, "r"), 429)["Error"]["Code"] == "ThrottlingException"


def test_a_stream_error_is_an_exception_frame_boto3_raises() -> None:
    frame = wire.stream_error(GatewayError(ErrorKind.UPSTREAM, "the provider failed", code="upstream_error"))
    buffer = EventStreamBuffer()
    buffer.add_data(frame)
    message = next(buffer)
    assert message.headers[":message-type"] == "exception" and message.headers[":exception-type"] == "modelStreamErrorException"
    with pytest.raises(EventStreamError) as raised:
        boto3_converse_stream(frame)
    assert raised.value.response["Error"] == {"Code": "modelStreamErrorException", "Message": "the provider failed"}
    (event,) = PROTOCOL.wire.FRAMING.Parser().feed(frame)
    assert wire.is_error_event(event) and not wire.is_error_event(SSEEvent("messageStop", "{}", b""))


# --- egress ---------------------------------------------------------------------------


def test_the_upstream_path_percent_encodes_the_model_as_one_segment() -> None:
    assert wire.upstream_path("us.anthropic.claude-3-haiku-20240307-v1:0", False) == "/model/us.anthropic.claude-3-haiku-20240307-v1%3A0/converse"
    assert wire.upstream_path(MODEL_ID, True) == "/model/" + boto3_body({"modelId": MODEL_ID}, stream=True)[1].split("/model/")[1]


def test_the_upstream_headers_carry_no_key_and_no_client_header() -> None:
    assert wire.upstream_headers(None, {"authorization": "Bearer client"}) == {"content-type": "application/json", "accept": "application/json"}
    assert "secret" not in json.dumps(wire.upstream_headers("secret", {}))


CEILING = Target("m", "bedrock", MODEL_ID, "us-east-1", 1, 200000, 1000, ("tools",))


def test_passthrough_keeps_the_clients_bytes_unless_the_output_must_be_capped() -> None:
    raw = b'{"messages": [{"role": "user", "content": [{"text": "h\\u00e9"}]}],  "inferenceConfig": {"maxTokens": 5000, "topP": 0.5}}'
    request = parse(raw)
    same = route("bedrock_converse", "bedrock_converse")
    assert same.upstream_body(request, CEILING, cap_output=False) == raw
    capped = same.upstream_body(request, CEILING, cap_output=True)
    assert json.loads(capped)["inferenceConfig"] == {"maxTokens": 1000, "topP": 0.5}
    assert capped.startswith(b'{"messages": [{"role": "user", "content": [{"text": "h\\u00e9"}]}],  "inferenceConfig"')
    unlimited = parse(hello())
    assert json.loads(same.upstream_body(unlimited, CEILING, cap_output=True))["inferenceConfig"] == {"maxTokens": 1000}
    small = parse(hello(inferenceConfig={"maxTokens": 10}))
    assert same.upstream_body(small, CEILING, cap_output=True) == small.raw


def test_cap_output_lowers_or_sets_max_tokens() -> None:
    body: dict[str, Any] = {"inferenceConfig": {"maxTokens": 9000}}
    wire.cap_output(body, 100)
    none: dict[str, Any] = {}
    wire.cap_output(none, 100)
    assert body == none == {"inferenceConfig": {"maxTokens": 100}}


def test_the_gateways_own_request_is_a_valid_converse_body() -> None:
    body = wire.compose(MODEL_ID, "Classify.", "Is this personal?", 16)
    assert shape_errors({"modelId": MODEL_ID, **body}, "ConverseRequest") == ""
    assert body["system"] == [{"text": "Classify."}] and body["messages"][0]["content"] == [{"text": "Is this personal?"}]
    assert parse(json.dumps(body).encode()).max_tokens == 16
    assert "system" not in wire.compose(MODEL_ID, "", "u", 16)


ANSWER: dict[str, Any] = {
    "output": {"message": {"role": "assistant", "content": [{"reasoningContent": {"reasoningText": {"text": "hm"}}}, {"text": "Hello"}, {"text": ", world"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 12, "outputTokens": 5, "totalTokens": 67, "cacheReadInputTokens": 40, "cacheWriteInputTokens": 10},
    "metrics": {"latencyMs": 120},
}


def test_answer_text_and_usage_of_a_converse_response() -> None:
    assert shape_errors(ANSWER, "ConverseResponse") == ""
    assert wire.answer_text(ANSWER) == "Hello, world"
    assert wire.usage_of(ANSWER) == Usage(input=12, output=5, cache_read=40, cache_write=10)
    assert wire.usage_of({"usage": {"inputTokens": 3}}) is None and wire.usage_of({}) is None
    with pytest.raises(ValueError):
        wire.answer_text({"output": {}})


STREAM_EVENTS = [
    ("messageStart", {"role": "assistant"}),
    ("contentBlockDelta", {"delta": {"text": "Hi"}, "contentBlockIndex": 0}),
    ("contentBlockStop", {"contentBlockIndex": 0}),
    ("messageStop", {"stopReason": "end_turn"}),
    ("metadata", {"usage": {"inputTokens": 7, "outputTokens": 2, "totalTokens": 9, "cacheReadInputTokens": 3}, "metrics": {"latencyMs": 50}}),
]


def test_the_stream_meter_reads_metadata_and_completes_on_stop_and_metadata() -> None:
    meter = wire.StreamUsage()
    events = parsed(*STREAM_EVENTS)
    for event in events[:-1]:
        meter.feed(event)
    assert not meter.complete and not meter.known  # stopped, but usage not yet reported
    meter.feed(events[-1])
    assert meter.complete and meter.known and meter.usage == Usage(input=7, output=2, cache_read=3)
    assert wire.is_usage_only(json.loads(events[-1].data)) and not wire.is_usage_only(json.loads(events[3].data))
    assert wire.client_wants_usage(parse(hello())) is True


def test_a_stream_without_its_stop_is_incomplete() -> None:
    meter = wire.StreamUsage()
    for event in parsed(*STREAM_EVENTS[:2], STREAM_EVENTS[-1]):
        meter.feed(event)
    assert meter.known and not meter.complete


def test_a_same_protocol_stream_goes_to_the_client_as_the_providers_bytes() -> None:
    events = parsed(*STREAM_EVENTS)
    converter = route("bedrock_converse", "bedrock_converse").stream_converter(parse(hello(), STREAM), 0)
    sent = b"".join(chunk for event in events for chunk in converter.feed(event))
    assert all(isinstance(event, FramedEvent) for event in events)
    assert sent == b"".join(event.raw for event in events)
    assert [next(iter(event)) for event in boto3_converse_stream(sent)] == [name for name, _ in STREAM_EVENTS]


def test_the_policys_guardrail_replaces_the_clients_in_the_body() -> None:
    raw = json.dumps(hello(guardrailConfig={"guardrailIdentifier": "mine", "guardrailVersion": "9", "streamProcessingMode": "async"})).encode()
    headers: dict[str, str] = {}
    sent = json.loads(wire.require_guardrail(raw, headers, {"identifier": "gr-1", "version": "2"}))
    assert sent["guardrailConfig"] == {"guardrailIdentifier": "gr-1", "guardrailVersion": "2"} and headers == {}
    assert shape_errors({**sent, "modelId": MODEL_ID}, "ConverseStreamRequest") == ""
    assert json.loads(wire.require_guardrail(b'{"messages": []}', {}, {"identifier": "g", "version": "1"}))["guardrailConfig"] == {
        "guardrailIdentifier": "g",
        "guardrailVersion": "1",
    }
