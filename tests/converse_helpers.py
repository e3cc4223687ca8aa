"""Bedrock Converse as botocore knows it: the service model, its serializer (the bodies
boto3 sends), its parsers (how boto3 reads answers, errors and event streams) and its
parameter validator (shapes checked member by member), for the unit tests to hold the
gateway's documents and frames against."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import botocore.parsers
import botocore.serialize
import botocore.session
import botocore.validate
from botocore.model import OperationModel, ServiceModel, Shape

from portcullis.adapters.protocols.eventstream import CONVERSE_FRAMING, event_frame
from portcullis.adapters.protocols.sse import SSEEvent

MODEL: ServiceModel = botocore.session.get_session().get_service_model("bedrock-runtime")
CONVERSE: OperationModel = MODEL.operation_model("Converse")
CONVERSE_STREAM: OperationModel = MODEL.operation_model("ConverseStream")


def boto3_body(params: dict[str, Any], stream: bool = False) -> tuple[bytes, str]:
    """The body and path boto3 sends for ``params`` (``modelId`` included)."""
    request = botocore.serialize.create_serializer("rest-json").serialize_to_request(params, CONVERSE_STREAM if stream else CONVERSE)
    return request["body"], request["url_path"]


def shape_errors(document: Any, shape: str | Shape) -> str:
    """What botocore's validator finds wrong with ``document`` as ``shape`` ('' when
    nothing). Blobs are base64 text on the JSON wire, bytes to the validator."""
    report = botocore.validate.ParamValidator().validate(_blobs_as_bytes(document), MODEL.shape_for(shape) if isinstance(shape, str) else shape)
    return report.generate_report() if report.has_errors() else ""


def _blobs_as_bytes(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (v.encode() if k in ("bytes", "redactedContent") and isinstance(v, str) else _blobs_as_bytes(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_blobs_as_bytes(v) for v in value]
    return value


class _Raw:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self) -> Iterator[bytes]:
        yield self._data


def boto3_stream(data: bytes) -> list[dict[str, Any]]:
    """The events boto3 yields for a ConverseStream response body (an exception frame
    raises botocore's ``EventStreamError``)."""
    parser = botocore.parsers.create_parser("rest-json")
    parsed = parser.parse(
        {"status_code": 200, "headers": {}, "body": _Raw(data), "context": {"operation_name": "ConverseStream"}}, CONVERSE_STREAM.output_shape
    )
    return list(parsed["stream"])


def boto3_error(body: bytes, headers: dict[str, str], status: int = 400) -> dict[str, Any]:
    """The error boto3 raises for a refusal: its ``response["Error"]`` and metadata."""
    received = {name.lower(): value for name, value in headers.items()}  # as urllib3 hands botocore them: case-insensitive
    parsed = botocore.parsers.create_parser("rest-json").parse({"status_code": status, "headers": received, "body": body}, CONVERSE.output_shape)
    return {"Error": parsed["Error"], "RequestId": parsed["ResponseMetadata"].get("RequestId")}


def frames(*events: tuple[str, dict[str, Any]]) -> bytes:
    """A provider's ConverseStream body: one event frame per (type, payload)."""
    return b"".join(event_frame(name, payload) for name, payload in events)


def parsed(*events: tuple[str, dict[str, Any]]) -> list[SSEEvent]:
    """Those frames as the gateway reads them."""
    parser = CONVERSE_FRAMING.Parser()
    return parser.feed(frames(*events)) + parser.close()


def on_the_wire(events: list[SSEEvent]) -> bytes:
    return b"".join(CONVERSE_FRAMING.frame(event) for event in events)


def payloads(events: list[SSEEvent]) -> list[tuple[str | None, Any]]:
    """Each event's type and payload, from its document."""
    return [(event.event, json.loads(event.data)[event.event]) for event in events]
