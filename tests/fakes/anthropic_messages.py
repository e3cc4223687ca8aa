"""Anthropic Messages (``POST /v1/messages``): the credential and header checks, the
message body, the SSE events and the error envelope."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tests.fakes.behaviours import Fail, Received, Redirect, Reply
from tests.fakes.wire import echoed, json_response, paced, reply_for, split, sse

if TYPE_CHECKING:
    from tests.fakes.server import FakeProvider

PATH = "/v1/messages"

_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}


async def handle(fake: FakeProvider, request: Request) -> Response:
    body = await request.body()
    fake.received.append(Received(request.url.path + (f"?{request.url.query}" if request.url.query else ""), dict(request.headers), body))
    if request.headers.get("x-api-key") not in fake.accepted_keys:
        return error(401, "invalid x-api-key")
    if "anthropic-version" not in request.headers:
        return error(400, "anthropic-version: header is required")
    try:
        payload = json.loads(body)
    except ValueError:
        return error(400, "There was an issue with the format of your request: invalid JSON")
    for name in ("model", "max_tokens", "messages"):
        if name not in payload:
            return error(400, f"{name}: Field required")
    behaviour = fake.next_behaviour(payload["model"])
    if isinstance(behaviour, Redirect):
        return Response(status_code=307, headers={"location": behaviour.location})
    if isinstance(behaviour, Fail):
        return error(behaviour.status, "Overloaded" if behaviour.status == 529 else "fake failure", behaviour.retry_after)
    reply = echoed(await reply_for(behaviour), payload)
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    if not payload.get("stream"):
        return json_response(message(message_id, payload["model"], reply), {"request-id": f"req_{uuid.uuid4().hex[:20]}"})
    stream = events(message_id, payload["model"], reply)
    return StreamingResponse(paced(stream, reply.event_delay, behaviour, error_event), media_type="text/event-stream")


def usage(reply: Reply, output: int) -> dict[str, int]:
    return {
        "input_tokens": reply.input_tokens,
        "output_tokens": output,
        "cache_creation_input_tokens": reply.cache_write_tokens,
        "cache_read_input_tokens": reply.cache_read_tokens,
    }


def message(message_id: str, model: str, reply: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    content += [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input} for call in reply.tool_calls]
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": usage(reply, reply.output_tokens),
    }


def events(message_id: str, model: str, reply: Reply) -> list[bytes]:
    start = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage(reply, 1),
    }
    out = [sse({"type": "message_start", "message": start}, "message_start"), sse({"type": "ping"}, "ping")]
    index = 0
    if reply.text:
        out.append(sse({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}, "content_block_start"))
        for piece in split(reply.text, reply.pieces):
            out.append(sse({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}, "content_block_delta"))
        out.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    for call in reply.tool_calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        out.append(sse({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start"))
        for piece in split(json.dumps(call.input), reply.pieces):
            delta = {"type": "input_json_delta", "partial_json": piece}
            out.append(sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"))
        out.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    delta = {"stop_reason": "tool_use" if reply.tool_calls else "end_turn", "stop_sequence": None}
    out.append(sse({"type": "message_delta", "delta": delta, "usage": {"output_tokens": reply.output_tokens}}, "message_delta"))
    out.append(sse({"type": "message_stop"}, "message_stop"))
    return out


def error(status: int, message: str, retry_after: int | None = None) -> Response:
    headers = {"request-id": f"req_{uuid.uuid4().hex[:20]}"}
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    body = {"type": "error", "error": {"type": _ERRORS.get(status, "api_error"), "message": message}}
    return Response(json.dumps(body), status, headers=headers, media_type="application/json")


def error_event(error_type: str) -> bytes:
    return sse({"type": "error", "error": {"type": error_type, "message": "Overloaded"}}, "error")
