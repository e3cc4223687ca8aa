"""Bedrock Runtime as botocore knows it, for the unit and translator suites to hold the
gateway's documents and frames against: the service model, its validator (shapes
checked member by member), its serializer (the bodies boto3 sends) and its parsers (how
boto3's ``converse``, ``converse_stream``, ``invoke_model`` and
``invoke_model_with_response_stream`` read answers, errors and event streams). One
module, so every suite judges by the same botocore calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import botocore.session
from botocore.eventstream import EventStream, EventStreamBuffer
from botocore.model import OperationModel, ServiceModel, Shape
from botocore.parsers import EventStreamJSONParser, RestJSONParser
from botocore.serialize import create_serializer
from botocore.validate import ParamValidator
from urllib3 import HTTPHeaderDict

MODEL: ServiceModel = botocore.session.get_session().get_service_model("bedrock-runtime")
CONVERSE: OperationModel = MODEL.operation_model("Converse")
CONVERSE_STREAM: OperationModel = MODEL.operation_model("ConverseStream")
INVOKE: OperationModel = MODEL.operation_model("InvokeModel")
INVOKE_STREAM: OperationModel = MODEL.operation_model("InvokeModelWithResponseStream")
MODEL_ID = "anthropic.claude-sonnet-4-5-20250929-v1:0"


def shape_errors(document: Any, shape: str | Shape) -> str:
    """What botocore's validator finds wrong with ``document`` as ``shape`` ('' when
    nothing). Blobs are base64 text on the JSON wire, bytes to the validator."""
    report = ParamValidator().validate(_blobs_as_bytes(document), MODEL.shape_for(shape) if isinstance(shape, str) else shape)
    return report.generate_report() if report.has_errors() else ""


def _blobs_as_bytes(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (v.encode() if k in ("bytes", "redactedContent") and isinstance(v, str) else _blobs_as_bytes(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_blobs_as_bytes(v) for v in value]
    return value


def assert_valid_converse_request(body: dict[str, Any], stream: bool = False) -> None:
    """A converted body as boto3 would accept it for Converse (or ConverseStream), the
    model ID coming from the path."""
    operation = CONVERSE_STREAM if stream else CONVERSE
    errors = shape_errors({**body, "modelId": MODEL_ID}, operation.input_shape)
    assert not errors, errors


def boto3_body(params: dict[str, Any], stream: bool = False) -> tuple[bytes, str]:
    """The body and path boto3 sends for Converse (or ConverseStream) ``params``
    (``modelId`` included), validated first as boto3 does; the model ID goes in the
    path, never the body."""
    operation = CONVERSE_STREAM if stream else CONVERSE
    report = ParamValidator().validate(params, operation.input_shape)
    assert not report.has_errors(), report.generate_report()
    request = create_serializer("rest-json").serialize_to_request(params, operation)
    assert "modelId" not in json.loads(request["body"] or b"{}")
    return request["body"], request["url_path"]


def boto3_converse(document: dict[str, Any]) -> dict[str, Any]:
    """An answer as ``client.converse`` returns it (without its response metadata)."""
    response = {"status_code": 200, "headers": {}, "body": json.dumps(document).encode()}
    parsed = RestJSONParser().parse(response, CONVERSE.output_shape)
    parsed.pop("ResponseMetadata", None)
    return parsed


def boto3_error(body: bytes, headers: dict[str, str], status: int = 400) -> dict[str, Any]:
    """A refusal as boto3 raises it (``ClientError.response``: ``Error`` and
    ``ResponseMetadata``). Any operation's: botocore reads errors alike for all."""
    response = {"status_code": status, "headers": HTTPHeaderDict(headers), "body": body}  # case-insensitive, as urllib3 gives botocore
    return RestJSONParser().parse(response, CONVERSE.output_shape)


class _Body:
    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def stream(self) -> Iterator[bytes]:
        yield self._raw

    def close(self) -> None:
        return None


def _event_stream(raw: bytes, operation: OperationModel, member: str) -> list[dict[str, Any]]:
    """Each frame decoded by botocore's codec (CRCs checked), with the headers boto3
    reads; an exception frame raises botocore's ``EventStreamError``."""
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    for message in buffer:
        assert message.headers[":message-type"] in ("event", "exception") and message.headers[":content-type"] == "application/json"
    shape = operation.output_shape.members[member]
    return list(EventStream(_Body(raw), shape, EventStreamJSONParser(), operation.name))


def boto3_converse_stream(raw: bytes) -> list[dict[str, Any]]:
    """A ConverseStream body as ``client.converse_stream()["stream"]`` yields it."""
    return _event_stream(raw, CONVERSE_STREAM, "stream")


def boto3_invoke_stream(raw: bytes) -> list[dict[str, Any]]:
    """An InvokeModelWithResponseStream body as boto3 iterates it: ``{"chunk": {"bytes": ...}}``
    per event."""
    return _event_stream(raw, INVOKE_STREAM, "body")


def boto3_invoke_events(raw: bytes) -> list[dict[str, Any]]:
    """The Messages events inside the chunks boto3 yields."""
    return [json.loads(part["chunk"]["bytes"]) for part in boto3_invoke_stream(raw)]
