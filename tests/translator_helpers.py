"""What the translator suites share: the ``openai`` SDK's own Responses client reading a
translated answer or stream, served from memory through an httpx mock transport, so a
test fails wherever the SDK (and Codex, which parses the same events) would."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from portcullis.adapters.protocols.interfaces import StreamConverter
from portcullis.adapters.protocols.sse import SSEParser

_EVENT = TypeAdapter(ResponseStreamEvent)


def _client(body: bytes, content_type: str) -> openai.OpenAI:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return openai.OpenAI(api_key="k", base_url="http://fake/v1", http_client=httpx.Client(transport=httpx.MockTransport(handler)), max_retries=0)


def sdk_response(document: dict[str, Any]) -> Response:
    """A translated answer as ``client.responses.create`` returns it, validated strictly."""
    Response.model_validate(document)
    return _client(json.dumps(document).encode(), "application/json").responses.create(model="m", input="hi")


def translated_stream(converter: StreamConverter, upstream: list[bytes]) -> bytes:
    out = b"".join(b"".join(converter.feed(event)) for event in SSEParser().feed(b"".join(upstream)))
    return out + b"".join(converter.finish())


def sdk_stream(raw: bytes) -> tuple[list[Any], Response | None]:
    """A translated stream read by ``client.responses.stream``: every event valid as the
    SDK declares it, named by its type, numbered in order; then the SDK's final
    response (``None`` when the stream ends incomplete, as the SDK has none then)."""
    for number, event in enumerate(SSEParser().feed(raw)):
        data = json.loads(event.data)
        assert event.event == data["type"] and data["sequence_number"] == number
        _EVENT.validate_python(data)
    with _client(raw, "text/event-stream").responses.stream(model="m", input="hi") as stream:
        events = list(stream)
        return events, stream.get_final_response() if events[-1].type == "response.completed" else None


def of_type(events: list[Any], kind: str, member: str | Callable[[Any], Any]) -> list[Any]:
    pick = member if callable(member) else (lambda event: getattr(event, member))
    return [pick(event) for event in events if event.type == kind]
