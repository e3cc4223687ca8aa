"""OpenAI Chat Completions (``POST /v1/chat/completions``): the bearer credential, the
completion body, the chunk stream (usage only when asked for) and the error envelope."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tests.fakes.behaviours import Fail, Received, Reply
from tests.fakes.wire import echoed, json_response, paced, reply_for, split, sse

if TYPE_CHECKING:
    from tests.fakes.server import FakeProvider

PATH = "/v1/chat/completions"


async def handle(fake: FakeProvider, request: Request) -> Response:
    body = await request.body()
    fake.received.append(Received(request.url.path, dict(request.headers), body))
    if request.headers.get("authorization", "").removeprefix("Bearer ") not in fake.accepted_keys:
        return error(401, "Incorrect API key provided.", "invalid_api_key")
    try:
        payload = json.loads(body)
    except ValueError:
        return error(400, "We could not parse the JSON body of your request.")
    if "model" not in payload or "messages" not in payload:
        return error(400, "you must provide a model and messages parameter")
    behaviour = fake.next_behaviour(payload["model"])
    if isinstance(behaviour, Fail):
        return error(behaviour.status, "fake failure", retry_after=behaviour.retry_after)
    reply = echoed(await reply_for(behaviour), payload)
    completion_id = f"chatcmpl-{fake.id_tag}{uuid.uuid4().hex[:24]}"
    if not payload.get("stream"):
        return json_response(completion(completion_id, payload["model"], reply), {"x-request-id": uuid.uuid4().hex})
    include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
    stream = events(completion_id, payload["model"], reply, include_usage)
    return StreamingResponse(paced(stream, reply.event_delay, behaviour, error_event), media_type="text/event-stream")


def usage(reply: Reply) -> dict[str, Any]:
    prompt = reply.input_tokens + reply.cache_read_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": reply.output_tokens,
        "total_tokens": prompt + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cache_read_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def completion(completion_id: str, model: str, reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.input)}} for call in reply.tool_calls
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
        **({"usage": usage(reply)} if reply.reports_usage else {}),
        "system_fingerprint": "fp_fake",
    }


def events(completion_id: str, model: str, reply: Reply, include_usage: bool) -> list[bytes]:
    envelope = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model, "system_fingerprint": "fp_fake"}
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({**envelope, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra})

    out = [chunk({"role": "assistant", "content": "", "refusal": None})]
    out += [chunk({"content": piece}) for piece in split(reply.text, reply.pieces)]
    for i, call in enumerate(reply.tool_calls):
        out.append(chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}]}))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}) for piece in split(json.dumps(call.input), reply.pieces)]
    out.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    if include_usage and reply.reports_usage:
        out.append(sse({**envelope, "choices": [], "usage": usage(reply)}))
    out.append(b"data: [DONE]\n\n")
    return out


def error(status: int, message: str, code: str | None = None, retry_after: int | None = None) -> Response:
    kinds = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error", 429: "requests"}
    headers = {"x-request-id": uuid.uuid4().hex}
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    body = {"error": {"message": message, "type": kinds.get(status, "server_error"), "param": None, "code": code}}
    return Response(json.dumps(body), status, headers=headers, media_type="application/json")


def error_event(error_type: str) -> bytes:
    # Chat Completions has one error shape for every kind, so the type is not echoed.
    return sse({"error": {"message": "The server had an error while processing your request.", "type": "server_error", "param": None, "code": None}})
