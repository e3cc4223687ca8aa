"""The mock provider's OpenAI Responses answers: a text message, or a `function_call` item."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.sse import encode
from portcullis.adapters.providers.mock.answer import MockResponse, json_response, stream_response
from portcullis.adapters.providers.mock.shell_call import ShellCall


def answer(request: Mapping[str, Any], words: list[str], input_tokens: int, call: ShellCall | None) -> MockResponse:
    output_tokens = len(words) if call is None else len(call.pieces())
    usage = {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }
    item = _message(words) if call is None else _function_call(call)
    response = {
        "id": f"resp_mock{uuid.uuid4().hex[:20]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": request.get("model"),
        "output": [item],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }
    if not request.get("stream"):
        return json_response(response)
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    documents = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
        *(_text_events(item, words) if call is None else _call_events(item, call)),
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return stream_response([encode({**d, "sequence_number": n}, d["type"]) for n, d in enumerate(documents)])


def _message(words: list[str]) -> dict[str, Any]:
    part = {"type": "output_text", "text": "".join(words), "annotations": []}
    return {"id": f"msg_mock{uuid.uuid4().hex[:20]}", "type": "message", "status": "completed", "role": "assistant", "content": [part]}


def _function_call(call: ShellCall) -> dict[str, Any]:
    return {
        "id": f"fc_mock{uuid.uuid4().hex[:20]}",
        "type": "function_call",
        "status": "completed",
        "call_id": f"call_mock{uuid.uuid4().hex[:20]}",
        "name": call.name,
        "arguments": call.arguments,
    }


def _text_events(item: dict[str, Any], words: list[str]) -> list[dict[str, Any]]:
    part = item["content"][0]
    at = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    return [
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
        *({"type": "response.output_text.delta", **at, "delta": w, "logprobs": []} for w in words),
        {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
    ]


def _call_events(item: dict[str, Any], call: ShellCall) -> list[dict[str, Any]]:
    at = {"item_id": item["id"], "output_index": 0}
    return [
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress", "arguments": ""}},
        *({"type": "response.function_call_arguments.delta", **at, "delta": piece} for piece in call.pieces()),
        {"type": "response.function_call_arguments.done", **at, "name": call.name, "arguments": call.arguments},
    ]
