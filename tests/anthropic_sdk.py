"""The ``anthropic`` SDK's own clients reading a gateway's answer or stream, served from
memory through an httpx2 mock transport: ``Anthropic`` for Messages (server-sent
events) and ``AnthropicBedrock`` for InvokeModel (the AWS event stream). The
translator suites read what they convert through these, so a test fails wherever the
SDK (and the agents built on it) would."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from portcullis.adapters.protocols.sse import SSEParser

_EVENT = TypeAdapter(RawMessageStreamEvent)
_ASK: dict[str, Any] = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}


def _transport(body: bytes, content_type: str) -> httpx2.Client:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": content_type})

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def _client(body: bytes, content_type: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="k", base_url="http://fake", http_client=_transport(body, content_type), max_retries=0)


def sdk_message(document: dict[str, Any]) -> Message:
    """An answer as ``client.messages.create`` returns it, validated strictly."""
    Message.model_validate(document)
    return _client(json.dumps(document).encode(), "application/json").messages.create(**_ASK)


def sdk_stream(raw: bytes) -> tuple[list[str], Message]:
    """A Messages stream, each event valid as the SDK declares it and named by its type
    (the types, in order), then accumulated by ``client.messages.stream``."""
    kinds = []
    for event in SSEParser().feed(raw):
        data = json.loads(event.data)
        assert event.event == data["type"]
        _EVENT.validate_python(data)
        kinds.append(data["type"])
    _, message = sdk_stream_events(raw)
    return kinds, message


def sdk_stream_events(raw: bytes) -> tuple[list[Any], Message]:
    """A Messages stream read by ``Anthropic().messages.stream``: the SDK's events and final message."""
    with _client(raw, "text/event-stream").messages.stream(**_ASK) as stream:
        return list(stream), stream.get_final_message()


def bedrock_sdk_stream(raw: bytes) -> tuple[list[Any], Message]:
    """An InvokeModel stream read by ``AnthropicBedrock().messages.stream``: its events and final message."""
    client = anthropic.AnthropicBedrock(
        aws_access_key="AKIDEXAMPLE",
        aws_secret_key="secret",
        aws_region="us-east-1",
        base_url="http://fake",
        http_client=_transport(raw, "application/vnd.amazon.eventstream"),
        max_retries=0,
    )
    with client.messages.stream(**{**_ASK, "model": "anthropic.claude-sonnet-4-5-v1:0"}) as stream:
        return list(stream), stream.get_final_message()
