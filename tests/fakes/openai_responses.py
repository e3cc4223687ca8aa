"""OpenAI Responses (``POST /v1/responses``): the bearer credential, the response
object (reasoning, message, function and custom tool call items), the typed event
stream with sequence numbers and the error envelope and events."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tests.fakes.behaviours import Fail, Received, Reply, StreamError
from tests.fakes.openai_chat import error
from tests.fakes.wire import json_response, paced, reply_for, split, sse

if TYPE_CHECKING:
    from tests.fakes.server import FakeProvider

PATH = "/v1/responses"
ENCRYPTED = "gAAAAABfake-encrypted-reasoning=="  # what the provider hands back for replay, opaque to everyone else


async def received(fake: FakeProvider, request: Request) -> tuple[dict[str, Any], Response | None]:
    """The request recorded, its bearer credential checked and its body parsed, as OpenAI
    checks them before anything else: (payload, None), or ({}, the error answer)."""
    body = await request.body()
    fake.received.append(Received(request.url.path, dict(request.headers), body))
    if request.headers.get("authorization", "").removeprefix("Bearer ") not in fake.accepted_keys:
        return {}, error(401, "Incorrect API key provided.", "invalid_api_key")
    try:
        return json.loads(body), None
    except ValueError:
        return {}, error(400, "We could not parse the JSON body of your request.")


async def handle(fake: FakeProvider, request: Request) -> Response:
    payload, refused = await received(fake, request)
    if refused is not None:
        return refused
    if "model" not in payload or "input" not in payload:
        return error(400, "Missing required parameter: 'model' or 'input'.")
    behaviour = fake.next_behaviour(payload["model"])
    if isinstance(behaviour, Fail):
        return error(behaviour.status, "fake failure", retry_after=behaviour.retry_after)
    reply = _echoed(await reply_for(behaviour), payload)
    response_id = f"resp_{uuid.uuid4().hex[:24]}"
    items = output_items(reply, payload)
    if not payload.get("stream"):
        return json_response(response(response_id, payload, items, reply, "completed"), {"x-request-id": uuid.uuid4().hex})
    stream = events(response_id, payload, items, reply)
    after = behaviour.after if isinstance(behaviour, StreamError) else 0
    return StreamingResponse(paced(stream, reply.event_delay, behaviour, lambda kind: error_event(kind, after)), media_type="text/event-stream")


INPUT_TOKENS_PATH = "/v1/responses/input_tokens"


async def input_tokens(fake: FakeProvider, request: Request) -> Response:
    """OpenAI's count of a Responses request's input; scripted failures apply by model."""
    payload, refused = await received(fake, request)
    if refused is not None:
        return refused
    if "model" not in payload:
        return error(400, "Missing required parameter: 'model'.")
    behaviour = fake.next_behaviour(payload["model"])
    if isinstance(behaviour, Fail):
        return error(behaviour.status, "fake failure", retry_after=behaviour.retry_after)
    characters = len(json.dumps([payload.get(name) for name in ("instructions", "input", "tools")], ensure_ascii=False))
    return json_response({"object": "response.input_tokens", "input_tokens": characters // 4 + 1}, {"x-request-id": uuid.uuid4().hex})


# Routes beyond ``PATH``, each answered by its own handler.
MORE_ROUTES = {INPUT_TOKENS_PATH: input_tokens}


def usage(reply: Reply) -> dict[str, Any]:
    prompt = reply.input_tokens + reply.cache_read_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": reply.cache_read_tokens},
        "output_tokens": reply.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + reply.output_tokens,
    }


def output_items(reply: Reply, payload: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        reasoning: dict[str, Any] = {"id": f"rs_{uuid.uuid4().hex[:20]}", "type": "reasoning", "summary": [{"type": "summary_text", "text": reply.reasoning}]}
        if "reasoning.encrypted_content" in (payload.get("include") or ()):
            reasoning["encrypted_content"] = ENCRYPTED
        items.append(reasoning)
    if reply.text:
        part = {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
        items.append({"id": f"msg_{uuid.uuid4().hex[:20]}", "type": "message", "status": "completed", "role": "assistant", "content": [part]})
    for call in reply.tool_calls:
        common = {"status": "completed", "call_id": call.id, "name": call.name}
        if call.raw is not None:
            items.append({"id": f"ctc_{uuid.uuid4().hex[:20]}", "type": "custom_tool_call", **common, "input": call.raw})
        else:
            items.append({"id": f"fc_{uuid.uuid4().hex[:20]}", "type": "function_call", **common, "arguments": json.dumps(call.input)})
    return items


def response(response_id: str, payload: dict[str, Any], output: list[dict[str, Any]], reply: Reply, status: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": payload.get("instructions"),
        "max_output_tokens": payload.get("max_output_tokens"),
        "model": payload["model"],
        "output": output,
        "parallel_tool_calls": payload.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": payload.get("reasoning") or {"effort": None, "summary": None},
        "store": payload.get("store", True),
        "temperature": 1.0,
        "text": payload.get("text") or {"format": {"type": "text"}},
        "tool_choice": payload.get("tool_choice", "auto"),
        "tools": payload.get("tools") or [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage(reply) if reply.reports_usage and status != "in_progress" else None,
        "user": None,
        "metadata": payload.get("metadata") or {},
    }


def events(response_id: str, payload: dict[str, Any], items: list[dict[str, Any]], reply: Reply) -> list[bytes]:
    documents: list[dict[str, Any]] = []
    opening = response(response_id, payload, [], reply, "in_progress")
    documents += [{"type": "response.created", "response": opening}, {"type": "response.in_progress", "response": opening}]
    for index, item in enumerate(items):
        documents += _item_events(index, item, reply.pieces)
    documents.append({"type": "response.completed", "response": response(response_id, payload, items, reply, "completed")})
    return [sse({**document, "sequence_number": n}, document["type"]) for n, document in enumerate(documents)]


def _item_events(index: int, item: dict[str, Any], pieces: int) -> list[dict[str, Any]]:
    at = {"item_id": item["id"], "output_index": index}
    kind = item["type"]
    if kind == "message":
        part = item["content"][0]
        opened = {**item, "status": "in_progress", "content": []}
        return [
            {"type": "response.output_item.added", "output_index": index, "item": opened},
            {"type": "response.content_part.added", **at, "content_index": 0, "part": {**part, "text": ""}},
            *({"type": "response.output_text.delta", **at, "content_index": 0, "delta": piece, "logprobs": []} for piece in split(part["text"], pieces)),
            {"type": "response.output_text.done", **at, "content_index": 0, "text": part["text"], "logprobs": []},
            {"type": "response.content_part.done", **at, "content_index": 0, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    if kind == "reasoning":
        summary = item["summary"][0]
        return [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "summary": []}},
            {"type": "response.reasoning_summary_part.added", **at, "summary_index": 0, "part": {**summary, "text": ""}},
            *({"type": "response.reasoning_summary_text.delta", **at, "summary_index": 0, "delta": piece} for piece in split(summary["text"], pieces)),
            {"type": "response.reasoning_summary_text.done", **at, "summary_index": 0, "text": summary["text"]},
            {"type": "response.reasoning_summary_part.done", **at, "summary_index": 0, "part": summary},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    field, name = ("arguments", "function_call_arguments") if kind == "function_call" else ("input", "custom_tool_call_input")
    return [
        {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", field: ""}},
        *({"type": f"response.{name}.delta", **at, "delta": piece} for piece in split(item[field], pieces)),
        {"type": f"response.{name}.done", **at, field: item[field], **({"name": item["name"]} if kind == "function_call" else {})},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def error_event(error_type: str, sequence_number: int) -> bytes:
    document = {"type": "error", "code": "server_error", "message": "The server had an error while processing your request.", "param": None}
    return sse({**document, "sequence_number": sequence_number}, "error")


def _echoed(reply: Reply, payload: dict[str, Any]) -> Reply:
    """The last user message's text, as the provider received it."""
    if not reply.echo:
        return reply
    items = payload.get("input")
    if isinstance(items, str):
        return dataclasses.replace(reply, text=items)
    said = ""
    for item in items or ():
        if isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message":
            content = item.get("content")
            parts = content if isinstance(content, list) else [{"type": "input_text", "text": content}]
            said = " ".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return dataclasses.replace(reply, text=said)
