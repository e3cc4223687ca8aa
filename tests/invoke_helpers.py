"""What the InvokeModel suites share: Bedrock's stream frames as Bedrock writes them, and
the real clients reading what the gateway answers — botocore's parsers as boto3's
``invoke_model`` / ``invoke_model_with_response_stream`` read errors and streams,
``anthropic.AnthropicBedrock`` and ``anthropic.Anthropic`` over an httpx2 mock transport —
so a test fails wherever those clients would."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import botocore.session
import httpx2
from botocore.eventstream import EventStream
from botocore.parsers import EventStreamJSONParser, RestJSONParser
from urllib3 import HTTPHeaderDict

from portcullis.adapters.protocols.eventstream import event_frame

ANTHROPIC_EVENTS: list[dict[str, Any]] = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_bdrk_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 4},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 7}},
    {"type": "message_stop"},
]

_MODEL = botocore.session.get_session().get_service_model("bedrock-runtime")
_STREAM_OPERATION = _MODEL.operation_model("InvokeModelWithResponseStream")


def chunk_frames(events: list[dict[str, Any]]) -> list[bytes]:
    """Each event in a ``chunk`` frame, as Bedrock's InvokeModelWithResponseStream sends it."""
    return [event_frame("chunk", {"bytes": base64.b64encode(json.dumps(event).encode()).decode()}) for event in events]


class _Body:
    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def stream(self) -> Iterator[bytes]:
        yield self._raw

    def close(self) -> None:
        pass


def boto3_stream(raw: bytes) -> list[dict[str, Any]]:
    """An InvokeModelWithResponseStream body as boto3 iterates it: ``{"chunk": {"bytes": ...}}``
    per event (botocore checks every CRC); an exception frame raises botocore's EventStreamError."""
    shape = _STREAM_OPERATION.output_shape.members["body"]
    return list(EventStream(_Body(raw), shape, EventStreamJSONParser(), _STREAM_OPERATION.name))


def boto3_events(raw: bytes) -> list[dict[str, Any]]:
    """The Messages events inside the chunks boto3 yields."""
    return [json.loads(part["chunk"]["bytes"]) for part in boto3_stream(raw)]


def boto3_error(status: int, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """An error response as boto3 raises it (``ClientError.response``)."""
    response = {"status_code": status, "headers": HTTPHeaderDict(headers), "body": body}  # case-insensitive, as urllib3 gives botocore
    return RestJSONParser().parse(response, _MODEL.operation_model("InvokeModel").output_shape)


def _transport(body: bytes, content_type: str) -> httpx2.Client:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": content_type})

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def bedrock_sdk_stream(raw: bytes) -> tuple[list[Any], Any]:
    """An Invoke stream read by ``AnthropicBedrock().messages.stream``: its events and final message."""
    client = anthropic.AnthropicBedrock(
        aws_access_key="AKIDEXAMPLE",
        aws_secret_key="secret",
        aws_region="us-east-1",
        base_url="http://fake",
        http_client=_transport(raw, "application/vnd.amazon.eventstream"),
        max_retries=0,
    )
    with client.messages.stream(model="anthropic.claude-sonnet-4-5-v1:0", max_tokens=10, messages=[{"role": "user", "content": "hi"}]) as stream:
        events = list(stream)
        return events, stream.get_final_message()


def anthropic_sdk_stream(raw: bytes) -> tuple[list[Any], Any]:
    """A server-sent Messages stream read by ``Anthropic().messages.stream``: its events and final message."""
    client = anthropic.Anthropic(api_key="k", base_url="http://fake", http_client=_transport(raw, "text/event-stream"), max_retries=0)
    with client.messages.stream(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]) as stream:
        events = list(stream)
        return events, stream.get_final_message()
