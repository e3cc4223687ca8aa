"""Anthropic Messages (``POST /v1/messages``): the credential and header checks, the
message body, the SSE events and the error envelope; and its token count
(``POST /v1/messages/count_tokens``), which takes a Messages body without
``max_tokens`` and answers ``{"input_tokens": N}``."""

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
COUNT_PATH = "/v1/messages/count_tokens"
# The count endpoint's fields: anything else (max_tokens, stream, temperature) is refused, as Anthropic does.
COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers", "context_management", "output_config"})

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


async def received(fake: FakeProvider, request: Request) -> tuple[Any, Response | None]:
    """The request recorded and its credential, version and JSON checked: (payload, None),
    or (None, the error the real API answers)."""
    body = await request.body()
    fake.received.append(Received(request.url.path + (f"?{request.url.query}" if request.url.query else ""), dict(request.headers), body))
    if request.headers.get("x-api-key") not in fake.accepted_keys:
        return None, error(401, "invalid x-api-key")
    if "anthropic-version" not in request.headers:
        return None, error(400, "anthropic-version: header is required")
    try:
        return json.loads(body), None
    except ValueError:
        return None, error(400, "There was an issue with the format of your request: invalid JSON")


async def handle(fake: FakeProvider, request: Request) -> Response:
    payload, refused = await received(fake, request)
    if refused is not None:
        return refused
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


async def count(fake: FakeProvider, request: Request) -> Response:
    """The token count: scripted failures apply to it as to messages (by model)."""
    payload, refused = await received(fake, request)
    if refused is not None:
        return refused
    for name in ("model", "messages"):
        if name not in payload:
            return error(400, f"{name}: Field required")
    extra = sorted(set(payload) - COUNT_FIELDS)
    if extra:
        return error(400, f"{extra[0]}: Extra inputs are not permitted")
    behaviour = fake.next_behaviour(payload["model"])
    if isinstance(behaviour, Fail):
        return error(behaviour.status, "Overloaded" if behaviour.status == 529 else "fake failure", behaviour.retry_after)
    return json_response({"input_tokens": counted(payload)}, {"request-id": f"req_{uuid.uuid4().hex[:20]}"})


def counted(payload: dict[str, Any]) -> int:
    """A deterministic stand-in for Claude's tokenizer: one token per four characters of
    every string the model reads, and three per message for its framing."""
    characters = sum(len(text) for text in _strings([payload.get(name) for name in ("system", "messages", "tools")]))
    return characters // 4 + 3 * len(payload.get("messages") or []) + 1


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


# Routes beyond ``PATH``, each answered by its own handler.
MORE_ROUTES = {COUNT_PATH: count}


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
    return [sse(document, document["type"]) for document in event_documents(message_id, model, reply)]


def event_documents(message_id: str, model: str, reply: Reply, ping: bool = True) -> list[dict[str, Any]]:
    """The stream's events as documents (Bedrock's InvokeModel stream carries the same, without pings)."""
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
    out: list[dict[str, Any]] = [{"type": "message_start", "message": start}, *([{"type": "ping"}] if ping else [])]
    index = 0
    if reply.text:
        out.append({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
        for piece in split(reply.text, reply.pieces):
            out.append({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}})
        out.append({"type": "content_block_stop", "index": index})
        index += 1
    for call in reply.tool_calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        out.append({"type": "content_block_start", "index": index, "content_block": block})
        for piece in split(json.dumps(call.input), reply.pieces):
            out.append({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})
        out.append({"type": "content_block_stop", "index": index})
        index += 1
    delta = {"stop_reason": "tool_use" if reply.tool_calls else "end_turn", "stop_sequence": None}
    out.append({"type": "message_delta", "delta": delta, "usage": {"output_tokens": reply.output_tokens}})
    out.append({"type": "message_stop"})
    return out


def error(status: int, message: str, retry_after: int | None = None) -> Response:
    headers = {"request-id": f"req_{uuid.uuid4().hex[:20]}"}
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    body = {"type": "error", "error": {"type": _ERRORS.get(status, "api_error"), "message": message}}
    return Response(json.dumps(body), status, headers=headers, media_type="application/json")


def error_event(error_type: str) -> bytes:
    return sse({"type": "error", "error": {"type": error_type, "message": "Overloaded"}}, "error")
