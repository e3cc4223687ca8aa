"""The built-in offline provider: answers in whichever protocol it is addressed in,
streaming included, with plausible usage. For quickstarts and demos; tests use the
faithful fake provider under tests/ instead."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from portcullis.adapters.protocols.anthropic_messages import count_tokens
from portcullis.adapters.protocols.anthropic_messages import wire as messages_wire
from portcullis.adapters.protocols.openai_chat import wire as chat_wire
from portcullis.adapters.protocols.openai_responses import wire as responses_wire
from portcullis.adapters.protocols.sse import encode


class MockResponse:
    def __init__(self, status: int, content_type: str, parts: list[bytes]) -> None:
        self.status = status
        self.headers: Mapping[str, str] = {"content-type": content_type}
        self._parts = parts

    async def read(self, limit: int) -> bytes:
        return b"".join(self._parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part

    def release(self) -> None:
        return None


class MockProvider:
    protocol = None

    def __init__(self, name: str) -> None:
        self.name = name

    async def send(self, path: str, query: str, headers: dict[str, str], body: bytes) -> MockResponse:
        request = json.loads(body)
        words = _reply(request).split(" ")
        words = [w + " " for w in words[:-1]] + words[-1:]
        input_tokens = max(1, len(body) // 4)
        if path == count_tokens.PATH:
            return MockResponse(200, "application/json", [json.dumps({"input_tokens": input_tokens}).encode()])
        if path == messages_wire.UPSTREAM_PATH:
            return _anthropic(request, words, input_tokens)
        if path == chat_wire.UPSTREAM_PATH:
            return _openai(request, words, input_tokens)
        if path == responses_wire.UPSTREAM_PATH:
            return _responses(request, words, input_tokens)
        return MockResponse(404, "application/json", [b'{"error": {"message": "unknown path"}}'])

    async def close(self) -> None:
        return None


def _reply(request: Mapping[str, Any]) -> str:
    turns = request.get("input")
    count = len(request.get("messages") or []) if turns is None else (1 if isinstance(turns, str) else len(turns))
    return f"Hello from the Portcullis mock provider. You sent {count} message{'s' if count != 1 else ''} to {request.get('model')}."


def _anthropic(request: Mapping[str, Any], words: list[str], input_tokens: int) -> MockResponse:
    message_id = f"msg_mock_{uuid.uuid4().hex[:20]}"
    usage = {"input_tokens": input_tokens, "output_tokens": len(words), "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    message = {"id": message_id, "type": "message", "role": "assistant", "model": request.get("model"), "stop_sequence": None}
    if not request.get("stream"):
        body = {**message, "content": [{"type": "text", "text": "".join(words)}], "stop_reason": "end_turn", "usage": usage}
        return MockResponse(200, "application/json", [json.dumps(body).encode()])
    events = [
        encode({"type": "message_start", "message": {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}}, "message_start"),
        encode({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, "content_block_start"),
        *(encode({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}, "content_block_delta") for w in words),
        encode({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        encode({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": len(words)}}, "message_delta"),
        encode({"type": "message_stop"}, "message_stop"),
    ]
    return MockResponse(200, "text/event-stream", events)


def _openai(request: Mapping[str, Any], words: list[str], input_tokens: int) -> MockResponse:
    envelope = {"id": f"chatcmpl-mock{uuid.uuid4().hex[:20]}", "created": int(time.time()), "model": request.get("model")}
    usage = {"prompt_tokens": input_tokens, "completion_tokens": len(words), "total_tokens": input_tokens + len(words)}
    if not request.get("stream"):
        choice = {"index": 0, "message": {"role": "assistant", "content": "".join(words), "refusal": None}, "finish_reason": "stop", "logprobs": None}
        body = {**envelope, "object": "chat.completion", "choices": [choice], "usage": usage}
        return MockResponse(200, "application/json", [json.dumps(body).encode()])
    chunk = {**envelope, "object": "chat.completion.chunk"}
    events = [encode({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})]
    events += [encode({**chunk, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}) for w in words]
    events.append(encode({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append(encode({**chunk, "choices": [], "usage": usage}))
    events.append(chat_wire.DONE)
    return MockResponse(200, "text/event-stream", events)


def _responses(request: Mapping[str, Any], words: list[str], input_tokens: int) -> MockResponse:
    text = "".join(words)
    usage = {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": len(words),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + len(words),
    }
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"id": f"msg_mock{uuid.uuid4().hex[:20]}", "type": "message", "status": "completed", "role": "assistant", "content": [part]}
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
        return MockResponse(200, "application/json", [json.dumps(response).encode()])
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    at = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    documents = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
        *({"type": "response.output_text.delta", **at, "delta": w, "logprobs": []} for w in words),
        {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return MockResponse(200, "text/event-stream", [encode({**d, "sequence_number": n}, d["type"]) for n, d in enumerate(documents)])
