"""The fake Bedrock Runtime is faithful where the gateway's tests lean on it: boto3
itself, signing as it does against AWS, is accepted and reads every answer (JSON, both
event streams, errors, exception frames); what AWS refuses the fake refuses; and its
bodies and events match the shapes of botocore's service model member for member."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.auth
import httpx
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.credentials import ReadOnlyCredentials
from botocore.exceptions import ClientError, EventStreamError
from urllib3.exceptions import ProtocolError

from portcullis.adapters.protocols.eventstream import FrameParser
from portcullis.adapters.providers.bedrock import sign
from tests.fakes import CutStream, Fail, FakeProvider, Intervene, Reply, StreamError, ToolCall
from tests.fakes.bedrock_runtime import converse_document, converse_frames, guardrail_of, service_shapes
from tests.fakes.sigv4 import ACCESS_KEY, SECRET_KEY

MODEL = "us.anthropic.claude-3-5-sonnet-20240620-v1:0"
ARN = f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/{MODEL}"
MESSAGES = [{"role": "user", "content": [{"text": "hello"}]}]
INVOKE_BODY = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def served() -> Iterator[FakeProvider]:
    fake = FakeProvider(name="bedrock-fidelity").start()
    yield fake
    fake.stop()


@pytest.fixture
def fake(served: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> FakeProvider:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    served.reset()
    return served


def client(fake: FakeProvider, secret: str = SECRET_KEY, **config: Any) -> Any:
    return boto3.client(
        "bedrock-runtime",
        region_name=fake.aws.region,
        endpoint_url=fake.url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=secret,
        config=Config(retries={"total_max_attempts": 1}, **config),
    )


def test_boto3_converse_reads_text_tool_use_usage_and_metrics(fake: FakeProvider) -> None:
    fake.script(ARN, Reply(text="Let me look.", tool_calls=(ToolCall("shell", {"cmd": "ls"}, id="tooluse_1"),), cache_read_tokens=7))
    answer = client(fake).converse(modelId=ARN, messages=MESSAGES)
    tool_use = {"toolUseId": "tooluse_1", "name": "shell", "input": {"cmd": "ls"}}
    assert answer["output"]["message"]["content"] == [{"text": "Let me look."}, {"toolUse": tool_use}]
    assert answer["stopReason"] == "tool_use" and answer["metrics"]["latencyMs"] >= 1
    assert answer["usage"] == {"inputTokens": 100, "outputTokens": 20, "totalTokens": 127, "cacheReadInputTokens": 7}
    assert fake.received[-1].model == ARN and fake.received[-1].path.startswith("/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A")


def test_boto3_converse_stream_reads_every_event(fake: FakeProvider) -> None:
    fake.script(MODEL, Reply(text="abc def", tool_calls=(ToolCall("shell", {"cmd": "pwd"}, id="tooluse_2"),)))
    events = list(client(fake).converse_stream(modelId=MODEL, messages=MESSAGES)["stream"])
    assert [next(iter(event)) for event in events][:2] == ["messageStart", "contentBlockDelta"]
    starts = [event["contentBlockStart"] for event in events if "contentBlockStart" in event]
    assert starts == [{"start": {"toolUse": {"toolUseId": "tooluse_2", "name": "shell"}}, "contentBlockIndex": 1}]
    tool_input = "".join(e["contentBlockDelta"]["delta"]["toolUse"]["input"] for e in events if "toolUse" in e.get("contentBlockDelta", {}).get("delta", {}))
    assert json.loads(tool_input) == {"cmd": "pwd"}
    assert events[-2] == {"messageStop": {"stopReason": "tool_use"}} and events[-1]["metadata"]["usage"]["totalTokens"] == 120


def test_boto3_invoke_model_reads_an_anthropic_message(fake: FakeProvider) -> None:
    answer = client(fake).invoke_model(modelId=MODEL, body=json.dumps(INVOKE_BODY))
    body = json.loads(answer["body"].read())
    assert body["type"] == "message" and body["content"] == [{"type": "text", "text": "Hello from the fake provider."}]
    assert answer["contentType"] == "application/json" and answer["ResponseMetadata"]["HTTPHeaders"]["x-amzn-bedrock-output-token-count"] == "20"
    assert "amazon-bedrock-guardrailAction" not in body  # no guardrail named, none reported


def test_boto3_invoke_stream_reads_chunks_and_the_invocation_metrics(fake: FakeProvider) -> None:
    answer = client(fake).invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(INVOKE_BODY))
    events = [json.loads(part["chunk"]["bytes"]) for part in answer["body"]]
    assert events[0]["type"] == "message_start" and "ping" not in [event["type"] for event in events]
    metrics = events[-1]["amazon-bedrock-invocationMetrics"]
    assert events[-1]["type"] == "message_stop" and (metrics["inputTokenCount"], metrics["outputTokenCount"]) == (100, 20)
    assert metrics["invocationLatency"] >= 1 and metrics["firstByteLatency"] >= 1


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({**INVOKE_BODY, "model": MODEL}, "extraneous key [model]"),
        ({**INVOKE_BODY, "stream": True}, "extraneous key [stream]"),
        ({key: value for key, value in INVOKE_BODY.items() if key != "anthropic_version"}, "required key [anthropic_version]"),
        ({**INVOKE_BODY, "anthropic_version": "2023-06-01"}, "anthropic_version"),
    ],
)
def test_an_invoke_body_bedrock_would_refuse_is_refused(fake: FakeProvider, body: dict[str, Any], problem: str) -> None:
    with pytest.raises(ClientError) as refused:
        client(fake).invoke_model(modelId=MODEL, body=json.dumps(body))
    assert refused.value.response["Error"]["Code"] == "ValidationException" and problem in refused.value.response["Error"]["Message"]


def test_a_converse_member_outside_the_service_model_is_refused(fake: FakeProvider) -> None:
    url = f"{fake.url}/model/{MODEL.replace(':', '%3A')}/converse"
    body = json.dumps({"messages": MESSAGES, "max_tokens": 5}).encode()  # an Anthropic field, not a Converse one
    headers = sign(ReadOnlyCredentials(ACCESS_KEY, SECRET_KEY, None), "us-east-1", url, {"content-type": "application/json"}, body)
    refused = httpx.post(url, content=body, headers=headers)
    assert refused.status_code == 400 and "extraneous key [max_tokens]" in refused.json()["message"]


@pytest.mark.parametrize(
    ("status", "code", "leaks"),
    [
        (400, "ValidationException", "123456789012"),
        (403, "AccessDeniedException", "assumed-role"),
        (429, "ThrottlingException", None),
        (529, "ServiceUnavailableException", None),
    ],
)
def test_scripted_failures_are_answered_as_aws_errors(fake: FakeProvider, status: int, code: str, leaks: str | None) -> None:
    fake.script(MODEL, Fail(status))
    with pytest.raises(ClientError) as failed:
        client(fake).converse(modelId=MODEL, messages=MESSAGES)
    error = failed.value.response
    assert error["Error"]["Code"] == code and error["ResponseMetadata"]["HTTPStatusCode"] == (503 if status == 529 else status)
    assert error["ResponseMetadata"]["RequestId"] and "retry-after" not in error["ResponseMetadata"]["HTTPHeaders"]
    assert leaks is None or leaks in error["Error"]["Message"]


@pytest.mark.parametrize("operation", ["converse_stream", "invoke_model_with_response_stream"])
def test_an_exception_frame_mid_stream_is_raised_by_boto3(fake: FakeProvider, operation: str) -> None:
    fake.script(MODEL, StreamError(after=2, error_type="throttlingException"))
    call = getattr(client(fake), operation)
    answer = call(modelId=MODEL, messages=MESSAGES) if operation == "converse_stream" else call(modelId=MODEL, body=json.dumps(INVOKE_BODY))
    received = []
    with pytest.raises(EventStreamError) as failed:
        for event in answer["stream" if operation == "converse_stream" else "body"]:
            received.append(event)
    assert len(received) == 2 and failed.value.response["Error"]["Code"] == "throttlingException"


def test_a_cut_stream_fails_in_boto3_before_the_message_stops(fake: FakeProvider) -> None:
    fake.script(MODEL, CutStream(after=2))
    answer = client(fake).converse_stream(modelId=MODEL, messages=MESSAGES)
    events = []
    with pytest.raises(ProtocolError):  # the connection dropped with the response unfinished
        events.extend(answer["stream"])
    assert len(events) == 2 and "messageStop" not in {next(iter(event)) for event in events}


def test_guardrails_are_recorded_and_can_intervene(fake: FakeProvider) -> None:
    bedrock = client(fake)
    guardrail = {"guardrailIdentifier": "gr-team-a", "guardrailVersion": "2"}
    fake.script(MODEL, Intervene(), Intervene())
    answer = bedrock.converse(modelId=MODEL, messages=MESSAGES, guardrailConfig=guardrail)
    assert answer["stopReason"] == "guardrail_intervened" and answer["output"]["message"]["content"] == [{"text": Intervene().message}]
    assert guardrail_of(fake.received[-1]) == guardrail
    body = json.loads(bedrock.invoke_model(modelId=MODEL, body=json.dumps(INVOKE_BODY), guardrailIdentifier="gr-team-a", guardrailVersion="2")["body"].read())
    assert body["amazon-bedrock-guardrailAction"] == "INTERVENED" and body["content"][0]["text"] == Intervene().message
    assert guardrail_of(fake.received[-1]) == guardrail
    fake.script(MODEL, Intervene())  # without a guardrail named, nothing can intervene
    assert bedrock.converse(modelId=MODEL, messages=MESSAGES)["stopReason"] == "end_turn"


def test_what_aws_refuses_before_reading_the_request_the_fake_refuses(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(bedrock: Any) -> str:
        with pytest.raises(ClientError) as failed:
            bedrock.converse(modelId=MODEL, messages=MESSAGES)
        return failed.value.response["Error"]["Code"]

    assert refused(client(fake, signature_version=UNSIGNED)) == "MissingAuthenticationTokenException"
    assert refused(client(fake, secret="not-the-secret")) == "InvalidSignatureException"
    stale = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(minutes=20)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: stale)
    assert refused(client(fake)) == "InvalidSignatureException"  # signed 20 minutes ago: outside AWS's 15
    assert len(fake.received) == 3 and fake.requests_for(MODEL) == fake.received


# --- shapes --------------------------------------------------------------------------------

_SCALARS = {"string": str, "integer": int, "long": int, "boolean": bool, "double": (int, float), "float": (int, float), "timestamp": str, "blob": str}


def conforms(value: Any, shape_name: str, where: str = "$") -> list[str]:
    """Where ``value`` leaves the service model's shape: unknown members, missing required
    ones, wrong types, values outside an enum."""
    shape = service_shapes()[shape_name]
    kind = shape["type"]
    if shape.get("document"):
        return []
    if kind == "structure":
        if not isinstance(value, dict):
            return [f"{where}: not an object"]
        problems = [f"{where}.{name}: not in {shape_name}" for name in value if name not in shape["members"]]
        problems += [f"{where}.{name}: required by {shape_name}" for name in shape.get("required", []) if name not in value]
        known = [(name, item) for name, item in value.items() if name in shape["members"]]
        return problems + [p for name, item in known for p in conforms(item, shape["members"][name]["shape"], f"{where}.{name}")]
    if kind == "list":
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [p for i, item in enumerate(value) for p in conforms(item, shape["member"]["shape"], f"{where}[{i}]")]
    if not isinstance(value, _SCALARS[kind]) or (kind in ("integer", "long") and isinstance(value, bool)):
        return [f"{where}: not a {kind}"]
    return [f"{where}: {value!r} not in {shape_name}"] if "enum" in shape and value not in shape["enum"] else []


def test_converse_answers_match_the_service_model() -> None:
    reply = Reply(text="hi", reasoning="thinking", tool_calls=(ToolCall("shell", {"cmd": "ls"}),), cache_read_tokens=3, cache_write_tokens=4)
    assert conforms(converse_document(reply, "tool_use", 12), "ConverseResponse") == []
    assert conforms(converse_document(Reply(), "guardrail_intervened", 1), "ConverseResponse") == []
    assert conforms({"stopReason": "finished"}, "MessageStopEvent") == ["$.stopReason: 'finished' not in StopReason"]  # the check can fail


def test_converse_stream_events_match_the_service_model() -> None:
    reply = Reply(text="hello there", reasoning="thinking", tool_calls=(ToolCall("shell", {"cmd": "ls"}),), cache_write_tokens=4)
    frames = FrameParser().feed(b"".join(converse_frames(reply, "tool_use", 3)))
    members = service_shapes()["ConverseStreamOutput"]["members"]
    for frame in frames:
        name = frame.headers[":event-type"]
        payload = json.loads(frame.payload)
        assert set(payload.pop("p")) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")  # AWS's padding
        assert conforms(payload, members[name]["shape"], name) == []
    every = {"messageStart", "contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata"}
    assert {frame.headers[":event-type"] for frame in frames} == every
