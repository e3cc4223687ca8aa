"""What the Converse translator suites share: botocore's own Bedrock Runtime model
judging the Converse side (request bodies as boto3 serializes and validates them,
answers and event streams as boto3's ``converse`` and ``converse_stream`` parse them),
and the ``anthropic`` SDK reading the Messages side, served from memory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import botocore.session
import httpx2
from anthropic.types import Message, RawMessageStreamEvent
from botocore.eventstream import EventStream, EventStreamBuffer
from botocore.parsers import EventStreamJSONParser, create_parser
from botocore.serialize import create_serializer
from botocore.validate import ParamValidator
from pydantic import TypeAdapter

from portcullis.adapters.protocols.eventstream import CONVERSE_FRAMING
from portcullis.adapters.protocols.interfaces import StreamConverter
from portcullis.adapters.protocols.sse import SSEEvent, SSEParser

MODEL = botocore.session.get_session().get_service_model("bedrock-runtime")
MODEL_ID = "anthropic.claude-sonnet-4-5-20250929-v1:0"
_EVENT = TypeAdapter(RawMessageStreamEvent)


# --- the Converse side ----------------------------------------------------------------


def assert_valid_converse_request(body: dict[str, Any], operation: str = "Converse") -> None:
    """A converted body as boto3 would accept it for ``operation`` (the model ID comes
    from the path), by botocore's own validator against the service model."""
    report = ParamValidator().validate({**body, "modelId": MODEL_ID}, MODEL.operation_model(operation).input_shape)
    assert not report.has_errors(), report.generate_report()


def boto3_body(operation: str, params: dict[str, Any]) -> dict[str, Any]:
    """The JSON body boto3 sends for ``operation`` (validated first, as boto3 does): blobs
    base64, the model ID in the path and not the body."""
    operation_model = MODEL.operation_model(operation)
    full = {"modelId": MODEL_ID, **params}
    report = ParamValidator().validate(full, operation_model.input_shape)
    assert not report.has_errors(), report.generate_report()
    request = create_serializer("rest-json").serialize_to_request(full, operation_model)
    assert "modelId" not in json.loads(request["body"])
    return json.loads(request["body"])


def boto3_converse(document: dict[str, Any]) -> dict[str, Any]:
    """A converted answer as ``client.converse`` returns it."""
    response = {"status_code": 200, "headers": {}, "body": json.dumps(document).encode()}
    parsed = create_parser("rest-json").parse(response, MODEL.operation_model("Converse").output_shape)
    parsed.pop("ResponseMetadata", None)
    return parsed


class _Body:
    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def stream(self) -> Iterator[bytes]:
        yield self._raw

    def close(self) -> None:
        return None


def boto3_converse_stream(raw: bytes) -> list[dict[str, Any]]:
    """A converted event stream as ``client.converse_stream()["stream"]`` yields it; each
    frame decoded by botocore's codec (CRCs checked) and carrying the headers boto3 reads."""
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    for message in buffer:
        assert message.headers[":message-type"] == "event" and message.headers[":content-type"] == "application/json"
    shape = MODEL.operation_model("ConverseStream").output_shape.members["stream"]
    return list(EventStream(_Body(raw), shape, EventStreamJSONParser(), "ConverseStream"))


def converse_events(frames: list[bytes]) -> list[SSEEvent]:
    """Converse frames as the gateway's Converse framing delivers them to a converter."""
    parser = CONVERSE_FRAMING.Parser()
    return [*parser.feed(b"".join(frames)), *parser.close()]


def converted(converter: StreamConverter, events: list[SSEEvent]) -> bytes:
    return b"".join(b"".join(converter.feed(event)) for event in events) + b"".join(converter.finish())


# --- the Messages side ----------------------------------------------------------------


def _client(body: bytes, content_type: str) -> anthropic.Anthropic:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": content_type})

    return anthropic.Anthropic(api_key="k", base_url="http://fake", http_client=httpx2.Client(transport=httpx2.MockTransport(handler)), max_retries=0)


def sdk_message(document: dict[str, Any]) -> Message:
    """A converted answer as ``client.messages.create`` returns it, validated strictly."""
    Message.model_validate(document)
    return _client(json.dumps(document).encode(), "application/json").messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "hi"}])


def sdk_stream(raw: bytes) -> tuple[list[str], Message]:
    """A converted stream, each event valid as the SDK declares it and named by its type,
    then accumulated by ``client.messages.stream``."""
    kinds = []
    for event in SSEParser().feed(raw):
        data = json.loads(event.data)
        assert event.event == data["type"]
        _EVENT.validate_python(data)
        kinds.append(data["type"])
    with _client(raw, "text/event-stream").messages.stream(model="m", max_tokens=1, messages=[{"role": "user", "content": "hi"}]) as stream:
        return kinds, stream.get_final_message()
