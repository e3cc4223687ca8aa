"""The mock provider's OpenAI Chat Completions answers: text, or `tool_calls`."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.openai_chat import wire as chat_wire
from portcullis.adapters.protocols.sse import encode
from portcullis.adapters.providers.mock.answer import MockResponse, json_response, stream_response
from portcullis.adapters.providers.mock.shell_call import ShellCall


def answer(request: Mapping[str, Any], words: list[str], input_tokens: int, call: ShellCall | None) -> MockResponse:
    envelope = {"id": f"chatcmpl-mock{uuid.uuid4().hex[:20]}", "created": int(time.time()), "model": request.get("model")}
    output_tokens = len(words) if call is None else len(call.pieces())
    usage = {"prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}
    finish_reason = "stop" if call is None else "tool_calls"
    call_id = f"call_mock{uuid.uuid4().hex[:20]}"
    if not request.get("stream"):
        message: dict[str, Any] = {"role": "assistant", "content": "".join(words), "refusal": None}
        if call is not None:
            function = {"name": call.name, "arguments": call.arguments}
            message = {**message, "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": function}]}
        choice = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        return json_response({**envelope, "object": "chat.completion", "choices": [choice], "usage": usage})
    chunk = {**envelope, "object": "chat.completion.chunk"}
    if call is None:
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}, *({"content": w} for w in words)]
    else:
        opening = {"index": 0, "id": call_id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        deltas = [{"role": "assistant", "content": None, "tool_calls": [opening]}]
        deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} for piece in call.pieces()]
    events = [encode({**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}) for delta in deltas]
    events.append(encode({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]}))
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append(encode({**chunk, "choices": [], "usage": usage}))
    events.append(chat_wire.DONE)
    return stream_response(events)
